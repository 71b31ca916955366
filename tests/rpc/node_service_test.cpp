// The node service refuses what it must not act on: connections without a certificate of the
// cluster key's authority (before any call), calls without the key's proof or with a wrong
// one, replays, messages of another placement epoch or protocol, malformed and oversized
// batches. Every refusal is an error status; the service keeps serving.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <tuple>

#include "engine/local_stage.h"
#include "metrics/metrics.h"
#include "rpc/channel.h"
#include "rpc/hello_client.h"
#include "rpc/messages.h"
#include "rpc/node_service.h"
#include "rpc/peer_channel.h"
#include "rpc/remote_generator.h"
#include "rpc/remote_stage.h"

namespace strata::rpc {
namespace {

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";
constexpr uint64_t kEpoch = 5;

class OneStageNode final : public NodeHandler {
 public:
  OneStageNode() : pool_(1) {
    auto file = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
    stage_ = std::make_shared<engine::LocalStage>(model::Model::load(file), pool_,
                                                  engine::KvOptions{model::KvType::F32, {64}});
  }
  std::string hello(const cluster_types::Hello& request, const std::string&, cluster_types::Hello& reply) override {
    // A sender named "spoil" is answered without a node id, against the protocol's rules.
    reply.sender.node_id = request.sender.node_id == "spoil" ? "" : "server";
    reply.sender.state = request.sender.node_id;
    return {};
  }
  std::shared_ptr<engine::Stage> stage(uint64_t epoch, std::string& why) override {
    if (epoch != kEpoch) {
      why = "another epoch";
      return nullptr;
    }
    return stage_;
  }
  std::shared_ptr<engine::Generator> scheduler(std::string& why) override {
    if (scheduler_) return scheduler_;
    why = "not the leader";
    return nullptr;
  }
  void lead(std::shared_ptr<engine::Generator> scheduler) { scheduler_ = std::move(scheduler); }
  std::optional<cluster_types::ModelManifest> manifest(const std::string&, std::string& why) override {
    why = "no model here";
    return std::nullopt;
  }
  // Tensor 0: two and a half chunks of counting bytes; no other.
  std::optional<TensorBytes> tensor(const cluster_types::TensorRequest& request, std::string& why) override {
    if (request.tensor != 0) {
      why = "no such tensor";
      return std::nullopt;
    }
    return TensorBytes{nullptr, tensor_};
  }
  size_t held() const { return stage_->sequence_count(); }
  const std::vector<uint8_t>& tensor_bytes() const { return tensor_; }

 private:
  std::vector<uint8_t> tensor_ = [] {
    std::vector<uint8_t> bytes(kTensorChunkBytes * 5 / 2);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + i / 251);
    return bytes;
  }();
  tensor::ThreadPool pool_;
  std::shared_ptr<engine::LocalStage> stage_;
  std::shared_ptr<engine::Generator> scheduler_;
};

// A scheduler whose requests produce no token (as while it waits for a new placement): it
// only ends one when its `cancelled` says so.
class SilentScheduler final : public engine::Generator {
 public:
  engine::ModelLimits limits() const override { return {128, 1, 1}; }
  bool submit(engine::GenerationRequest, engine::RequestCallbacks callbacks) override {
    std::lock_guard lock(mutex_);
    callbacks_ = std::move(callbacks);
    submitted_.notify_all();
    return true;
  }
  void shutdown() override {}
  // Waits up to `limit` for the request's cancelled() to say so, then ends it Cancelled.
  bool cancelled_within(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::unique_lock lock(mutex_);
    if (!submitted_.wait_until(lock, deadline, [&] { return callbacks_.cancelled != nullptr; })) return false;
    while (!callbacks_.cancelled()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      lock.lock();
    }
    callbacks_.on_finish(engine::FinishReason::Cancelled, {});
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable submitted_;
  engine::RequestCallbacks callbacks_;
};

// A scheduler that ends every request it is given at once, as `reason` with `error`, counting them.
class CountingScheduler final : public engine::Generator {
 public:
  explicit CountingScheduler(engine::FinishReason reason = engine::FinishReason::Stop, std::string error = {})
      : reason_(reason), error_(std::move(error)) {}
  engine::ModelLimits limits() const override { return {128, 1, 1}; }
  bool submit(engine::GenerationRequest, engine::RequestCallbacks callbacks) override {
    ++submitted;
    callbacks.on_finish(reason_, error_);
    return true;
  }
  void shutdown() override {}
  std::atomic<int> submitted{0};

 private:
  engine::FinishReason reason_;
  std::string error_;
};

// Any SHA-256, as peers name models by.
const std::string kModelHash(64, 'a');

class NodeServiceTest : public ::testing::Test {
 protected:
  NodeServiceTest()
      : server_(node_, "server", std::make_shared<ClusterKey>("secret"), "127.0.0.1", 0, [this](const std::string& line) {
          log_.push_back(line);
        }),
        stub_(Node::NewStub(make_channel(address(), key_))) {}

  std::string address() const { return "127.0.0.1:" + std::to_string(server_.port()); }

  // One batch on a stream of its own.
  static grpc::Status forward_on(Node::Stub& stub, grpc::ClientContext& context, const ForwardRequest& request,
                                 ForwardReply* reply) {
    auto stream = stub.Forward(&context);
    ForwardReply ignored;
    if (stream->Write(request)) stream->Read(reply ? reply : &ignored);
    stream->WritesDone();
    return stream->Finish();
  }

  grpc::Status forward(const ForwardRequest& request, const ClusterKey& key, ForwardReply* reply = nullptr) {
    grpc::ClientContext context;
    key.sign(context, "client", "Forward");
    return forward_on(*stub_, context, request, reply);
  }

  // Tensor 0 from `offset` on: its bytes, in how many chunks, and the call's status. Every
  // chunk must continue where the previous one ended.
  struct Fetched {
    std::vector<uint8_t> bytes;
    int chunks = 0;
    grpc::Status status;
  };
  Fetched fetch(uint64_t offset) {
    grpc::ClientContext context;
    key_.sign(context, "client", "FetchTensor");
    FetchTensorRequest request;
    request.set_model_hash(kModelHash);
    request.set_tensor(0);
    request.set_offset(offset);
    auto reader = stub_->FetchTensor(&context, request);
    Fetched fetched;
    TensorChunk chunk;
    while (reader->Read(&chunk)) {
      EXPECT_EQ(chunk.offset(), offset + fetched.bytes.size());
      fetched.bytes.insert(fetched.bytes.end(), chunk.data().begin(), chunk.data().end());
      ++fetched.chunks;
    }
    fetched.status = reader->Finish();
    return fetched;
  }

  static ForwardRequest start_sequence(uint64_t id, uint64_t epoch = kEpoch) {
    ForwardRequest r;
    r.set_sender_id("client");
    r.set_epoch(epoch);
    SequenceWork* w = r.add_sequences();
    w->set_sequence_id(id);
    w->set_first_position(0);
    w->set_token_count(2);
    w->set_capacity(16);
    r.add_tokens(1);
    r.add_tokens(300);
    return r;
  }

  // A request as a node that relays one sends it (RemoteGenerator): every field in range.
  static GenerateRequest valid_generate() {
    GenerateRequest r;
    r.set_sender_id("client");
    r.add_prompt(1);
    r.add_prompt(300);
    r.set_max_tokens(8);
    SamplingParams* s = r.mutable_sampling();
    const sampling::SamplingParams defaults;
    s->set_temperature(defaults.temperature);
    s->set_top_k(defaults.top_k);
    s->set_top_p(defaults.top_p);
    s->set_min_p(defaults.min_p);
    s->set_repetition_penalty(defaults.repetition_penalty);
    s->set_presence_penalty(defaults.presence_penalty);
    s->set_frequency_penalty(defaults.frequency_penalty);
    s->set_penalty_last_n(defaults.penalty_last_n);
    r.set_logprobs(true);
    r.set_top_logprobs(5);
    return r;
  }

