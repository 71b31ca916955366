// A tensor-parallel group (model/tensor_share.h) against one Model of the same range: every
// output of every step, bit for bit, for each member, whatever the group's size, its shares,
// its members' thread counts and how they gather rows (threads of one process, sockets between
// threads or between processes).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "dreams.h"
#include "model/exchange.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "model/tensor_share.h"
#include "parallel/socket_exchange.h"
#include "same_bits.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

// Shapes of three KV heads, so that groups of three have one each (a KV head's 64 values are a
// leaf of o's input: a unit of the 32-element formats' layout); each member's rows of the
// experts' down and the head then end inside the kernels' groups of 16 rows where the dimension
// does.
constexpr SyntheticShape kLlama{.name = "llama-kv3", .description = "tests: GQA 6/3, vocabulary of 1000",
                                .arch = "llama", .vocab_size = 1000, .context_length = 128, .embedding_dim = 96,
                                .layer_count = 3, .head_count = 6, .kv_head_count = 3, .ffn_dim = 224,
                                .rope_freq_base = 10000.0f, .tied_output = false, .head_dim = 32};
constexpr SyntheticShape kQwen3{.name = "qwen3-kv3", .description = "tests: QK-norm, heads of 32 beside 128",
                                .arch = "qwen3", .vocab_size = 512, .context_length = 128, .embedding_dim = 128,
                                .layer_count = 2, .head_count = 6, .kv_head_count = 3, .ffn_dim = 256,
                                .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 32};
// Gemma 3's sliding windows (12 positions in 5 of its 6 layers), post norms, scaled embeddings.
constexpr SyntheticShape kGemma3{.name = "gemma3-kv3", .description = "tests: a window of 12, GQA 6/3",
                                 .arch = "gemma3", .vocab_size = 512, .context_length = 128, .embedding_dim = 96,
                                 .layer_count = 6, .head_count = 6, .kv_head_count = 3, .ffn_dim = 200,
                                 .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 32,
                                 .qk_norm = true, .sliding_window = 12, .rope_linear_factor = 8.0f};

// Heads of 128 in pairs per KV head and 2048 FFN rows: each member's part of o's and of
// down's input can be whole K-quant activation blocks of 256.
constexpr SyntheticShape kQwen3K{.name = "qwen3-k256", .description = "tests: K-quant blocks, GQA 6/3",
                                 .arch = "qwen3", .vocab_size = 512, .context_length = 128, .embedding_dim = 256,
                                 .layer_count = 2, .head_count = 6, .kv_head_count = 3, .ffn_dim = 2048,
                                 .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 128};

// Mixtral's kind of Mixture of Experts with 3 KV heads: 3 of 6 experts of 96 rows (6 units).
constexpr SyntheticShape kMixtral{.name = "mixtral-kv3", .description = "tests: 3 of 6 experts, GQA 6/3",
                                  .arch = "llama", .vocab_size = 512, .context_length = 128, .embedding_dim = 96,
                                  .layer_count = 2, .head_count = 6, .kv_head_count = 3, .ffn_dim = 192,
                                  .rope_freq_base = 10000.0f, .tied_output = false, .head_dim = 32,
                                  .expert_count = 6, .experts_per_token = 3, .expert_ffn_dim = 96};

// The models' files: the shared one, or a synthetic one written once per test binary.
class TestModels : public ::testing::Environment {
 public:
  static std::string path(const std::string& name, const std::string& type) {
    if (name == "dreams") return testing::kDreams;
    const fs::path path = directory() / (name + "_" + type + ".gguf");
    if (!fs::exists(path)) {
      const SyntheticShape& shape = name == kLlama.name    ? kLlama
                                    : name == kQwen3.name  ? kQwen3
                                    : name == kGemma3.name ? kGemma3
                                    : name == kMixtral.name ? kMixtral
                                    : name == kQwen3K.name ? kQwen3K
                                                           : *find_synthetic_shape(name);
      write_synthetic_model(shape, parse_weight_types(type), path.string(), 11);
    }
    return path.string();
  }
  void TearDown() override { fs::remove_all(directory()); }

