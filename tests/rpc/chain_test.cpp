// A chain over real node services in one process: the leader computes the first layers and
// sends each batch to node b, which passes its rows on to node c, which holds the head and
// chooses the tokens; they come back through b. The text is the whole model's, bit for bit,
// and a node lost down the chain is the one the leader hears of.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../engine/outcome.h"
#include "engine/engine.h"
#include "engine/local_stage.h"
#include "rpc/channel.h"
#include "rpc/node_service.h"
#include "rpc/remote_stage.h"

namespace strata::rpc {
namespace {

using engine::GenerationRequest;
using engine::Outcome;
constexpr uint64_t kEpoch = 3;
// Of every call, so that a silent stage is noticed within a test.
constexpr std::chrono::milliseconds kDeadline{1000};

std::shared_ptr<const gguf::File> dreams() {
  static const auto file = std::shared_ptr<const gguf::File>(gguf::File::open(engine::kDreams));
  return file;
}

// A stage whose batches wait while it is held, as a node that stopped answering would.
class HoldableStage final : public engine::Stage {
 public:
  explicit HoldableStage(std::shared_ptr<engine::LocalStage> inner) : inner_(std::move(inner)) {}
  engine::StageOutput forward(const engine::StageBatch& batch) override {
    std::unique_lock lock(mutex_);
    released_.wait(lock, [&] { return !held_; });
    lock.unlock();
    return inner_->forward(batch);
  }
  void release(std::span<const engine::SequenceId> ids) override { inner_->release(ids); }
  int hold_prefix(engine::SequenceId id, int capacity, std::span<const engine::Token> tokens) override {
    return inner_->hold_prefix(id, capacity, tokens);
  }
  model::KvBlockCounts kv_blocks() override { return inner_->kv_blocks(); }
  void hold(bool held) {
    {
      std::lock_guard lock(mutex_);
      held_ = held;
    }
    released_.notify_all();
  }

 private:
  std::shared_ptr<engine::LocalStage> inner_;
  std::mutex mutex_;
  std::condition_variable released_;
  bool held_ = false;
};

// A node that holds layers [first, last) of the shared model and reaches the other nodes of
// the chain by their ids.
class RangeNode final : public NodeHandler {
 public:
  RangeNode(std::string id, int first, int last, std::shared_ptr<ClusterKey> key)
      : id_(std::move(id)),
        key_(std::move(key)),
        pool_(1),
        stage_(std::make_shared<HoldableStage>(std::make_shared<engine::LocalStage>(
            model::Model::load(dreams(), model::LayerRange{first, last}), pool_, engine::KvOptions{.blocks = {64}}))),
        server_(*this, id_, key_, "127.0.0.1", 0, [](const std::string&) {}) {}

  std::string address() const { return "127.0.0.1:" + std::to_string(server_.port()); }
  void knows(const std::string& id, const std::string& address) { addresses_[id] = address; }
  void stop() { server_.stop(); }
  void hold(bool held) { stage_->hold(held); }

  std::string hello(const cluster_types::Hello&, const std::string&, cluster_types::Hello&) override { return {}; }
  std::shared_ptr<engine::Stage> stage(uint64_t epoch, std::string& why) override {
    if (epoch == kEpoch) return stage_;
    why = "another epoch";
    return nullptr;
  }
  std::shared_ptr<engine::Stage> chain_stage(uint64_t epoch, const std::string& node_id, std::string& why) override {
    const auto found = addresses_.find(node_id);
    if (epoch != kEpoch || found == addresses_.end()) {
      why = "no such stage";
      return nullptr;
    }
    return std::make_shared<RemoteStage>(node_id, make_channel(found->second, *key_), Caller{id_, epoch, key_},
                                         engine::StageLayers{}, kDeadline);
  }
  std::shared_ptr<engine::Generator> scheduler(std::string& why) override {
    why = "not the leader";
    return nullptr;
  }
  std::optional<cluster_types::ModelManifest> manifest(const std::string&, std::string& why) override {
    why = "no manifest";
    return std::nullopt;
  }
  std::optional<TensorBytes> tensor(const cluster_types::TensorRequest&, std::string& why) override {
    why = "no tensors";
    return std::nullopt;
  }