  grpc::Status generate(const GenerateRequest& request) {
    grpc::ClientContext context;
    key_.sign(context, "client", "Generate");
    auto reader = stub_->Generate(&context, request);
    GenerateEvent event;
    while (reader->Read(&event)) {
    }
    return reader->Finish();
  }

  ClusterKey key_{"secret"};
  OneStageNode node_;
  std::vector<std::string> log_;
  NodeServer server_;
  std::unique_ptr<Node::Stub> stub_;
};

TEST_F(NodeServiceTest, AcceptsASignedBatchOfTheCurrentEpoch) {
  ForwardReply reply;
  ASSERT_TRUE(forward(start_sequence(1), key_, &reply).ok());
  EXPECT_EQ(reply.rows().size(), 512 * sizeof(float));  // one logits row
  EXPECT_EQ(node_.held(), 1u);
}

TEST_F(NodeServiceTest, RefusesCallsWithoutTheKeysProofOrWithAnother) {
  grpc::ClientContext unsigned_call;
  unsigned_call.AddMetadata("x-strata-sender", "client");
  EXPECT_EQ(forward_on(*stub_, unsigned_call, start_sequence(1), nullptr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(forward(start_sequence(1), ClusterKey("guess")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(node_.held(), 0u);
  ASSERT_EQ(log_.size(), 2u);
  EXPECT_NE(log_[0].find("refused a Forward call"), std::string::npos) << log_[0];
}

// A caller that cannot show a certificate of the cluster key's authority, plain or with TLS
// under another key, gets no further than the handshake: not one call reaches the service.
TEST_F(NodeServiceTest, RefusesConnectionsWithoutTheKeysCertificateBeforeAnyCall) {
  const ClusterKey other("guess");
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(kNodeCertificateName);
  for (const auto& credentials : {grpc::InsecureChannelCredentials(), other.links().channel_credentials()}) {
    auto stub = Node::NewStub(grpc::CreateCustomChannel(address(), credentials, args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    key_.sign(context, "client", "Forward");  // even with the proof of the key
    EXPECT_EQ(forward_on(*stub, context, start_sequence(1), nullptr).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_EQ(node_.held(), 0u);
  EXPECT_TRUE(log_.empty()) << "a call reached the service: " << log_.front();
  EXPECT_TRUE(forward(start_sequence(2), key_).ok());
}

TEST_F(NodeServiceTest, RefusesATimeThatIsNotWhollyANumber) {
  const std::string time = std::to_string(unix_time_ms());
  for (const std::string& given : {time + "abc", time + " ", "+" + time, std::string()}) {
    const std::string nonce = fresh_nonce();
    grpc::ClientContext context;
    context.AddMetadata("x-strata-sender", "client");
    context.AddMetadata("x-strata-time", given);
    context.AddMetadata("x-strata-nonce", nonce);
    context.AddMetadata("x-strata-mac", key_.mac("client\nForward\n" + given + "\n" + nonce + "\n"));
    const grpc::Status status = forward_on(*stub_, context, start_sequence(1), nullptr);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "'" << given << "'";
  }
  EXPECT_EQ(node_.held(), 0u);
}

TEST_F(NodeServiceTest, RefusesAReplayedCall) {
  // The proof of one call, sent twice: sender, method, time and nonce under the key.
  const std::string time = std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  const std::string nonce = "00112233445566778899aabbccddeeff";
  const std::string mac = key_.mac("client\nForward\n" + time + "\n" + nonce + "\n");
  for (bool first : {true, false}) {
    grpc::ClientContext context;
    context.AddMetadata("x-strata-sender", "client");
    context.AddMetadata("x-strata-time", time);
    context.AddMetadata("x-strata-nonce", nonce);
    context.AddMetadata("x-strata-mac", mac);
    const grpc::Status status = forward_on(*stub_, context, start_sequence(first ? 1 : 2), nullptr);
    EXPECT_EQ(status.ok(), first) << status.error_message();
  }
  EXPECT_EQ(node_.held(), 1u);
}

TEST_F(NodeServiceTest, OneStreamCarriesBatchAfterBatch) {
  grpc::ClientContext context;
  key_.sign(context, "client", "Forward");
  auto stream = stub_->Forward(&context);
  for (uint64_t id = 1; id <= 3; ++id) {
    ForwardReply reply;
    ASSERT_TRUE(stream->Write(start_sequence(id)));
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.rows().size(), 512 * sizeof(float));
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(node_.held(), 3u);
}

TEST_F(NodeServiceTest, StreamsATensorInChunksInOrder) {
  const Fetched fetched = fetch(0);
  ASSERT_TRUE(fetched.status.ok());
  EXPECT_EQ(fetched.chunks, 3);
  EXPECT_EQ(fetched.bytes, node_.tensor_bytes());
}

TEST_F(NodeServiceTest, StreamsATensorFromTheOffsetAskedFor) {
  const std::vector<uint8_t>& tensor = node_.tensor_bytes();
  for (const uint64_t from : {kTensorChunkBytes * 3 / 2, uint64_t{tensor.size()}}) {
    const Fetched fetched = fetch(from);
    ASSERT_TRUE(fetched.status.ok()) << from;
    EXPECT_TRUE(std::equal(fetched.bytes.begin(), fetched.bytes.end(),
                           tensor.begin() + static_cast<std::ptrdiff_t>(from), tensor.end()))
        << from;
  }
}

TEST_F(NodeServiceTest, RefusesAnOffsetPastTheTensorsEnd) {
  const Fetched fetched = fetch(node_.tensor_bytes().size() + 1);
  EXPECT_EQ(fetched.chunks, 0);
  EXPECT_EQ(fetched.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(fetched.status.error_message().find("past the end"), std::string::npos) << fetched.status.error_message();
}

TEST_F(NodeServiceTest, RefusesATensorItLacksOrAnUnsignedFetch) {
  for (const auto& [index, key, code] : {std::tuple{1u, &key_, grpc::StatusCode::NOT_FOUND},
                                         std::tuple{0u, static_cast<ClusterKey*>(nullptr), grpc::StatusCode::UNAUTHENTICATED}}) {
    grpc::ClientContext context;
    if (key != nullptr) key->sign(context, "client", "FetchTensor");
    FetchTensorRequest request;
    request.set_model_hash(kModelHash);
    request.set_tensor(index);
    auto reader = stub_->FetchTensor(&context, request);
    TensorChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), code);
  }
}

TEST_F(NodeServiceTest, RefusesAnotherEpoch) {
  const grpc::Status status = forward(start_sequence(1, kEpoch + 1), key_);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(node_.held(), 0u);
}

TEST_F(NodeServiceTest, RefusesAnotherProtocolVersion) {
  HelloRequest hello;
  hello.mutable_sender()->set_node_id("old");
  hello.mutable_sender()->set_protocol_version(kProtocolVersion + 1);
  grpc::ClientContext context;
  key_.sign(context, "old", "Hello");
  HelloReply reply;
  EXPECT_EQ(stub_->Hello(&context, hello, &reply).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// The calling side answers in the cluster's terms: the peer's Hello converted, or a reply that
// breaks the protocol's rules refused, naming the field, before anything of it is taken in.
TEST_F(NodeServiceTest, SayHelloConvertsTheReplyOrRefusesAMalformedOne) {
  cluster_types::Hello hello;
  hello.sender = {.node_id = "client",
                  .node_address = "127.0.0.1:9001",
                  .api_address = "127.0.0.1:9000",
                  .model_hash = kModelHash,
                  .protocol_version = kProtocolVersion,
                  .weight_bytes_per_second = 1e9,
                  .state = "starting"};
  const PeerChannel channel = PeerChannel::to(address(), key_);
  const HelloOutcome answered = say_hello(channel, hello, "client", key_, std::chrono::seconds(10));
  ASSERT_EQ(answered.failure, HelloFailure::None) << answered.message;
  EXPECT_EQ(answered.reply.sender.node_id, "server");
  EXPECT_EQ(answered.reply.sender.state, "client") << "the fake node says whom it answered";

  hello.sender.node_id = "spoil";
  const HelloOutcome spoiled = say_hello(channel, hello, "spoil", key_, std::chrono::seconds(10));
  EXPECT_EQ(spoiled.failure, HelloFailure::Malformed);
  EXPECT_NE(spoiled.message.find("node_id"), std::string::npos) << spoiled.message;
  EXPECT_TRUE(spoiled.reply.sender.node_id.empty());
}

TEST_F(NodeServiceTest, RefusesMalformedBatchesAndKeepsServing) {
  std::vector<std::pair<std::string, ForwardRequest>> cases;
  ForwardRequest r = start_sequence(1);
  r.clear_sequences();
  cases.emplace_back("no sequences", r);
  r = start_sequence(1);
  r.add_tokens(5);
  cases.emplace_back("token count", r);
  r = start_sequence(1);
  r.set_hidden(std::string(2 * 64 * sizeof(float), '\0'));
  cases.emplace_back("tokens and hidden to the first stage", r);
  r = start_sequence(1);
  r.set_hidden(std::string(12, '\0'));
  cases.emplace_back("hidden rows of another width", r);
  r = start_sequence(1);
  r.mutable_sequences(0)->set_capacity(1 << 30);
  cases.emplace_back("capacity", r);
  r = start_sequence(1);
  r.mutable_sequences(0)->set_first_position(-3);
  cases.emplace_back("negative position", r);
  r = start_sequence(1);
  r.mutable_sequences(0)->set_token_count(0);
  cases.emplace_back("no inputs", r);
  r = start_sequence(1);
  r.clear_tokens();
  r.set_hidden(std::string(2 * 64 * sizeof(float), '\0'));
  cases.emplace_back("hidden rows without their tokens", r);
  r = start_sequence(1);
  r.mutable_sequences(0)->set_first_position(7);  // skips positions of an unknown sequence
  cases.emplace_back("unknown sequence", r);
  const auto with_step = [](const std::function<void(SamplingStep&)>& change) {
    ForwardRequest request = start_sequence(1);
    SamplingStep& step = *request.mutable_sequences(0)->mutable_sampling();
    step.mutable_params()->set_temperature(0.5f);
    step.mutable_params()->set_repetition_penalty(1.0f);
    for (int i = 0; i < 4; ++i) step.add_random(i);
    step.set_top_logprobs(-1);
    change(step);
    return request;
  };
  EXPECT_EQ(malformed(with_step([](SamplingStep&) {})), "") << "the base case is well-formed";
  cases.emplace_back("a generator of 3 words", with_step([](SamplingStep& s) { s.mutable_random()->RemoveLast(); }));
  cases.emplace_back("flags without their bytes", with_step([](SamplingStep& s) { s.set_allowed_count(9); }));
  cases.emplace_back("more flag bytes than flags", with_step([](SamplingStep& s) { s.set_allowed(std::string(2, '\1')); }));
  cases.emplace_back("a temperature out of range", with_step([](SamplingStep& s) { s.mutable_params()->set_temperature(NAN); }));
  cases.emplace_back("too many logprobs", with_step([](SamplingStep& s) { s.set_top_logprobs(engine::kMaxTopLogprobs + 1); }));
  cases.emplace_back("a negative penalty token", with_step([](SamplingStep& s) { s.add_recent(-4); }));
  r = with_step([](SamplingStep&) {});
  r.mutable_sequences(0)->set_output(EMBEDDINGS);
  cases.emplace_back("a sampling step for an embedding", r);
  EXPECT_EQ(malformed(with_step([](SamplingStep& s) { s.set_drafts(1); })), "") << "a draft after the last token";
  cases.emplace_back("drafts that take every input", with_step([](SamplingStep& s) { s.set_drafts(2); }));
  cases.emplace_back("negative drafts", with_step([](SamplingStep& s) { s.set_drafts(-1); }));
  cases.emplace_back("a grammar's mask that is not one per row", with_step([](SamplingStep& s) {
    s.set_drafts(1);
    s.set_allowed_count(9);
    s.set_allowed(std::string(2, '\xff'));
  }));
  EXPECT_EQ(malformed(with_step([](SamplingStep& s) {
              s.set_drafts(1);
              s.set_allowed_count(16);
              s.set_allowed(std::string(2, '\xff'));
            })),
            "")
      << "a mask for each of two rows";
  r = start_sequence(1);
  r.mutable_sequences(0)->set_rewind(true);
  cases.emplace_back("a rewind of a first batch", r);
  r = start_sequence(1);
  r.mutable_sequences(0)->set_first_position(3);
  r.mutable_sequences(0)->set_rewind(true);
  cases.emplace_back("a rewind of a sequence the stage does not hold", r);
  r = start_sequence(1);
  r.mutable_sequences(0)->set_output(static_cast<SequenceOutput>(7));
  cases.emplace_back("an output that does not exist", r);
  for (const auto& [name, request] : cases) {
    EXPECT_EQ(forward(request, key_).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
  }
  EXPECT_TRUE(forward(start_sequence(9), key_).ok());
}

// What the pipeline sends and gets: every field of a batch, its sampling steps included (the
// grammar's flags as bits), and of an output, the same after the wire.
TEST(StageMessages, ABatchAndItsOutputComeBackTheSame) {
  engine::StageBatch batch;
  sampling::SamplingStep step;
  step.params = {0.7f, 12, 0.9f, 0.02f, 1.1f, 0.3f, -0.2f, 6, 77};
  step.random = {1, 0xFFFFFFFFFFFFFFFFull, 3, 1ull << 63};
  step.recent = {5, 9, 5};
  step.allowed = {1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1};  // 11 flags: a partial last byte
  step.top_logprobs = 3;
  batch.sequences.push_back({4, 0, 2, 16, engine::SequenceWork::Output::Logits, step});
  batch.sequences.push_back({5, 16, 1, 32, engine::SequenceWork::Output::Embeddings, std::nullopt});
  batch.sequences.push_back({6, 0, 3, 64, engine::SequenceWork::Output::Nothing, std::nullopt});
  batch.tokens = {1, 2, 3, 4, 5, 6};
  batch.hidden = std::vector<float>(6 * 4, 0.25f);
  batch.hidden[7] = -1e-30f;
  ForwardRequest request;
  request.set_sender_id("client");
  to_message(batch, request);
  ASSERT_EQ(malformed(request), "");
  EXPECT_EQ(request.sequences(0).sampling().allowed().size(), 2u) << "a bit per flag";
  const engine::StageBatch back = from_message(request);
  ASSERT_EQ(back.sequences.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const engine::SequenceWork& a = batch.sequences[i];
    const engine::SequenceWork& b = back.sequences[i];
    EXPECT_EQ(std::tie(a.id, a.first_position, a.token_count, a.capacity, a.output),
              std::tie(b.id, b.first_position, b.token_count, b.capacity, b.output));
    EXPECT_EQ(a.sampling.has_value(), b.sampling.has_value());
  }
  const sampling::SamplingStep& got = *back.sequences[0].sampling;
  const auto params = [](const sampling::SamplingParams& p) {
    return std::tie(p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty,
                    p.frequency_penalty, p.penalty_last_n, p.seed);
  };
  EXPECT_EQ(params(got.params), params(step.params));
  EXPECT_EQ(got.random, step.random);
  EXPECT_EQ(got.recent, step.recent);
  EXPECT_EQ(got.allowed, step.allowed);
  EXPECT_EQ(got.top_logprobs, step.top_logprobs);
  EXPECT_EQ(back.tokens, batch.tokens);
  EXPECT_EQ(std::memcmp(back.hidden.data(), batch.hidden.data(), batch.hidden.size() * sizeof(float)), 0);

  engine::StageOutput output{{1.5f, -2.0f}, {{{7, -0.5f, {{7, -0.5f}, {3, -1.25f}}}, ""}, {{}, "sampling failed: NaN"}}};
  ForwardReply reply;
  to_message(output, reply);
  ASSERT_EQ(malformed(reply), "");
  const engine::StageOutput output_back = from_message(reply);
  EXPECT_EQ(output_back.rows, output.rows);
  ASSERT_EQ(output_back.sampled.size(), 2u);
  EXPECT_EQ(output_back.sampled[0].choice.token, 7);
  EXPECT_EQ(output_back.sampled[0].choice.logprob, -0.5f);
  EXPECT_EQ(output_back.sampled[0].choice.top, output.sampled[0].choice.top);
  EXPECT_EQ(output_back.sampled[1].error, output.sampled[1].error);
  reply.mutable_sampled(0)->set_token(-1);
  EXPECT_NE(malformed(reply), "");
  reply.mutable_sampled(0)->set_token(7);
  reply.set_rows("abc");
  EXPECT_NE(malformed(reply), "");
}

// Speculative decoding's fields: a step's drafts, a rewind, and the choices after confirmed
// drafts come back the same; choices that are not tokens are refused.
TEST(StageMessages, DraftsRewindsAndContinuedChoicesComeBackTheSame) {
  engine::StageBatch batch;
  sampling::SamplingStep step;
  step.random = {1, 2, 3, 4};
  step.drafts = 3;
  batch.sequences.push_back({4, 17, 4, 64, engine::SequenceWork::Output::Logits, step, /*rewind=*/true});
  batch.sequences.push_back({5, 16, 1, 32, engine::SequenceWork::Output::Logits, std::nullopt});
  batch.tokens = {1, 2, 3, 4, 5};
  ForwardRequest request;
  request.set_sender_id("client");
  to_message(batch, request);
  ASSERT_EQ(malformed(request), "");
  const engine::StageBatch back = from_message(request);
  ASSERT_EQ(back.sequences.size(), 2u);
  EXPECT_TRUE(back.sequences[0].rewind);
  EXPECT_FALSE(back.sequences[1].rewind);
  EXPECT_EQ(back.sequences[0].sampling->drafts, 3);

  engine::StageOutput output;
  engine::Sampled& sampled = output.sampled.emplace_back();
  sampled.choice = {2, -0.5f, {{2, -0.5f}}};
  sampled.continued = {{3, -0.25f, {{3, -0.25f}, {9, -2.0f}}}, {11, -1.5f, {}}};
  ForwardReply reply;
  to_message(output, reply);
  ASSERT_EQ(malformed(reply), "");
  const engine::StageOutput output_back = from_message(reply);
  ASSERT_EQ(output_back.sampled.size(), 1u);
  ASSERT_EQ(output_back.sampled[0].continued.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(output_back.sampled[0].continued[i].token, sampled.continued[i].token);
    EXPECT_EQ(output_back.sampled[0].continued[i].logprob, sampled.continued[i].logprob);
    EXPECT_EQ(output_back.sampled[0].continued[i].top, sampled.continued[i].top);
  }
  reply.mutable_sampled(0)->mutable_continued(1)->set_token(-2);
  EXPECT_NE(malformed(reply).find("sampled[0].continued[1].token"), std::string::npos) << malformed(reply);
  reply.mutable_sampled(0)->mutable_continued(1)->set_token(11);
  reply.mutable_sampled(0)->mutable_continued(0)->mutable_top(1)->set_token(-1);
  EXPECT_NE(malformed(reply).find("continued[0].top[1].token"), std::string::npos) << malformed(reply);
  reply.mutable_sampled(0)->mutable_continued(0)->mutable_top(1)->set_token(9);
  for (int i = 0; i < 300; ++i) reply.mutable_sampled(0)->add_continued()->set_token(1);
  EXPECT_NE(malformed(reply).find("continued"), std::string::npos) << "more choices than a step has drafts";
}

// The stage that holds the head, on another node, checks a step's drafts from the logits of
// every input and sends back the choices one at a time would make; the next batch drops the
// drafts it did not confirm.
TEST_F(NodeServiceTest, TheStageThatHoldsTheHeadChecksDraftsAndTheNextBatchRewinds) {
  const auto key = std::make_shared<ClusterKey>("secret");
  RemoteStage remote("server", make_channel(address(), *key), Caller{"client", kEpoch, key});
  tensor::ThreadPool pool(1);
  engine::LocalStage local(model::Model::load(std::shared_ptr<const gguf::File>(gguf::File::open(kDreams))), pool,
                           engine::KvOptions{model::KvType::F32, {64}});
  const std::vector<engine::Token> prompt{1, 300, 42, 7, 300, 42};
  // One at a time, greedy, from the local stage's logits: the tokens that follow the prompt.
  sampling::SamplingParams greedy;
  greedy.temperature = 0;
  engine::StageBatch plain;
  plain.sequences.push_back({1, 0, 6, 32});
  plain.tokens = prompt;
  std::vector<engine::Token> next;
  for (int i = 0; i < 4; ++i) {
    const std::vector<float> logits = local.forward(plain).rows;
    next.push_back(static_cast<engine::Token>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    plain.sequences[0] = {1, 6 + i, 1, 32};
    plain.tokens = {next.back()};
  }
  // The remote stage: the prompt, then its last token with drafts of which the second is wrong.
  engine::StageBatch batch;
  batch.sequences.push_back({2, 0, 6, 32});
  batch.sequences[0].sampling = sampling::Sampler(greedy, 512).step(prompt, {}, 1);
  batch.tokens = prompt;
  engine::StageOutput out = remote.forward(batch);
  ASSERT_EQ(out.sampled.size(), 1u);
  ASSERT_EQ(out.sampled[0].choice.token, next[0]);
  std::vector<engine::Token> history = prompt;
  history.push_back(next[0]);
  batch.sequences[0] = {2, 6, 4, 32};
  batch.sequences[0].sampling = sampling::Sampler(greedy, 512).step(history, {}, 1);
  batch.sequences[0].sampling->drafts = 3;
  batch.tokens = {next[0], next[1], (next[2] + 1) % 512, 5};
  out = remote.forward(batch);
  ASSERT_EQ(out.sampled.size(), 1u);
  ASSERT_EQ(out.sampled[0].error, "");
  EXPECT_EQ(out.sampled[0].choice.token, next[1]);
  ASSERT_EQ(out.sampled[0].continued.size(), 1u) << "the first draft confirmed, the second not";
  EXPECT_EQ(out.sampled[0].continued[0].token, next[2]);
  EXPECT_TRUE(out.rows.empty());
  // The stage holds 10 positions, of which 8 stand: the next batch goes back to them.
  batch.sequences[0] = {2, 8, 1, 32};
  batch.sequences[0].sampling = sampling::Sampler(greedy, 512).step(history, {}, 1);
  batch.tokens = {next[2]};
  EXPECT_THROW(remote.forward(batch), std::exception) << "a batch that does not say it goes back";
  RemoteStage again("server", make_channel(address(), *key), Caller{"client", kEpoch, key});
  batch.sequences[0].rewind = true;
  out = again.forward(batch);
  ASSERT_EQ(out.sampled.size(), 1u);
  EXPECT_EQ(out.sampled[0].choice.token, next[3]);
}

// The stage that holds the head chooses the tokens, with the steps it is sent, and sends back
// only them: the same tokens and logprobs as choosing from the logits it computed.
TEST_F(NodeServiceTest, TheStageThatHoldsTheHeadSendsTokensNotLogits) {
  const auto key = std::make_shared<ClusterKey>("secret");
  RemoteStage remote("server", make_channel(address(), *key), Caller{"client", kEpoch, key});
  tensor::ThreadPool pool(1);
  engine::LocalStage local(model::Model::load(std::shared_ptr<const gguf::File>(gguf::File::open(kDreams))), pool,
                           engine::KvOptions{model::KvType::F32, {64}});
  sampling::SamplingParams seeded;
  seeded.seed = 3;
  seeded.repetition_penalty = 1.2f;
  sampling::SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<uint8_t> allowed(512, 0);
  for (int t = 100; t < 140; ++t) allowed[static_cast<size_t>(t)] = 1;
  const std::vector<engine::Token> prompt{1, 300, 42, 7};
  engine::StageBatch plain;
  plain.sequences.push_back({1, 0, 4, 16});
  plain.sequences.push_back({2, 0, 4, 16});
  plain.tokens = prompt;
  plain.tokens.insert(plain.tokens.end(), prompt.begin(), prompt.end());
  engine::StageBatch choosing = plain;
  choosing.sequences[0].sampling = sampling::Sampler(seeded, 512).step(prompt, {}, 2);
  choosing.sequences[1].sampling = sampling::Sampler(greedy, 512).step(prompt, allowed, -1);
  const std::vector<float> logits = local.forward(plain).rows;
  ASSERT_EQ(logits.size(), 2u * 512);
  const engine::StageOutput out = remote.forward(choosing);
  EXPECT_TRUE(out.rows.empty()) << "no logits come back";
  ASSERT_EQ(out.sampled.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(out.sampled[i].error, "");
    const sampling::Choice expected =
        sampling::choose(*choosing.sequences[i].sampling, std::span<const float>(logits).subspan(i * 512, 512));
    EXPECT_EQ(out.sampled[i].choice.token, expected.token);
    EXPECT_EQ(out.sampled[i].choice.logprob, expected.logprob);
    EXPECT_EQ(out.sampled[i].choice.top, expected.top);
  }
  EXPECT_GE(out.sampled[1].choice.token, 100);
  EXPECT_LT(out.sampled[1].choice.token, 140) << "the grammar's flags held";
  EXPECT_EQ(out.sampled[0].choice.top.size(), 2u);
}

TEST_F(NodeServiceTest, HoldsACachedPrefixForANewSequence) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + i * 7 % 500);
  ForwardRequest first = start_sequence(1);
  first.mutable_sequences(0)->set_token_count(40);
  first.mutable_sequences(0)->set_capacity(64);
  first.mutable_tokens()->Assign(prompt.begin(), prompt.end());
  ASSERT_TRUE(forward(first, key_).ok());

  const auto hold = [&](uint64_t id, int tokens, HoldPrefixReply& reply, int capacity = 64) {
    HoldPrefixRequest request;
    request.set_sender_id("client");
    request.set_epoch(kEpoch);
    request.set_sequence_id(id);
    request.set_capacity(capacity);
    request.mutable_tokens()->Add(prompt.begin(), prompt.begin() + tokens);
    grpc::ClientContext context;
    key_.sign(context, "client", "HoldPrefix");
    return stub_->HoldPrefix(&context, request, &reply);
  };
  HoldPrefixReply reply;
  ASSERT_TRUE(hold(2, 32, reply).ok());
  EXPECT_EQ(reply.positions(), 32);
  EXPECT_EQ(reply.pool_blocks(), 64);
  EXPECT_EQ(node_.held(), 2u);
  // Its first batch continues after one of the two blocks: the stage lets the other go.
  ForwardRequest rest = start_sequence(2);
  rest.mutable_sequences(0)->set_first_position(16);
  rest.mutable_sequences(0)->set_token_count(24);
  rest.mutable_sequences(0)->set_capacity(64);
  rest.mutable_tokens()->Assign(prompt.begin() + 16, prompt.end());
  EXPECT_TRUE(forward(rest, key_).ok());
  EXPECT_EQ(hold(2, 32, reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "started twice";
  EXPECT_EQ(hold(3, 40, reply, 40).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "past its capacity";
}

// A replaced pipeline's stage still lets go of the sequences released on it, without waiting
// for the node's reply; a stage that runs waits for it.
TEST_F(NodeServiceTest, AStageStillReleasesAfterItsPipelineWasReplaced) {
  RemoteStage stage("server", make_channel(address(), key_),
                    Caller{"client", kEpoch, std::make_shared<ClusterKey>("secret")});
  for (uint64_t id : {7, 8}) ASSERT_TRUE(forward(start_sequence(id), key_).ok());
  ASSERT_EQ(node_.held(), 2u);
  const engine::SequenceId first[] = {7};
  stage.release(first);
  EXPECT_EQ(node_.held(), 1u);
  stage.cancel();
  const engine::SequenceId second[] = {8};
  stage.release(second);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (node_.held() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(node_.held(), 0u);
  RemoteStage::wait_for_releases(std::chrono::seconds(5));  // the reply, before the server goes
}

// A port that takes connections and never answers: a node that hangs.
class SilentPort {
 public:
  SilentPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 || ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw std::runtime_error("cannot listen on 127.0.0.1");
    }
    port_ = ntohs(address.sin_port);
  }
  ~SilentPort() { ::close(fd_); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_;
  int port_ = 0;
};

// Releasing on a node that hangs: a replaced pipeline's stage does not wait for it, and a
// release under way when the stage is cancelled ends then, not at its deadline.
TEST(RemoteStageRelease, NeverWaitsForAHangingNodeOnceCancelled) {
  SilentPort silent;
  const auto key = std::make_shared<ClusterKey>("secret");
  const engine::SequenceId ids[] = {7};
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  {
    RemoteStage stage("silent", make_channel(silent.address(), *key), Caller{"client", kEpoch, key},
                      {}, std::chrono::seconds(2));
    stage.cancel();
    const auto started = std::chrono::steady_clock::now();
    stage.release(ids);
    EXPECT_LT(seconds_since(started), 1.0) << "it waited for the hanging node";
  }
  RemoteStage::wait_for_releases(std::chrono::seconds(5));  // ends at its 2 s deadline
  RemoteStage stage("silent", make_channel(silent.address(), *key), Caller{"client", kEpoch, key},
                    {}, std::chrono::seconds(30));
  const auto started = std::chrono::steady_clock::now();
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stage.cancel();
  });
  EXPECT_THROW(stage.release(ids), std::runtime_error);
  canceller.join();
  EXPECT_LT(seconds_since(started), 5.0) << "the release under way waited for its 30 s deadline";
}

TEST_F(NodeServiceTest, RefusesAnOversizedMessage) {
  ForwardRequest r = start_sequence(1);
  r.clear_tokens();
  r.set_hidden(std::string(size_t{65} << 20, '\0'));
  // A sender without the client-side limit, so that the server's own limit is what refuses.
  grpc::ChannelArguments unlimited;
  unlimited.SetMaxSendMessageSize(-1);
  unlimited.SetSslTargetNameOverride(kNodeCertificateName);
  auto stub = Node::NewStub(grpc::CreateCustomChannel(address(), key_.links().channel_credentials(), unlimited));
  grpc::ClientContext context;
  key_.sign(context, "client", "Forward");
  EXPECT_EQ(forward_on(*stub, context, r, nullptr).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(forward(start_sequence(2), key_).ok());
}

// A sequence's state read from a stage and written back to another sequence id gives the
// same state; handed-over state that is malformed, unsigned or of another epoch is refused.
TEST_F(NodeServiceTest, HandsOverStateAndRefusesMalformedState) {
  ASSERT_TRUE(forward(start_sequence(1), key_).ok());
  const auto read = [&](uint64_t id, int layer, const ClusterKey& key, LayerKv* kv) {
    ReadKvRequest request;
    request.set_sender_id("client");
    request.set_epoch(kEpoch);
    request.set_sequence_id(id);
    request.set_layer(layer);
    grpc::ClientContext context;
    key.sign(context, "client", "ReadKv");
    return stub_->ReadKv(&context, request, kv);
  };
  const auto write = [&](const LayerKv& kv, uint64_t epoch) {
    WriteKvRequest request;
    request.set_sender_id("client");
    request.set_epoch(epoch);
    *request.mutable_kv() = kv;
    grpc::ClientContext context;
    key_.sign(context, "client", "WriteKv");
    WriteKvReply reply;
    return stub_->WriteKv(&context, request, &reply);
  };
  LayerKv kv;
  ASSERT_TRUE(read(1, 2, key_, &kv).ok());
  EXPECT_EQ(kv.positions(), 2);
  EXPECT_EQ(kv.tokens_size(), 2) << "the inputs' ids travel with their state";
  EXPECT_EQ(read(1, 2, ClusterKey("wrong"), &kv).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(read(7, 2, key_, &kv).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "an unknown sequence";
  ASSERT_TRUE(read(1, 2, key_, &kv).ok());
  kv.set_sequence_id(2);
  EXPECT_EQ(write(kv, kEpoch + 1).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  LayerKv torn = kv;
  torn.mutable_values()->resize(kv.values().size() - 4);
  EXPECT_EQ(write(torn, kEpoch).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  LayerKv too_long = kv;
  too_long.set_positions(3);
  EXPECT_EQ(write(too_long, kEpoch).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  LayerKv ids_short = kv;
  ids_short.mutable_tokens()->RemoveLast();
  EXPECT_EQ(write(ids_short, kEpoch).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  LayerKv window_past_end = kv;  // rows of a window that starts after the positions end
  window_past_end.set_first_position(16);
  EXPECT_EQ(write(window_past_end, kEpoch).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  LayerKv window_in_a_block = kv;  // a window starts at a block's first position
  window_in_a_block.set_first_position(1);
  window_in_a_block.set_keys(kv.keys().substr(kv.keys().size() / 2));
  window_in_a_block.set_values(kv.values().substr(kv.values().size() / 2));
  EXPECT_EQ(write(window_in_a_block, kEpoch).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(write(kv, kEpoch).ok());
  LayerKv copied;
  ASSERT_TRUE(read(2, 2, key_, &copied).ok());
  EXPECT_EQ(copied.keys(), kv.keys());
  EXPECT_EQ(copied.values(), kv.values());
  EXPECT_TRUE(std::equal(copied.tokens().begin(), copied.tokens().end(), kv.tokens().begin(), kv.tokens().end()));
  EXPECT_EQ(node_.held(), 2u);
}

// Rows of an f16 pool travel as half floats, in half the bytes, those of an f32 pool as floats;
// either way the same bits arrive. A sliding-window layer's rows start where its window does.
TEST(LayerKvMessage, TravelsInThePoolsElementTypeBitForBit) {
  for (const model::KvType type : {model::KvType::F16, model::KvType::F32}) {
    const size_t element = model::kv_element_bytes(type);
    engine::LayerKv kv{7, 3, 18, 32, 16, {type, {}}, {type, {}}, std::vector<engine::Token>(18, 1)};
    for (size_t i = 0; i < 4 * element; ++i) {  // 2 positions of a kv_dim of 2
      kv.keys.bytes.push_back(static_cast<uint8_t>(i * 37 + 1));
      kv.values.bytes.push_back(static_cast<uint8_t>(i * 11 + 5));
    }
    LayerKv message;
    to_message(kv, message);
    EXPECT_EQ(message.half(), type == model::KvType::F16);
    EXPECT_EQ(message.keys().size(), 4 * element);
    EXPECT_EQ(malformed(message), "");
    const engine::LayerKv back = from_message(message);
    EXPECT_EQ(back.keys.type, type);
    EXPECT_EQ(back.keys.bytes, kv.keys.bytes);
    EXPECT_EQ(back.values.type, type);
    EXPECT_EQ(back.values.bytes, kv.values.bytes);
    EXPECT_EQ(back.tokens, kv.tokens);
    EXPECT_EQ(back.first_position, 16);
    EXPECT_EQ(back.positions, 18);
  }
}

// A request that entered at another node, whose client leaves while no token comes: the
// leader hears of it within a fraction of a second, not at the request's next token.
TEST_F(NodeServiceTest, ARemoteRequestCancelledWhileNoTokenComesEndsAtTheLeader) {
  auto scheduler = std::make_shared<SilentScheduler>();
  node_.lead(scheduler);
  std::atomic<bool> gone{false};
  std::promise<engine::FinishReason> finished;
  engine::RequestCallbacks callbacks;
  callbacks.on_token = [](const engine::GeneratedToken&) { return true; };
  callbacks.on_finish = [&finished](engine::FinishReason reason, const std::string&) { finished.set_value(reason); };
  callbacks.cancelled = [&gone] { return gone.load(); };
  engine::GenerationRequest request;
  request.prompt = {1, 300};
  request.max_tokens = 8;
  RemoteGenerator generator(Caller{"client", kEpoch, std::make_shared<ClusterKey>("secret")});  // ends first
  ASSERT_TRUE(generator.submit(PeerChannel::to(address(), key_), request, callbacks));
  EXPECT_FALSE(scheduler->cancelled_within(std::chrono::milliseconds(300))) << "cancelled before its client left";
  gone = true;
  EXPECT_TRUE(scheduler->cancelled_within(std::chrono::seconds(10))) << "the leader was not told";
  auto reason = finished.get_future();
  ASSERT_EQ(reason.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(reason.get(), engine::FinishReason::Cancelled);
}

// A scheduler that starts every request it is given at once, with one token.
class OneTokenScheduler final : public engine::Generator {
 public:
  engine::ModelLimits limits() const override { return {128, 1, 1}; }
  bool submit(engine::GenerationRequest, engine::RequestCallbacks callbacks) override {
    callbacks.on_started();
    callbacks.on_token(engine::GeneratedToken{});
    callbacks.on_finish(engine::FinishReason::Length, {});
    return true;
  }
  void shutdown() override {}
};

TEST_F(NodeServiceTest, ARelayedRequestHearsWhenTheLeaderStartsIt) {
  node_.lead(std::make_shared<OneTokenScheduler>());
  std::mutex mutex;
  std::vector<std::string> heard;
  std::promise<void> finished;
  engine::RequestCallbacks callbacks;
  const auto hear = [&](const char* what) {
    std::lock_guard lock(mutex);
    heard.emplace_back(what);
  };
  callbacks.on_started = [&] { hear("started"); };
  callbacks.on_token = [&](const engine::GeneratedToken&) {
    hear("token");
    return true;
  };
  callbacks.on_finish = [&](engine::FinishReason, const std::string&) {
    hear("finished");
    finished.set_value();
  };
  engine::GenerationRequest request;
  request.prompt = {1, 300};
  request.max_tokens = 1;
  RemoteGenerator generator(Caller{"client", kEpoch, std::make_shared<ClusterKey>("secret")});
  ASSERT_TRUE(generator.submit(PeerChannel::to(address(), key_), request, callbacks));
  ASSERT_EQ(finished.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  std::lock_guard lock(mutex);
  EXPECT_EQ(heard, (std::vector<std::string>{"started", "token", "finished"}));
}

// What one link carried, as one end counts it (rpc/link_metrics.h).
struct LinkCount {
  double sent_bytes, sent_messages, received_bytes, received_messages;
  static LinkCount of(const std::string& peer, const std::string& method) {
    metrics::Registry& r = metrics::process_registry();
    const metrics::Labels labels{{"peer", peer}, {"rpc", method}};
    return {r.counter("strata_link_sent_bytes_total", "", labels).value(),
            r.counter("strata_link_sent_messages_total", "", labels).value(),
            r.counter("strata_link_received_bytes_total", "", labels).value(),
            r.counter("strata_link_received_messages_total", "", labels).value()};
  }
  LinkCount operator-(const LinkCount& o) const {
    return {sent_bytes - o.sent_bytes, sent_messages - o.sent_messages, received_bytes - o.received_bytes,
            received_messages - o.received_messages};
  }
};

// The caller ("client") and the server ("server") are both this process: each end counts under
// the other's name, and what one sent the other received.
TEST_F(NodeServiceTest, BothEndsOfALinkCountItsBytesAndMessagesEachWay) {
  const LinkCount caller_before = LinkCount::of("server", "Forward");
  const LinkCount server_before = LinkCount::of("client", "Forward");
  const ForwardRequest request = start_sequence(1);
  ForwardReply reply;
  ASSERT_TRUE(forward(request, key_, &reply).ok());
  const LinkCount caller = LinkCount::of("server", "Forward") - caller_before;
  const LinkCount server = LinkCount::of("client", "Forward") - server_before;
  EXPECT_EQ(caller.sent_messages, 1);
  EXPECT_EQ(caller.sent_bytes, static_cast<double>(request.ByteSizeLong()));
  EXPECT_EQ(caller.received_messages, 1);
  EXPECT_EQ(caller.received_bytes, static_cast<double>(reply.ByteSizeLong()));
  EXPECT_EQ(server.received_messages, caller.sent_messages);
  EXPECT_EQ(server.received_bytes, caller.sent_bytes);
  EXPECT_EQ(server.sent_messages, caller.received_messages);
  EXPECT_EQ(server.sent_bytes, caller.received_bytes);

  const LinkCount fetch_before = LinkCount::of("server", "FetchTensor");
  metrics::Counter& weights_sent = metrics::process_registry().counter("strata_weights_sent_bytes_total", "");
  const double weights_before = weights_sent.value();
  const Fetched fetched = fetch(0);
  ASSERT_TRUE(fetched.status.ok());
  const LinkCount fetch = LinkCount::of("server", "FetchTensor") - fetch_before;
  EXPECT_EQ(fetch.received_messages, fetched.chunks);
  EXPECT_GT(fetch.received_bytes, static_cast<double>(fetched.bytes.size()));  // the chunks' offsets besides
  EXPECT_EQ(weights_sent.value() - weights_before, static_cast<double>(node_.tensor_bytes().size()));
}

// A request the leader's scheduler lost (the leader no longer leads) is Lost at the node it
// entered at too, which resumes it at the next leader: a typed outcome, not an error's text.
TEST_F(NodeServiceTest, ARequestTheLeaderLostIsLostAtItsEntryNode) {
  node_.lead(std::make_shared<CountingScheduler>(engine::FinishReason::Lost, "it no longer leads"));
  std::promise<std::pair<engine::FinishReason, std::string>> finished;
  engine::RequestCallbacks callbacks;
  callbacks.on_token = [](const engine::GeneratedToken&) { return true; };
  callbacks.on_finish = [&finished](engine::FinishReason reason, const std::string& error) {
    finished.set_value({reason, error});
  };
  engine::GenerationRequest request;
  request.prompt = {1, 300};
  request.max_tokens = 8;
  RemoteGenerator generator(Caller{"client", kEpoch, std::make_shared<ClusterKey>("secret")});  // ends first
  ASSERT_TRUE(generator.submit(PeerChannel::to(address(), key_), request, callbacks));
  auto ending = finished.get_future();
  ASSERT_EQ(ending.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  const auto [reason, error] = ending.get();
  EXPECT_EQ(reason, engine::FinishReason::Lost);
  EXPECT_EQ(error, "it no longer leads");
}

TEST_F(NodeServiceTest, GenerateNeedsTheLeader) {
  grpc::ClientContext context;
  key_.sign(context, "client", "Generate");
  auto reader = stub_->Generate(&context, valid_generate());
  GenerateEvent event;
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// A relayed request is checked as the API checks its JSON: each field out of its range is
// refused, naming the field, before the scheduler sees anything.
TEST_F(NodeServiceTest, RefusesARelayedRequestWithAFieldOutOfRange) {
  auto scheduler = std::make_shared<CountingScheduler>();
  node_.lead(scheduler);
  ASSERT_TRUE(generate(valid_generate()).ok());
  ASSERT_EQ(scheduler->submitted, 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<std::string, std::function<void(GenerateRequest&)>>> cases = {
      {"sender_id", [](GenerateRequest& r) { r.clear_sender_id(); }},
      {"prompt", [](GenerateRequest& r) { r.clear_prompt(); }},
      {"prompt[1]", [](GenerateRequest& r) { r.set_prompt(1, -5); }},
      {"max_tokens", [](GenerateRequest& r) { r.set_max_tokens(0); }},
      {"sampling.temperature", [nan](GenerateRequest& r) { r.mutable_sampling()->set_temperature(nan); }},
      {"sampling.temperature", [](GenerateRequest& r) { r.mutable_sampling()->set_temperature(2.5f); }},
      {"sampling.top_k", [](GenerateRequest& r) { r.mutable_sampling()->set_top_k(-1); }},
      {"sampling.top_p", [](GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); }},
      {"sampling.top_p", [nan](GenerateRequest& r) { r.mutable_sampling()->set_top_p(nan); }},
      {"sampling.min_p", [](GenerateRequest& r) { r.mutable_sampling()->set_min_p(-0.1f); }},
      {"sampling.repetition_penalty", [](GenerateRequest& r) { r.mutable_sampling()->set_repetition_penalty(0); }},
      {"sampling.presence_penalty", [](GenerateRequest& r) { r.mutable_sampling()->set_presence_penalty(3); }},
      {"sampling.frequency_penalty", [](GenerateRequest& r) { r.mutable_sampling()->set_frequency_penalty(-2.5f); }},
      {"sampling.penalty_last_n", [](GenerateRequest& r) { r.mutable_sampling()->set_penalty_last_n(-2); }},
      {"top_logprobs", [](GenerateRequest& r) { r.set_top_logprobs(21); }},
      {"top_logprobs", [](GenerateRequest& r) { r.set_top_logprobs(-1); }},
      {"resumed_after", [](GenerateRequest& r) { r.set_resumed_after(2); }},
      {"held.positions", [](GenerateRequest& r) { r.mutable_held()->set_positions(-1); }},
      {"request_id", [](GenerateRequest& r) { r.set_request_id(std::string(2000, 'x')); }},
  };
  for (const auto& [field, spoil] : cases) {
    GenerateRequest request = valid_generate();
    spoil(request);
    const grpc::Status status = generate(request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(status.error_message().find("'" + field + "'"), std::string::npos) << field << ": " << status.error_message();
  }
  EXPECT_EQ(scheduler->submitted, 1) << "the scheduler was given a malformed request";
}

// Every other call is checked the same way, before the node acts on it.
TEST_F(NodeServiceTest, RefusesEveryKindOfCallWithAFieldOutOfRange) {
  const auto call = [this](const char* method, auto invoke) {
    grpc::ClientContext context;
    key_.sign(context, "client", method);
    return invoke(context);
  };
  const auto hello = [&](const std::function<void(HelloRequest&)>& spoil) {
    HelloRequest request;
    NodeInfo& sender = *request.mutable_sender();
    sender.set_node_id("client");
    sender.set_node_address("127.0.0.1:9001");
    sender.set_api_address("127.0.0.1:9000");
    sender.set_model_hash(kModelHash);
    sender.set_protocol_version(kProtocolVersion);
    sender.set_state("starting");
    sender.set_weight_bytes_per_second(1e9);
    Placement& placement = *request.mutable_placement();
    placement.set_epoch(kEpoch);
    placement.set_leader_id("client");
    placement.set_strategy("speed");
    for (const auto& [id, first, last] : {std::tuple("client", 0, 2), std::tuple("server", 2, 4)}) {
      Stage& stage = *placement.add_stages();
      stage.set_node_id(id);
      stage.set_node_address("127.0.0.1:9001");
      stage.set_first_layer(first);
      stage.set_last_layer(last);
    }
    spoil(request);
    return call("Hello", [&](grpc::ClientContext& context) {
      HelloReply reply;
      return stub_->Hello(&context, request, &reply);
    });
  };
  const std::vector<std::tuple<std::string, std::function<grpc::Status()>>> cases = {
      {"", [&] { return hello([](HelloRequest&) {}); }},
      {"sender.node_id", [&] { return hello([](HelloRequest& r) { r.mutable_sender()->clear_node_id(); }); }},
      {"sender.node_address",
       [&] { return hello([](HelloRequest& r) { r.mutable_sender()->set_node_address("127.0.0.1"); }); }},
      {"sender.weight_bytes_per_second", [&] {
         return hello([](HelloRequest& r) {
           r.mutable_sender()->set_weight_bytes_per_second(std::numeric_limits<double>::quiet_NaN());
         });
       }},
      {"sender.state", [&] { return hello([](HelloRequest& r) { r.mutable_sender()->set_state("dancing"); }); }},
      {"sender.load_progress", [&] { return hello([](HelloRequest& r) { r.mutable_sender()->set_load_progress(2); }); }},
      {"sender.kv_cache.window.used_blocks", [&] {
         return hello([](HelloRequest& r) {
           KvCacheStats& kv = *r.mutable_sender()->mutable_kv_cache();
           kv.set_type("f16");
           kv.mutable_window()->set_type("f16");
           kv.mutable_window()->set_pool_blocks(4);
           kv.mutable_window()->set_used_blocks(5);
         });
       }},
      {"sender.links[0].bytes_per_second", [&] {
         return hello([](HelloRequest& r) {
           LinkMeasure& link = *r.mutable_sender()->add_links();
           link.set_peer_id("b");
           link.set_latency_seconds(1e-4);
         });
       }},
      {"sender.links[0].latency_seconds", [&] {
         return hello([](HelloRequest& r) {
           LinkMeasure& link = *r.mutable_sender()->add_links();
           link.set_peer_id("b");
           link.set_latency_seconds(-1);
           link.set_bytes_per_second(1e8);
         });
       }},
      {"known[0].model_hash", [&] {
         return hello([](HelloRequest& r) {
           *r.add_known() = r.sender();
           r.mutable_known(0)->set_model_hash("cafe");
         });
       }},
      {"placement.stages[1].first_layer",
       [&] { return hello([](HelloRequest& r) { r.mutable_placement()->mutable_stages(1)->set_first_layer(1); }); }},
      {"placement.stages[1].node_id",
       [&] { return hello([](HelloRequest& r) { r.mutable_placement()->mutable_stages(1)->set_node_id("client"); }); }},
      {"placement.strategy",
       [&] { return hello([](HelloRequest& r) { r.mutable_placement()->set_strategy("luck"); }); }},
      {"sender_id", [&] {
         return call("Release", [&](grpc::ClientContext& context) {
           ReleaseRequest request;
           request.set_epoch(kEpoch);
           ReleaseReply reply;
           return stub_->Release(&context, request, &reply);
         });
       }},
      {"tokens[0]", [&] {
         return call("HoldPrefix", [&](grpc::ClientContext& context) {
           HoldPrefixRequest request;
           request.set_sender_id("client");
           request.set_epoch(kEpoch);
           request.set_sequence_id(3);
           request.set_capacity(64);
           request.add_tokens(-1);
           HoldPrefixReply reply;
           return stub_->HoldPrefix(&context, request, &reply);
         });
       }},
      {"layer", [&] {
         return call("ReadKv", [&](grpc::ClientContext& context) {
           ReadKvRequest request;
           request.set_sender_id("client");
           request.set_epoch(kEpoch);
           request.set_sequence_id(1);
           request.set_layer(-1);
           LayerKv reply;
           return stub_->ReadKv(&context, request, &reply);
         });
       }},
      {"kv.tokens[0]", [&] {
         return call("WriteKv", [&](grpc::ClientContext& context) {
           WriteKvRequest request;
           request.set_sender_id("client");
           request.set_epoch(kEpoch);
           request.mutable_kv()->set_sequence_id(2);
           request.mutable_kv()->set_positions(1);
           request.mutable_kv()->set_capacity(16);
           request.mutable_kv()->set_keys(std::string(8, '\0'));
           request.mutable_kv()->set_values(std::string(8, '\0'));
           request.mutable_kv()->add_tokens(-7);
           WriteKvReply reply;
           return stub_->WriteKv(&context, request, &reply);
         });
       }},
      {"model_hash", [&] {
         return call("ModelManifest", [&](grpc::ClientContext& context) {
           ModelManifestRequest request;
           request.set_model_hash("not a hash");
           ModelManifestReply reply;
           return stub_->ModelManifest(&context, request, &reply);
         });
       }},
      {"model_hash", [&] {
         return call("FetchTensor", [&](grpc::ClientContext& context) {
           auto reader = stub_->FetchTensor(&context, FetchTensorRequest());
           TensorChunk chunk;
           while (reader->Read(&chunk)) {
           }
           return reader->Finish();
         });
       }},
  };
  for (const auto& [field, invoke] : cases) {
    const grpc::Status status = invoke();
    if (field.empty()) {
      EXPECT_TRUE(status.ok()) << "a well-formed Hello: " << status.error_message();
      continue;
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field << ": " << status.error_message();
    EXPECT_NE(status.error_message().find("'" + field + "'"), std::string::npos) << field << ": " << status.error_message();
  }
}

// What real nodes send passes: every state a node can say it is in (one refused among them),
// a Hello reply like its request, and the sampling bounds the API takes, once rounded to the
// floats the message carries (0.01 becomes 0.0099999998).
TEST(NodeMessages, TakeEveryStateANodeSaysAndTheBoundsTheApiTakes) {
  HelloReply reply;
  NodeInfo& node = *reply.mutable_node();
  node.set_node_id("a");
  node.set_node_address(":9001");  // a node listening on every interface
  node.set_api_address("0.0.0.0:9000");
  node.set_model_hash(std::string(64, 'f'));
  node.set_protocol_version(kProtocolVersion);
  for (const std::string_view state : kNodeStates) {
    node.set_state(std::string(state));
    EXPECT_EQ(malformed(reply), "") << state;
  }
  *reply.add_known() = node;
  reply.mutable_known(0)->set_node_address("127.0.0.1:9003");
  EXPECT_EQ(malformed(reply), "");
  node.set_state("dancing");
  EXPECT_NE(malformed(reply).find("node.state"), std::string::npos) << malformed(reply);

  GenerateRequest request;
  request.set_sender_id("b");
  request.add_prompt(1);
  request.set_max_tokens(8);
  const sampling::SamplingParams defaults;
  SamplingParams& s = *request.mutable_sampling();
  s.set_temperature(2);
  s.set_top_k(defaults.top_k);
  s.set_top_p(1);
  s.set_min_p(0);
  s.set_repetition_penalty(static_cast<float>(sampling::kRepetitionPenaltyRange.min));
  s.set_presence_penalty(-2);
  s.set_frequency_penalty(2);
  s.set_penalty_last_n(-1);
  EXPECT_EQ(malformed(request), "");
  s.set_repetition_penalty(std::nextafter(static_cast<float>(sampling::kRepetitionPenaltyRange.min), 0.0f));
  EXPECT_NE(malformed(request).find("repetition_penalty"), std::string::npos);
}

}  // namespace
}  // namespace strata::rpc