 private:
  static fs::path directory() {
    const fs::path dir = fs::temp_directory_path() / ("strata_tensor_parallel_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    return dir;
  }
};
const auto* const kModels = ::testing::AddGlobalTestEnvironment(new TestModels);

using testing::same_bits;

// One forward call of the script: per sequence, how many inputs it brings (0: none) and which
// rows it wants back.
struct Step {
  std::vector<int> inputs;
  std::vector<SliceOutput> outputs;
};

// Three sequences: prompts in chunks beside each other (one chunk's logits unread), then steps
// of one token each that go past gemma3-kv3's window of 12 positions.
std::vector<Step> script() {
  using enum SliceOutput;
  std::vector<Step> steps{{{5, 3, 0}, {AllLogits, LastLogits, Nothing}},
                          {{4, 0, 9}, {Nothing, Nothing, AllLogits}},
                          {{0, 7, 0}, {Nothing, LastLogits, Nothing}}};
  for (int i = 0; i < 6; ++i) steps.push_back({{1, 1, 1}, {LastLogits, LastLogits, LastLogits}});
  return steps;
}

// The models computing the range together: one Model alone, or the members of a group (each on
// a thread of its own, with a pool of `threads`). Returns, per step of the script, each member's output.
std::vector<std::vector<std::vector<float>>> run_script(const std::vector<Model*>& members, int threads) {
  const Config& c = members.front()->config();
  const LayerRange range = members.front()->range();
  constexpr int kSequences = 3;
  constexpr int kCapacity = 32;
  std::vector<std::vector<std::unique_ptr<KvState>>> kv(members.size());
  for (size_t m = 0; m < members.size(); ++m) {
    for (int q = 0; q < kSequences; ++q) kv[m].push_back(members[m]->new_sequence(kCapacity));
  }
  std::vector<std::unique_ptr<tensor::ThreadPool>> pools;
  for (size_t m = 0; m < members.size(); ++m) pools.push_back(std::make_unique<tensor::ThreadPool>(threads));
  std::vector<int> positions(kSequences, 0);
  std::vector<std::vector<std::vector<float>>> outputs;
  for (const Step& step : script()) {
    // The inputs, the same for every member: tokens for a range that embeds them, else hidden rows.
    std::vector<Token> tokens;
    std::vector<float> hidden;
    for (int q = 0; q < kSequences; ++q) {
      for (int p = positions[q]; p < positions[q] + step.inputs[q]; ++p) {
        if (range.has_embedding()) {
          tokens.push_back(static_cast<Token>((q * 131 + p * 17 + 3) % (c.vocab_size - 3) + 3));
        } else {
          for (int d = 0; d < c.embedding_dim; ++d) hidden.push_back(std::sin(q * 7.1f + p * 1.3f + d * 0.37f) * 2.0f);
        }
      }
    }
    std::vector<std::vector<float>> step_outputs(members.size());
    std::vector<std::thread> threads_of_members;
    for (size_t m = 0; m < members.size(); ++m) {
      threads_of_members.emplace_back([&, m] {
        std::vector<SequenceSlice> slices;
        for (int q = 0; q < kSequences; ++q) {
          if (step.inputs[q] > 0) slices.push_back({kv[m][q].get(), step.inputs[q], step.outputs[q]});
        }
        step_outputs[m] = members[m]->forward(slices, tokens, hidden, *pools[m]);
      });
    }
    for (std::thread& t : threads_of_members) t.join();
    outputs.push_back(std::move(step_outputs));
    for (int q = 0; q < kSequences; ++q) positions[q] += step.inputs[q];
  }
  return outputs;
}

// How the members gather each other's rows: LocalGroup, or parallel::SocketExchange over Unix
// socket pairs.
enum class Link { InProcess, Sockets };

struct GroupCase {
  const char* model;
  const char* type;
  std::vector<double> weights;  // one per member
  int threads;                  // each member's
  LayerRange range{};           // {0, 0}: all layers
  Link link = Link::InProcess;
};

std::string case_name(const ::testing::TestParamInfo<GroupCase>& info) {
  const GroupCase& c = info.param;
  std::string name = std::string(c.model) + "_" + c.type + "_shares";
  for (const double w : c.weights) name += "_" + std::to_string(static_cast<int>(w));
  name += "_threads_" + std::to_string(c.threads);
  if (c.range.last > 0) name += "_layers_" + std::to_string(c.range.first) + "_" + std::to_string(c.range.last);
  if (c.link == Link::Sockets) name += "_sockets";
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

void PrintTo(const GroupCase& c, std::ostream* os) { *os << case_name({c, 0}); }

class GroupEqualsOneModel : public ::testing::TestWithParam<GroupCase> {};

TEST_P(GroupEqualsOneModel, EveryMembersOutputsHaveTheModelsBits) {
  const GroupCase& gc = GetParam();
  const std::shared_ptr<const gguf::File> file = gguf::File::open(TestModels::path(gc.model, gc.type));
  const Config config = Config::from_gguf(*file);
  const LayerRange range = gc.range.last > 0 ? gc.range : LayerRange{0, config.layer_count};
  const auto whole = Model::load(file, range);
  const auto expected = run_script({whole.get()}, 1);

  const std::vector<TensorShare> shares = plan_tensor_shares(config, gc.weights);
  const int size = static_cast<int>(shares.size());
  LocalGroup group(size);
  std::vector<std::unique_ptr<parallel::SocketExchange>> sockets;
  const auto mesh = parallel::socket_pair_mesh(gc.link == Link::Sockets ? size : 0);
  for (const std::vector<int>& peers : mesh) {
    sockets.push_back(std::make_unique<parallel::SocketExchange>(static_cast<int>(sockets.size()), peers));
  }
  std::vector<std::unique_ptr<Model>> owned;
  std::vector<Model*> members;
  for (int m = 0; m < size; ++m) {
    Exchange& exchange = gc.link == Link::Sockets ? *sockets[static_cast<size_t>(m)] : group.member(m);
    owned.push_back(Model::load_share(file, range, shares, exchange));
    members.push_back(owned.back().get());
  }
  const auto actual = run_script(members, gc.threads);
  for (size_t step = 0; step < expected.size(); ++step) {
    for (size_t m = 0; m < members.size(); ++m) {
      EXPECT_TRUE(same_bits(actual[step][m], expected[step][0])) << "step " << step << ", member " << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dense, GroupEqualsOneModel,
    ::testing::Values(GroupCase{"dreams", "F32", {1, 1}, 1}, GroupCase{"dreams", "F32", {3, 1}, 2},
                      GroupCase{"dreams", "F32", {1, 1, 1}, 2}, GroupCase{"dreams", "F32", {1, 3, 1}, 1},
                      GroupCase{"llama-kv3", "Q4_0", {1, 1, 1}, 1}, GroupCase{"llama-kv3", "Q4_0", {1, 2}, 2},
                      GroupCase{"qwen3-kv3", "Q8_0", {1, 1}, 2}, GroupCase{"qwen3-kv3", "Q8_0", {2, 1, 1}, 1},
                      GroupCase{"gemma3-kv3", "F16", {1, 1, 1}, 2}, GroupCase{"gemma3-kv3", "F16", {1, 4}, 1},
                      // q, k and v biases, fused QKV and gate-up.
                      GroupCase{"qwen2-tiny", "Q8_0", {1, 1}, 1}, GroupCase{"phi3-tiny", "Q4_0", {2, 1}, 2}),
    case_name);

// o's and down's leaves of whole K-quant blocks (Q4_K_M mixes Q4_K with Q6_K, whose kernels
// offset the levels differently; Q3_K's kernels take two blocks at a time, so that a leaf of
// one is padded), evenly and unevenly.
INSTANTIATE_TEST_SUITE_P(
    KQuants, GroupEqualsOneModel,
    ::testing::Values(GroupCase{"qwen3-k256", "Q4_K_M", {1, 1}, 2}, GroupCase{"qwen3-k256", "Q4_K_M", {1, 2}, 1},
                      GroupCase{"qwen3-k256", "Q6_K", {1, 1, 1}, 2}, GroupCase{"qwen3-k256", "Q3_K", {2, 1}, 1}),
    case_name);

// Each expert's rows shared out as a dense FFN's, the routing every member's.
INSTANTIATE_TEST_SUITE_P(
    Experts, GroupEqualsOneModel,
    ::testing::Values(GroupCase{"mixtral-kv3", "Q4_0", {1, 1, 1}, 1}, GroupCase{"mixtral-kv3", "Q4_0", {1, 3}, 2},
                      GroupCase{"qwen3moe-tiny", "Q8_0", {1, 1}, 2},
                      // attention sinks, expert biases, windows in the even layers
                      GroupCase{"gpt-oss-tiny", "F32", {3, 1}, 1},
                      // a dense first layer, then experts and a shared one
                      GroupCase{"glm4moe-tiny", "Q8_0", {1, 2}, 2}),
    case_name);

// The same over sockets: a frame per member and gather.
INSTANTIATE_TEST_SUITE_P(
    Sockets, GroupEqualsOneModel,
    ::testing::Values(GroupCase{"dreams", "F32", {1, 2, 1}, 1, {}, Link::Sockets},
                      GroupCase{"gemma3-kv3", "F16", {1, 1}, 2, {}, Link::Sockets},
                      GroupCase{"mixtral-kv3", "Q4_0", {1, 1, 1}, 1, {}, Link::Sockets},
                      GroupCase{"llama-kv3", "Q8_0", {1, 2}, 2, {}, Link::Sockets},
                      GroupCase{"qwen3-k256", "Q4_K_M", {1, 1}, 1, {}, Link::Sockets},
                      GroupCase{"dreams", "F32", {1, 1}, 2, {1, 3}, Link::Sockets}),
    case_name);

// A range that is not the whole model: hidden rows in, hidden rows out, or both.
INSTANTIATE_TEST_SUITE_P(
    Ranges, GroupEqualsOneModel,
    ::testing::Values(GroupCase{"dreams", "F32", {1, 1}, 1, {0, 2}}, GroupCase{"dreams", "F32", {1, 2, 1}, 2, {1, 3}},
                      GroupCase{"dreams", "F32", {2, 1}, 1, {2, 4}},
                      GroupCase{"gemma3-kv3", "F16", {1, 1, 1}, 1, {2, 5}}),
    case_name);

// Members in processes of their own, as a group across machines would be: the test's process
// runs member 0 and forks the others, each of which compares its outputs with one Model's and
// exits with the result.
TEST(GroupOverSockets, MembersInProcessesOfTheirOwnHaveTheModelsBits) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(TestModels::path("qwen3-kv3", "Q8_0"));
  const Config config = Config::from_gguf(*file);
  const LayerRange range{0, config.layer_count};
  const std::vector<TensorShare> shares = plan_tensor_shares(config, std::vector<double>{1, 1, 2});
  const auto mesh = parallel::socket_pair_mesh(3);
  // Member m's share and outputs against the whole model's: whether every step's are the same bits.
  const auto member_agrees = [&](int m) {
    parallel::SocketExchange exchange(m, mesh[static_cast<size_t>(m)]);
    const auto member = Model::load_share(file, range, shares, exchange);
    const auto actual = run_script({member.get()}, 1);
    const auto whole = Model::load(file, range);
    const auto expected = run_script({whole.get()}, 1);
    bool same = true;
    for (size_t step = 0; step < expected.size(); ++step) same = same && same_bits(actual[step][0], expected[step][0]);
    return same;
  };
  std::vector<pid_t> children;
  for (int m = 1; m < 3; ++m) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(member_agrees(m) ? 0 : 1);  // past gtest's own exit, which would clean up
    children.push_back(pid);
  }
  // The children's ends are theirs alone: a child's exit then ends its connections here too.
  for (int m = 1; m < 3; ++m) {
    for (const int fd : mesh[static_cast<size_t>(m)]) {
      if (fd >= 0) ::close(fd);
    }
  }
  EXPECT_TRUE(member_agrees(0));
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "member process " << pid;
  }
}

// Records the bytes of this member's part of each gather and the sizes of the regions named
// read next before it, and gathers through another exchange.
class CountingExchange final : public Exchange {
 public:
  explicit CountingExchange(Exchange& inner) : inner_(inner) {}
  int member() const override { return inner_.member(); }
  int size() const override { return inner_.size(); }
  void all_gather_bytes(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                        std::span<std::byte> full) override {
    parts.push_back(mine.size());
    read_next_sizes.push_back(std::exchange(next_, {}));
    inner_.all_gather_bytes(mine, widths, rows, full);
  }
  void read_next(std::span<const std::span<const std::byte>> regions) override {
    next_.clear();
    for (const std::span<const std::byte> region : regions) next_.push_back(region.size());
  }
  void abort() override { inner_.abort(); }
  std::vector<size_t> parts;
  std::vector<std::vector<size_t>> read_next_sizes;