 private:
  std::string id_;
  std::shared_ptr<ClusterKey> key_;
  tensor::ThreadPool pool_;
  std::shared_ptr<HoldableStage> stage_;
  std::map<std::string, std::string> addresses_;
  NodeServer server_;
};

GenerationRequest request(int i) {
  GenerationRequest r;
  r.prompt = {1};
  for (int j = 0; j < 3 + i % 9; ++j) r.prompt.push_back(static_cast<engine::Token>(259 + (i * 37 + j * 11) % 250));
  r.max_tokens = 16 + i % 11;
  r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
  r.sampling.seed = 90 + static_cast<uint64_t>(i);
  r.sampling.repetition_penalty = i % 3 ? 1.0f : 1.3f;
  r.logprobs = true;
  r.top_logprobs = i % 4;
  return r;
}

struct Chain {
  Chain() {
    b.knows("c", c.address());
    leader_stage = std::make_shared<engine::LocalStage>(model::Model::load(dreams(), model::LayerRange{0, 2}), pool,
                                                        engine::KvOptions{.blocks = {64}});
    const auto lost = [this](const std::string& peer, bool) {
      std::lock_guard lock(mutex);
      lost_peers.push_back(peer);
    };
    stages = {leader_stage,
              std::make_shared<RemoteStage>("b", make_channel(b.address(), *key), Caller{"leader", kEpoch, key, {}, lost},
                                            engine::StageLayers{2, 3}, kDeadline),
              std::make_shared<RemoteStage>("c", make_channel(c.address(), *key), Caller{"leader", kEpoch, key, {}, lost},
                                            engine::StageLayers{3, 4}, kDeadline)};
  }
  // A pipeline that ended with a node lost releases its sequences on threads of their own
  // (RemoteStage::release), which must be done with gRPC before the process exits.
  ~Chain() { RemoteStage::wait_for_releases(std::chrono::seconds(5)); }
  std::shared_ptr<ClusterKey> key = std::make_shared<ClusterKey>("chain-secret");
  RangeNode c{"c", 3, 4, key};
  RangeNode b{"b", 2, 3, key};
  tensor::ThreadPool pool{1};
  std::shared_ptr<engine::LocalStage> leader_stage;
  std::vector<std::shared_ptr<engine::Stage>> stages;
  std::mutex mutex;
  std::vector<std::string> lost_peers;
};

TEST(Chain, GivesTheWholeModelsTokensAndLogprobs) {
  constexpr int kRequests = 10;
  engine::Engine whole(model::Model::load(dreams()), [](engine::Token t) { return t == 2; },
                       {.max_parallel = 1, .threads = 1});
  std::vector<Outcome> alone;
  for (int i = 0; i < kRequests; ++i) alone.push_back(engine::submit_for_outcome(whole, request(i)).get());
  Chain chain;
  engine::Engine pipelined(chain.stages, 512, [](engine::Token t) { return t == 2; },
                           {.context_size = 128, .max_parallel = 6, .max_queued = 16, .prefill_chunk = 4});
  std::vector<std::future<Outcome>> futures;
  for (int i = 0; i < kRequests; ++i) futures.push_back(engine::submit_for_outcome(pipelined, request(i)));
  for (int i = 0; i < kRequests; ++i) {
    const Outcome got = futures[static_cast<size_t>(i)].get();
    const Outcome& want = alone[static_cast<size_t>(i)];
    ASSERT_EQ(got.error, "");
    EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
    EXPECT_EQ(got.logprobs(), want.logprobs()) << "request " << i;
    for (size_t t = 0; t < got.generated.size() && t < want.generated.size(); ++t) {
      const auto& a = got.generated[t].top;
      const auto& b = want.generated[t].top;
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        EXPECT_EQ(a[k].token, b[k].token) << "request " << i << ", token " << t;
        EXPECT_EQ(a[k].logprob, b[k].logprob) << "request " << i << ", token " << t;
      }
    }
  }
  std::lock_guard lock(chain.mutex);
  EXPECT_TRUE(chain.lost_peers.empty());
}

// A node passes batches on only to the stages it knows in that placement, and a stream's batches
// all to the same ones.
TEST(Chain, RefusesWhatItCannotPassOn) {
  Chain chain;
  auto stub = Node::NewStub(make_channel(chain.b.address(), *chain.key));
  const auto batch = [](std::initializer_list<const char*> then, int first_position) {
    ForwardRequest request;
    request.set_sender_id("leader");
    request.set_epoch(kEpoch);
    SequenceWork& work = *request.add_sequences();
    work.set_sequence_id(1);
    work.set_first_position(first_position);
    work.set_token_count(1);
    work.set_capacity(16);
    request.add_tokens(300);
    request.set_hidden(std::string(64 * sizeof(float), '\0'));
    for (const char* node : then) request.add_then(node);
    return request;
  };
  const auto stream_of = [&](const std::vector<ForwardRequest>& requests, int* replies) {
    grpc::ClientContext context;
    chain.key->sign(context, "leader", "Forward");
    auto stream = stub->Forward(&context);
    for (const ForwardRequest& request : requests) {
      ForwardReply reply;
      if (!stream->Write(request) || !stream->Read(&reply)) break;
      ++*replies;
    }
    stream->WritesDone();
    return stream->Finish();
  };
  int replies = 0;
  EXPECT_EQ(stream_of({batch({"x"}, 0)}, &replies).error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "a node outside the placement";
  EXPECT_EQ(replies, 0);
  EXPECT_EQ(stream_of({batch({"c"}, 0), batch({}, 1)}, &replies).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << "a stream whose batches change where they go";
  EXPECT_EQ(replies, 1) << "the first batch went through b and c";
}

// c stops (its calls end: unreachable) or only falls silent (late): either way b, nearest to it,
// notices first (the leader's deadline for the chain is the sum of its stages'), and says so.
class ChainLoss : public ::testing::TestWithParam<bool> {};

TEST_P(ChainLoss, ANodeLostDownTheChainIsTheOneTheLeaderHearsOf) {
  const bool stopped = GetParam();
  Chain chain;
  engine::Engine pipelined(chain.stages, 512, [](engine::Token t) { return t == 2; }, {.context_size = 128});
  std::promise<void> started;
  GenerationRequest long_one = request(0);
  long_one.max_tokens = 100;
  auto outcome = std::make_shared<std::promise<Outcome>>();
  auto got = std::make_shared<Outcome>();
  engine::RequestCallbacks callbacks;
  callbacks.on_token = [&, got](const engine::GeneratedToken& t) {
    got->tokens.push_back(t.token);
    if (got->tokens.size() == 3) started.set_value();
    return true;
  };
  callbacks.on_finish = [outcome, got](engine::FinishReason reason, const std::string& error) {
    got->reason = reason;
    got->error = error;
    outcome->set_value(*got);
  };
  ASSERT_TRUE(pipelined.submit(long_one, callbacks));
  started.get_future().wait();
  chain.c.hold(true);
  std::thread stopping([&] {
    if (stopped) chain.c.stop();  // ends its calls after a grace of 2 s
  });
  const Outcome ended = outcome->get_future().get();
  chain.c.hold(false);
  stopping.join();
  EXPECT_EQ(ended.reason, engine::FinishReason::Error);
  EXPECT_NE(ended.error.find("node c"), std::string::npos) << ended.error;
  std::lock_guard lock(chain.mutex);
  EXPECT_EQ(chain.lost_peers, std::vector<std::string>{"c"}) << "b is still there";
}

INSTANTIATE_TEST_SUITE_P(StoppedOrSilent, ChainLoss, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "stopped" : "silent"; });

}  // namespace
}  // namespace strata::rpc
