// The strata binary end to end: real output on the shared model, and a one-line error with a
// non-zero exit (never a crash) for each kind of bad input.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace {

namespace fs = std::filesystem;

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

struct Result {
  int exit_code = -1;
  bool crashed = false;
  std::string out;
  std::string err;
};

Result strata(const std::string& args) {
  const fs::path err_file = fs::temp_directory_path() / ("strata_cli_err_" + std::to_string(::getpid()));
  const std::string command = std::string(STRATA_BINARY) + " " + args + " 2>" + err_file.string();
  Result r;
  FILE* pipe = ::popen(command.c_str(), "r");
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  // The shell reports a signal death as 128 + signal.
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.crashed = !WIFEXITED(status) || r.exit_code >= 128;
  std::ifstream in(err_file);
  r.err.assign(std::istreambuf_iterator<char>(in), {});
  fs::remove(err_file);
  return r;
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("strata_cli_" + std::to_string(::getpid()) + "_" + name)).string();
}

void expect_one_line_error(const Result& r, const std::string& needle) {
  EXPECT_FALSE(r.crashed) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST(Cli, RunsTheDreamsModelGreedily) {
  const Result r = strata("run -m " + kDreams + " -p 'Once upon a time' -n 64 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), 100u) << r.out;
  // Two greedy runs print the same text.
  EXPECT_EQ(strata("run -m " + kDreams + " -p 'Once upon a time' -n 64 --temp 0 -t 1").out, r.out);
}

// Speculative decoding guesses ahead and changes no byte of the text: prompt lookup, a draft
// model (here the model itself), or none, greedy and seeded.
TEST(Cli, RunPrintsTheSameTextWithAndWithoutSpeculativeDecoding) {
  const std::string prompt = " -p 'Once upon a time, there was a cat. Once upon a time, there was a dog. Once upon a time'";
  for (const std::string sampling : {" --temp 0", " --temp 0.8 --seed 3 --repeat-penalty 1.1"}) {
    const Result off = strata("run -m " + kDreams + prompt + " -n 80 --speculative off" + sampling);
    ASSERT_EQ(off.exit_code, 0) << off.err;
    EXPECT_EQ(off.err.find("drafts accepted"), std::string::npos) << off.err;
    const Result lookup = strata("run -m " + kDreams + prompt + " -n 80" + sampling);
    EXPECT_EQ(lookup.out, off.out) << sampling;
    EXPECT_NE(lookup.err.find("drafts accepted"), std::string::npos) << lookup.err;
    const Result draft = strata("run -m " + kDreams + prompt + " -n 80 --draft-model " + kDreams + " --draft-max 4" + sampling);
    EXPECT_EQ(draft.out, off.out) << sampling;
    EXPECT_NE(draft.err.find("drafts accepted"), std::string::npos) << draft.err;
  }
}

TEST(Cli, RefusesADraftModelOfAnotherVocabulary) {
  const std::string path = temp_path("draft.gguf");
  ASSERT_EQ(strata("gguf synth --shape qwen2-tiny --type Q8_0 -o " + path).exit_code, 0);
  expect_one_line_error(strata("run -m " + kDreams + " -p hi -n 4 --draft-model " + path), "another vocabulary");
  expect_one_line_error(strata("run -m " + kDreams + " -p hi -n 4 --speculative draft"), "--draft-model");
  fs::remove(path);
}

TEST(Cli, BenchComparesSpeculativeDecodingWithPlainDecoding) {
  const Result r = strata("bench -m " + kDreams + " -n 40 -r 2 -t 1 --speculative-prompt 'Once upon a time, Once upon a time'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"  run 1: plain ", "  run 2: plain ", "decode, plain: ", "decode, speculative: ",
                           "speed-up: x", "drafts: "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in\n" << r.out;
  }
}

TEST(Cli, MissingFile) { expect_one_line_error(strata("run -m /nonexistent.gguf -p hi"), "cannot open"); }

TEST(Cli, TruncatedFile) {
  const std::string path = temp_path("truncated.gguf");
  {
    std::ifstream in(kDreams, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  expect_one_line_error(strata("run -m " + path + " -p hi"), "truncated");
  fs::remove(path);
}

TEST(Cli, UnknownArchitecture) {
  const std::string path = temp_path("arch.gguf");
  strata::gguf::Writer w;
  w.set("general.architecture", strata::gguf::Value::string("mamba"));
  w.write(path);
  expect_one_line_error(strata("run -m " + path + " -p hi"), "unsupported model architecture 'mamba'");
  fs::remove(path);
}

TEST(Cli, UnsupportedTensorType) {
  // The dreams model with its first layer's query weights re-labelled as IQ3_S.
  auto source = strata::gguf::File::open(kDreams);
  strata::gguf::Writer w;
  for (const auto& kv : source->metadata()) w.set(kv.key, kv.value);
  for (const auto& t : source->tensors()) {
    if (t.name == "blk.0.attn_q.weight") {
      const uint64_t bytes = t.elements() / 256 * 110;  // IQ3_S blocks are 256 values in 110 bytes
      w.add_tensor(t.name, {256, t.elements() / 256}, static_cast<uint32_t>(strata::tensor::DType::IQ3_S),
                   std::vector<uint8_t>(bytes));
      continue;
    }
    const uint8_t* data = source->tensor_data(t);
    w.add_tensor(t.name, t.dims, t.type, std::vector<uint8_t>(data, data + t.size_bytes));
  }
  const std::string path = temp_path("iq3s.gguf");
  w.write(path);
  const Result r = strata("run -m " + path + " -p hi");
  EXPECT_FALSE(r.crashed);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("blk.0.attn_q.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("IQ3_S"), std::string::npos) << r.err;
  fs::remove(path);
}

TEST(Cli, PromptLongerThanTheContext) {
  std::string prompt;
  for (int i = 0; i < 200; ++i) prompt += "dream ";
  expect_one_line_error(strata("run -m " + kDreams + " -p '" + prompt + "'"), "context");
}

// An empty key must not quietly serve everything without authentication.
TEST(Cli, ServeRefusesAnEmptyApiKey) {
  expect_one_line_error(strata("serve -m " + kDreams + " --port 0 --api-key ''"), "API key is empty");
  const Result no_value = strata("serve -m " + kDreams + " --port 0 --api-key=");  // CLI11 refuses it
  EXPECT_FALSE(no_value.crashed);
  EXPECT_NE(no_value.exit_code, 0);
  EXPECT_NE(no_value.err.find("--api-key"), std::string::npos) << no_value.err;
  ASSERT_EQ(::setenv("STRATA_API_KEY", "", 1), 0);
  const Result from_environment = strata("serve -m " + kDreams + " --port 0");
  ::unsetenv("STRATA_API_KEY");
  expect_one_line_error(from_environment, "API key is empty");
}

// A number out of its option's range is named as a person would say it, in a line, not as
// CLI11's range up to the largest double written out in full.
TEST(Cli, ANumberOutsideItsOptionsRangeIsRefusedInPlainWords) {
  const auto expect_refused = [](const Result& r, const std::string& message) {
    EXPECT_FALSE(r.crashed) << r.err;
    EXPECT_NE(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_LT(r.err.size(), 120u) << r.err;
  };
  expect_refused(strata("run -m " + kDreams + " -p hi -n 0"), "--max-tokens: must be above 0, got 0");
  expect_refused(strata("run -m " + kDreams + " -p hi --temp=-0.5"), "--temp: must be 0 or more, got -0.5");
  expect_refused(strata("run -m " + kDreams + " -p hi --temp=warm"), "--temp: expected a number, got 'warm'");
  expect_refused(strata("serve -m " + kDreams + " --port 0 --parallel 0"), "--parallel: must be above 0, got 0");
  expect_refused(strata("bench --threads=-1"), "--threads: must be above 0, got -1");
}

// `strata cluster` and `drain` at a port where nothing listens say so in words, not with
// httplib's name for the error ("Connection").
TEST(Cli, ClusterCommandsSayWhyANodeDoesNotAnswer) {
  // A socket bound but not listening: connections to its port are refused while it is held.
  const int held = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(held, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(held, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string port = std::to_string(ntohs(address.sin_port));
  for (const char* command : {"cluster", "drain"}) {
    expect_one_line_error(strata(std::string(command) + " --port " + port),
                          "cannot reach http://127.0.0.1:" + port + ": nothing accepts connections there");
  }
  ::close(held);
}

// Cluster flags that cannot work are refused before the node listens or sends anything.
TEST(Cli, ServeRefusesClusterFlagsThatCannotWork) {
  const std::string serve = "serve -m " + kDreams + " --port 0 --no-discovery ";
  expect_one_line_error(strata(serve + "--memory-limit 12XB"), "12XB");
  expect_one_line_error(strata(serve + "--stages a:1"), "NODE:FIRST-LAST");
  expect_one_line_error(strata(serve + "--stages a:x-3"), "not a number");
  expect_one_line_error(strata(serve + "--stages a*x+b:0-3"), "gives node 'a' a weight that is not a positive number");
  expect_one_line_error(strata(serve + "--stages a*0+b:0-3"), "gives node 'a' a weight that is not a positive number");
  expect_one_line_error(strata(serve + "--stages a++b:0-3"), "names an empty node");
  // 192.0.2.0/24 is reserved for documentation: nothing is sent there, the flag is refused.
  expect_one_line_error(strata(serve + "--peers 192.0.2.1:8081"), "needs --cluster-key");
}

// Each decode run is reported with the bandwidth measured between its segments of 16 tokens,
// and a share only where that bandwidth held still.
TEST(Cli, BenchReportsSpeedAndTheBandwidthAroundEachDecodeSegment) {
  const Result r = strata("bench -m " + kDreams + " -p 16 -n 20 -r 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"prefill pp16: ", "decode  tg20: ", "  run 1: decode ", "  run 2: decode "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in\n" << r.out;
  }
  const bool share = r.out.find("of the bandwidth around it (median of ") != std::string::npos;
  const bool none = r.out.find("the bandwidth moved during every segment, so no share") != std::string::npos;
  EXPECT_TRUE(share != none) << r.out;
  // 20 tokens are two segments (16 and 4), each with a share or the bandwidth's move.
  const size_t run_1 = r.out.find("  run 1: decode ");
  const std::string run_1_line = r.out.substr(run_1, r.out.find('\n', run_1) - run_1);
  int segments = 0;
  for (const char* mark : {"% at ", ", moved "}) {
    for (size_t at = run_1_line.find(mark); at != std::string::npos; at = run_1_line.find(mark, at + 1)) ++segments;
  }
  EXPECT_EQ(segments, 2) << run_1_line;
}

// --depth puts that many tokens in the context before each run, as llama-bench's -d does.
TEST(Cli, BenchAtADepthSaysSoAndKeepsToTheContext) {
  const Result r = strata("bench -m " + kDreams + " -d 100 -p 16 -n 8 -r 1 --no-bandwidth");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"prefill pp16 @ d100: ", "decode  tg8 @ d100: "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in\n" << r.out;
  }
  expect_one_line_error(strata("bench -m " + kDreams + " -d 120 -p 16 -n 8 -r 1 --no-bandwidth"), "context of 128");
}

TEST(Cli, InspectListsMetadataAndTensors) {
  const Result r = strata("gguf inspect " + kDreams);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("general.architecture"), std::string::npos);
  EXPECT_NE(r.out.find("blk.0.attn_q.weight"), std::string::npos);
}

TEST(Cli, SynthWritesALoadableModel) {
  const std::string path = temp_path("synth.gguf");
  const Result r = strata("gguf synth --shape qwen2-tiny --type Q8_0 -o " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // stderr is a file here: progress comes as whole lines, never a bar redrawn with '\r'.
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(100%)"), std::string::npos) << r.err;
  const Result run = strata("run -m " + path + " -p hello -n 8 --temp 0");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  expect_one_line_error(strata("gguf synth --shape nope --type Q8_0 -o " + path), "unknown shape");
  expect_one_line_error(strata("gguf synth --shape demo --type IQ3_S -o " + path), "unknown weight type");
  fs::remove(path);
}

}  // namespace