 private:
  Exchange& inner_;
  std::vector<size_t> next_;
};

struct Gathered {
  std::vector<size_t> parts;                         // member 0's part of each gather, in bytes
  std::vector<std::vector<size_t>> read_next_sizes;  // and the regions it named read next
};

// Member 0's gathers over the script, with every member's outputs checked against one Model's.
Gathered gathered_bytes(const std::string& model, const std::string& type, std::span<const TensorShare> shares) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(TestModels::path(model, type));
  const LayerRange range{0, Config::from_gguf(*file).layer_count};
  const auto whole = Model::load(file, range);
  const auto expected = run_script({whole.get()}, 1);
  LocalGroup group(static_cast<int>(shares.size()));
  std::vector<std::unique_ptr<CountingExchange>> exchanges;
  std::vector<std::unique_ptr<Model>> owned;
  std::vector<Model*> members;
  for (int m = 0; m < static_cast<int>(shares.size()); ++m) {
    exchanges.push_back(std::make_unique<CountingExchange>(group.member(m)));
    owned.push_back(Model::load_share(file, range, shares, *exchanges.back()));
    members.push_back(owned.back().get());
  }
  const auto actual = run_script(members, 1);
  for (size_t step = 0; step < expected.size(); ++step) {
    for (size_t m = 0; m < members.size(); ++m) {
      EXPECT_TRUE(same_bits(actual[step][m], expected[step][0])) << type << " step " << step << ", member " << m;
    }
  }
  return {exchanges.front()->parts, exchanges.front()->read_next_sizes};
}

// Member 0's part of each gather of `layer` for a step of `rows` rows, in order: its sums of o's
// leaves (a float row of the embedding per node of its cover), then its sums of the FFN's: of
// down's leaves, or of the experts' leaves and then of the shared expert's.
std::vector<size_t> expected_parts(const gguf::File& file, std::span<const TensorShare> shares, int layer,
                                   size_t rows) {
  const Config c = Config::from_gguf(file);
  const ProjectionLeaves leaves = projection_leaves(c);
  const TensorShare& mine = shares[0];
  const size_t sums_row = static_cast<size_t>(c.embedding_dim) * sizeof(float);
  const auto nodes = [&](int count, RowRange part, int unit) {
    return count == 0 ? 0 : leaf_cover(count, part.first / unit, (part.last + unit - 1) / unit).size();
  };
  std::vector<size_t> parts{rows * nodes(leaves.o_count(c), mine.kv_heads, leaves.kv_heads) * sums_row};
  if (!c.layer_has_experts(layer)) {
    parts.push_back(rows * nodes(leaves.down_count(c), mine.ffn_rows, leaves.ffn_rows) * sums_row);
    return parts;
  }
  parts.push_back(rows *
                  (nodes(leaves.expert_count(c), mine.expert_rows, leaves.expert_rows) +
                   nodes(leaves.shared_expert_count(c), mine.shared_expert_rows, leaves.shared_expert_rows)) *
                  sums_row);
  return parts;
}

// `rows` of a tensor (a member's share of them), as a matmul reads them: in interleaved groups
// of 16 rows, each row at least its GGUF bytes, at most two blocks more (a layout's unit may
// take two) and a sixteenth (a block's layout may pad it).
struct ReadMatrix {
  std::string tensor;
  int rows = 0;
  bool holds(const gguf::File& file, size_t bytes) const {
    const gguf::TensorInfo* t = file.find_tensor(tensor);
    if (t == nullptr) return false;
    const auto type = static_cast<tensor::DType>(t->type);
    const size_t row = *tensor::row_bytes(type, t->dims[0]);
    const size_t most_row = *tensor::row_bytes(type, t->dims[0] + 2 * tensor::info(type).block_elements) * 17 / 16;
    const size_t padded_rows = static_cast<size_t>((rows + 15) / 16 * 16);
    return bytes >= padded_rows * row && bytes <= padded_rows * most_row;
  }
};

// The matrices member 0 says it reads next before each gather of `layer` (as expected_parts
// lists them): its FFN's gate and up (a layer with experts: the router, and the shared
// expert's), then the next layer's q, k and v, or the head after the last layer.
std::vector<std::vector<ReadMatrix>> expected_reads(const gguf::File& file, std::span<const TensorShare> shares,
                                                    int layer) {
  const Config c = Config::from_gguf(file);
  const TensorShare& mine = shares[0];
  const auto blk = [](int l, const std::string& name) { return "blk." + std::to_string(l) + "." + name + ".weight"; };
  std::vector<std::vector<ReadMatrix>> reads;
  if (!c.layer_has_experts(layer)) {
    reads.push_back({{blk(layer, "ffn_gate"), mine.ffn_rows.size()}, {blk(layer, "ffn_up"), mine.ffn_rows.size()}});
  } else {
    reads.push_back({{blk(layer, "ffn_gate_inp"), c.expert_count}});
    if (c.shared_expert_ffn_dim > 0) {
      reads.back().push_back({blk(layer, "ffn_gate_shexp"), mine.shared_expert_rows.size()});
      reads.back().push_back({blk(layer, "ffn_up_shexp"), mine.shared_expert_rows.size()});
    }
  }
  if (layer + 1 < c.layer_count) {
    const int heads = mine.kv_heads.size() * c.head_dim;
    reads.push_back({{blk(layer + 1, "attn_q"), heads * (c.head_count / c.kv_head_count)},
                     {blk(layer + 1, "attn_k"), heads},
                     {blk(layer + 1, "attn_v"), heads}});
  } else {
    const std::string head = file.find_tensor("output.weight") != nullptr ? "output.weight" : "token_embd.weight";
    reads.push_back({{head, mine.vocab_rows.size()}});
  }
  return reads;
}

// What each member sends, gather by gather, over the script (every member's outputs checked
// against one Model's on the way): o and the FFN each a few rows of sums, rather than their
// inputs and outputs; in a layer with experts, the chosen experts' leaves weighed into them and
// the shared expert's beside them, in one gather, rather than a row per chosen expert.
void expect_gathers(const std::string& model, const std::string& type, const std::vector<double>& weights) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(TestModels::path(model, type));
  const Config config = Config::from_gguf(*file);
  const std::vector<TensorShare> shares = plan_tensor_shares(config, weights);
  const Gathered gathered = gathered_bytes(model, type, shares);
  const std::vector<size_t>& parts = gathered.parts;
  size_t at = 0;
  for (const Step& step : script()) {
    size_t rows = 0;
    for (const int inputs : step.inputs) rows += static_cast<size_t>(inputs);
    for (int l = 0; l < config.layer_count; ++l) {
      for (const size_t expected : expected_parts(*file, shares, l, rows)) {
        ASSERT_LT(at, parts.size()) << model;
        EXPECT_EQ(parts[at], expected) << model << " " << type << " layer " << l << ", gather " << at;
        ++at;
      }
      const auto reads = expected_reads(*file, shares, l);
      for (size_t g = 0; g < reads.size(); ++g) {
        const std::vector<size_t>& sizes = gathered.read_next_sizes[at - reads.size() + g];
        const std::string where = model + " " + type + " layer " + std::to_string(l) + ", gather " + std::to_string(g);
        ASSERT_EQ(sizes.size(), reads[g].size()) << where;
        for (size_t i = 0; i < sizes.size(); ++i) {
          EXPECT_TRUE(reads[g][i].holds(*file, sizes[i])) << where << ": " << reads[g][i].tensor << ", " << sizes[i] << " bytes";
        }
      }
    }
    EXPECT_TRUE(gathered.read_next_sizes[at].empty()) << model << ": read next before the logits";
    ++at;  // the logits
  }
  EXPECT_EQ(at, parts.size()) << model;
}

TEST(Gathers, EveryLayerSendsLeafSumsTwice) {
  expect_gathers("llama-kv3", "Q4_0", {1, 1, 1});
  expect_gathers("llama-kv3", "Q8_0", {1, 2});
  expect_gathers("qwen3-k256", "Q4_K_M", {2, 1});
  expect_gathers("qwen3-k256", "Q4_K_M", {1, 1, 1});
  expect_gathers("dreams", "F32", {1, 3, 1});
  expect_gathers("mixtral-kv3", "Q4_0", {1, 3});
  for (const std::string name : {"mixtral-kv3", "qwen3moe-tiny", "gpt-oss-tiny", "glm4moe-tiny"}) {
    expect_gathers(name, "Q8_0", {1, 2});
  }
}

TEST(GroupLoad, RefusesLatentAttentionNamingIt) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(TestModels::path("deepseek2-tiny", "F32"));
  const Config config = Config::from_gguf(*file);
  LocalGroup group(2);
  const std::vector<TensorShare> shares(2);  // plan_tensor_shares refuses latent attention too
  try {
    Model::load_share(file, {0, config.layer_count}, shares, group.member(0));
    FAIL() << "loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "tensor parallelism cannot split deepseek2's latent attention, whose heads all read one latent KV head");
  }
}

TEST(GroupLoad, RefusesSharesThatDoNotCoverTheModel) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(testing::kDreams);
  const Config config = Config::from_gguf(*file);
  LocalGroup group(2);
  std::vector<TensorShare> shares = plan_tensor_shares(config, std::vector<double>{1, 1});
  shares[1].ffn_rows.last -= 1;
  try {
    Model::load_share(file, {0, config.layer_count}, shares, group.member(0));
    FAIL() << "loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the group's shares do not cover the FFN rows in member order");
  }
  EXPECT_THROW(Model::load_share(file, {0, config.layer_count}, std::span(shares).first(1), group.member(0)),
               std::runtime_error);
  // Covering, but with a share of down's input that starts inside a leaf (of 21 rows).
  shares[1].ffn_rows.last += 1;
  shares[0].ffn_rows.last += 1;
  shares[1].ffn_rows.first += 1;
  try {
    Model::load_share(file, {0, config.layer_count}, shares, group.member(0));
    FAIL() << "loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the group's shares of the FFN rows are not whole leaves of 21");
  }
}

}  // namespace
}  // namespace strata::model
