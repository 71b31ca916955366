// A pipeline of stages gives the same tokens as the whole model on one stage, whatever the
// number of stages and however the requests are grouped, and leaves no sequence state behind.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "engine/local_stage.h"
#include "gated_stage.h"
#include "outcome.h"

namespace strata::engine {
namespace {

std::future<Outcome> submit(Generator& engine, GenerationRequest request) {
  return submit_for_outcome(engine, std::move(request));
}

GenerationRequest request(int i) {
  GenerationRequest r;
  r.prompt = {1};
  for (int j = 0; j < 3 + i % 7; ++j) r.prompt.push_back(static_cast<Token>(259 + (i * 41 + j * 13) % 250));
  r.max_tokens = 20 + i % 13;
  r.sampling.temperature = i % 2 ? 0.9f : 0.0f;
  r.sampling.seed = 500 + static_cast<uint64_t>(i);
  r.logprobs = true;
  return r;
}

// Layer ranges over the shared model's 4 layers, each on its own stage with its own pool.
struct Stages {
  explicit Stages(const std::vector<int>& cuts) {
    auto file = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      pools.push_back(std::make_unique<tensor::ThreadPool>(1));
      local.push_back(std::make_shared<LocalStage>(
          model::Model::load(file, model::LayerRange{cuts[i], cuts[i + 1]}), *pools.back(),
          KvOptions{.blocks = {256}}));
    }
  }
  std::vector<std::shared_ptr<Stage>> list() const { return {local.begin(), local.end()}; }
  size_t held() const {
    size_t n = 0;
    for (const auto& s : local) n += s->sequence_count();
    return n;
  }
  std::vector<std::unique_ptr<tensor::ThreadPool>> pools;
  std::vector<std::shared_ptr<LocalStage>> local;
};

std::vector<Outcome> alone_on_whole_model(int count) {
  auto file = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
  Engine engine(model::Model::load(file), [](Token t) { return t == 2; }, {.max_parallel = 1, .threads = 1});
  std::vector<Outcome> outcomes;
  for (int i = 0; i < count; ++i) outcomes.push_back(submit(engine, request(i)).get());
  return outcomes;
}

TEST(Pipeline, StagesGiveTheWholeModelsTokensAndLogprobsConcurrently) {
  constexpr int kRequests = 12;
  const std::vector<Outcome> alone = alone_on_whole_model(kRequests);
  for (const std::vector<int>& cuts : {std::vector<int>{0, 2, 4}, {0, 1, 3, 4}, {0, 1, 2, 3, 4}}) {
    Stages stages(cuts);
    {
      Engine engine(stages.list(), 512, [](Token t) { return t == 2; },
                    {.context_size = 128, .max_parallel = 8, .max_queued = 16});
      std::vector<std::future<Outcome>> futures;
      for (int i = 0; i < kRequests; ++i) futures.push_back(submit(engine, request(i)));
      for (int i = 0; i < kRequests; ++i) {
        const Outcome got = futures[static_cast<size_t>(i)].get();
        const Outcome& want = alone[static_cast<size_t>(i)];
        EXPECT_EQ(got.tokens, want.tokens) << cuts.size() - 1 << " stages, request " << i;
        EXPECT_EQ(got.logprobs(), want.logprobs()) << cuts.size() - 1 << " stages, request " << i;
        EXPECT_EQ(got.reason, want.reason);
      }
    }
    EXPECT_EQ(stages.held(), 0u) << "sequence state left on a stage";
  }
}

// A local stage seen through a test's wrapper, which changes what its forward does. It cannot
// hand state over unless the wrapper says so.
class WrappedStage : public Stage {
 public:
  explicit WrappedStage(std::shared_ptr<LocalStage> inner) : inner_(std::move(inner)) {}
  void release(std::span<const SequenceId> ids) override { inner_->release(ids); }
  int hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) override {
    return inner_->hold_prefix(id, capacity, tokens);
  }
  model::KvBlockCounts kv_blocks() override { return inner_->kv_blocks(); }

 protected:
  std::shared_ptr<LocalStage> inner_;
};

// Fails on the stage that holds layer 2, after some calls: every request in that batch ends
// with the error, the others go on, and no state is left anywhere.
class FailingStage final : public WrappedStage {
 public:
  FailingStage(std::shared_ptr<LocalStage> inner, int fail_at) : WrappedStage(std::move(inner)), fail_at_(fail_at) {}
  StageOutput forward(const StageBatch& batch) override {
    if (++calls_ == fail_at_) throw std::runtime_error("peer lost");
    return inner_->forward(batch);
  }

 private:
  int fail_at_;
  std::atomic<int> calls_{0};
};

TEST(Pipeline, AFailingStageEndsItsBatchWithAnErrorAndLeavesNoState) {
  Stages stages({0, 2, 4});
  std::vector<std::shared_ptr<Stage>> list{stages.local[0], std::make_shared<FailingStage>(stages.local[1], 5)};
  {
    Engine engine(list, 512, [](Token t) { return t == 2; },
                  {.context_size = 128, .max_parallel = 4, .max_queued = 8});
    std::vector<std::future<Outcome>> futures;
    for (int i = 0; i < 4; ++i) futures.push_back(submit(engine, request(i)));
    int errors = 0;
    for (auto& f : futures) {
      const Outcome o = f.get();
      if (o.reason == FinishReason::Error) {
        ++errors;
        EXPECT_EQ(o.error, "peer lost");
      }
    }
    EXPECT_GE(errors, 1);
    EXPECT_LT(errors, 4) << "only the failed batch's requests end with the error";
    const Outcome after = submit(engine, request(1)).get();
    EXPECT_EQ(after.tokens, alone_on_whole_model(2)[1].tokens);
  }
  EXPECT_EQ(stages.held(), 0u);
}

// A stage that is gone after some calls, as a killed node is.
class VanishingStage final : public WrappedStage {
 public:
  VanishingStage(std::shared_ptr<LocalStage> inner, int lost_at) : WrappedStage(std::move(inner)), lost_at_(lost_at) {}
  StageOutput forward(const StageBatch& batch) override {
    if (++calls_ >= lost_at_) throw StageLost("node lost");
    return inner_->forward(batch);
  }
  int calls() const { return calls_; }

 private:
  int lost_at_;
  std::atomic<int> calls_{0};
};

// Logs, in one list for all stages, when each is cancelled and when it releases; the first
// stage's releases take a while, so that later workers would end first if they could.
class LoggingStage final : public WrappedStage {
 public:
  LoggingStage(std::shared_ptr<LocalStage> inner, int index, std::chrono::milliseconds release_delay,
               std::vector<std::string>& log, std::mutex& log_mutex)
      : WrappedStage(std::move(inner)), index_(index), release_delay_(release_delay), log_(log), log_mutex_(log_mutex) {}
  StageOutput forward(const StageBatch& batch) override { return inner_->forward(batch); }
  void release(std::span<const SequenceId> ids) override {
    std::this_thread::sleep_for(release_delay_);
    note("release " + std::to_string(ids.size()));
    inner_->release(ids);
  }
  void cancel() override { note("cancel"); }

 private:
  void note(const std::string& what) {
    std::lock_guard lock(log_mutex_);
    log_.push_back(std::to_string(index_) + " " + what);
  }
  int index_;
  std::chrono::milliseconds release_delay_;
  std::vector<std::string>& log_;
  std::mutex& log_mutex_;
};

// Counts the sampling steps a stage is given and the rows it gives back for batches that take
// them, or any rows at all from the stage that holds the head.
class StepCountingStage final : public WrappedStage {
 public:
  using WrappedStage::WrappedStage;
  StageOutput forward(const StageBatch& batch) override {
    StageOutput out = inner_->forward(batch);
    for (const SequenceWork& work : batch.sequences) steps += work.sampling.has_value();
    if (inner_->model().range().has_head(inner_->model().config())) head_rows += out.rows.size();
    return out;
  }
  std::atomic<int> steps{0};
  std::atomic<size_t> head_rows{0};
};

// Tokens are chosen where the logits are: the other stages never see a sampling step, and no
// logits row comes back, not even for a prompt's chunks before its last.
TEST(Pipeline, OnlyTheLastStageChoosesAndOnlyTokensComeBack) {
  constexpr int kRequests = 8;
  const std::vector<Outcome> alone = alone_on_whole_model(kRequests);
  Stages stages({0, 1, 3, 4});
  std::vector<std::shared_ptr<StepCountingStage>> counting;
  for (const auto& local : stages.local) counting.push_back(std::make_shared<StepCountingStage>(local));
  {
    Engine engine({counting.begin(), counting.end()}, 512, [](Token t) { return t == 2; },
                  {.context_size = 128, .max_parallel = 4, .max_queued = 8, .prefill_chunk = 3});
    std::vector<std::future<Outcome>> futures;
    for (int i = 0; i < kRequests; ++i) futures.push_back(submit(engine, request(i)));
    for (int i = 0; i < kRequests; ++i) {
      const Outcome got = futures[static_cast<size_t>(i)].get();
      EXPECT_EQ(got.tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
      EXPECT_EQ(got.logprobs(), alone[static_cast<size_t>(i)].logprobs()) << "request " << i;
    }
  }
  EXPECT_EQ(counting[0]->steps, 0);
  EXPECT_EQ(counting[1]->steps, 0);
  EXPECT_GT(counting[2]->steps, kRequests * 10);
  EXPECT_EQ(counting[2]->head_rows, 0u);
}

TEST(Pipeline, AnEndingPipelineCancelsEveryStageFirstAndCompletesEveryRelease) {
  Stages stages({0, 1, 2, 4});
  std::vector<std::string> log;
  std::mutex log_mutex;
  std::vector<std::shared_ptr<Stage>> logging;
  for (int i = 0; i < 3; ++i) {
    logging.push_back(std::make_shared<LoggingStage>(stages.local[static_cast<size_t>(i)], i,
                                                     std::chrono::milliseconds(i == 0 ? 200 : 0), log, log_mutex));
  }
  {
    Pipeline pipeline(logging, [](Pipeline::Result) {});
    pipeline.end({8, 9});
  }
  // Every stage is cancelled before any releases (so that none waits for a node that is gone),
  // and the release reaches the last stage though the first took its time.
  EXPECT_EQ(log, (std::vector<std::string>{"0 cancel", "1 cancel", "2 cancel", "0 release 2", "1 release 2",
                                           "2 release 2"}));
}

TEST(Pipeline, RequestsWaitForANewPipelineWhenAStageIsLostAndGiveTheSameTokens) {
  constexpr int kRequests = 6;
  const std::vector<Outcome> alone = alone_on_whole_model(kRequests);
  Stages before({0, 2, 4});
  auto vanishing = std::make_shared<VanishingStage>(before.local[1], 12);
  Stages after({0, 1, 4});
  {
    Engine engine({before.local[0], vanishing}, 512, [](Token t) { return t == 2; },
                  {.context_size = 128, .max_parallel = 8, .max_queued = 8, .replay_wait = std::chrono::seconds(30)});
    std::vector<std::future<Outcome>> futures;
    for (int i = 0; i < kRequests; ++i) futures.push_back(submit(engine, request(i)));
    while (vanishing->calls() < 12) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the requests wait, none ends
    for (auto& f : futures) EXPECT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
    engine.replace_pipeline(after.list());
    for (int i = 0; i < kRequests; ++i) {
      const Outcome got = futures[static_cast<size_t>(i)].get();
      EXPECT_EQ(got.tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
      EXPECT_EQ(got.logprobs(), alone[static_cast<size_t>(i)].logprobs()) << "request " << i;
    }
    EXPECT_EQ(before.held(), 0u) << "the old pipeline's stages let go of the sequences computed again";
  }
  EXPECT_EQ(after.held(), 0u);
}

TEST(Pipeline, WithoutANewPipelineRequestsEndWithTheLossAfterTheWait) {
  Stages stages({0, 2, 4});
  auto vanishing = std::make_shared<VanishingStage>(stages.local[1], 3);
  Engine engine({stages.local[0], vanishing}, 512, [](Token t) { return t == 2; },
                {.context_size = 128, .max_parallel = 4, .replay_wait = std::chrono::milliseconds(200)});
  const Outcome o = submit(engine, request(1)).get();
  EXPECT_EQ(o.reason, FinishReason::Error);
  EXPECT_NE(o.error.find("node lost"), std::string::npos) << o.error;
}

// A stage whose node stopped answering (a cable cut): from the given call on, a forward waits
// until the stage is cancelled, or gives up after a minute, as a deadline would.
class SilentStage final : public WrappedStage {
 public:
  SilentStage(std::shared_ptr<LocalStage> inner, int silent_at) : WrappedStage(std::move(inner)), silent_at_(silent_at) {}
  StageOutput forward(const StageBatch& batch) override {
    if (++calls_ < silent_at_) return inner_->forward(batch);
    std::unique_lock lock(mutex_);
    waiting_ = true;
    woken_.notify_all();
    woken_.wait_for(lock, std::chrono::minutes(1), [&] { return cancelled_; });
    throw StageLost(cancelled_ ? "cancelled" : "no reply within its deadline");
  }
  void cancel() override {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    woken_.notify_all();
  }
  void wait_until_silent() {
    std::unique_lock lock(mutex_);
    woken_.wait(lock, [&] { return waiting_; });
  }
  bool cancelled() {
    std::lock_guard lock(mutex_);
    return cancelled_;
  }

 private:
  int silent_at_;
  std::atomic<int> calls_{0};
  std::mutex mutex_;
  std::condition_variable woken_;
  bool waiting_ = false;
  bool cancelled_ = false;
};

TEST(Pipeline, ANewPipelineCancelsABatchWaitingOnASilentStageAndTheRequestsGoOn) {
  constexpr int kRequests = 4;
  const std::vector<Outcome> alone = alone_on_whole_model(kRequests);
  Stages before({0, 2, 4});
  auto silent = std::make_shared<SilentStage>(before.local[1], 6);
  Stages after({0, 3, 4});
  const auto started = std::chrono::steady_clock::now();
  {
    Engine engine({before.local[0], silent}, 512, [](Token t) { return t == 2; },
                  {.context_size = 128, .max_parallel = 8, .max_queued = 8, .replay_wait = std::chrono::minutes(2)});
    std::vector<std::future<Outcome>> futures;
    for (int i = 0; i < kRequests; ++i) futures.push_back(submit(engine, request(i)));
    silent->wait_until_silent();
    engine.replace_pipeline(after.list());
    for (int i = 0; i < kRequests; ++i) {
      EXPECT_EQ(futures[static_cast<size_t>(i)].get().tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
    }
  }
  EXPECT_TRUE(silent->cancelled()) << "the old pipeline told its stages";
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(50))
      << "the requests waited for the silent stage's deadline";
  EXPECT_EQ(after.held(), 0u);
}

// A client that leaves while its request waits for a new pipeline: the request ends then, not
// at its first token after the pause, and is not computed again.
TEST(Pipeline, ARequestCancelledWhileWaitingForANewPipelineEndsThenAndIsNotComputedAgain) {
  const std::vector<Outcome> alone = alone_on_whole_model(2);
  Stages before({0, 2, 4});
  auto vanishing = std::make_shared<VanishingStage>(before.local[1], 6);
  Stages after({0, 1, 4});
  {
    auto gate = std::make_shared<GatedStage>(before.local[0], 1);
    Engine engine({gate, vanishing}, 512, [](Token t) { return t == 2; },
                  {.context_size = 128, .max_parallel = 8, .max_queued = 8, .replay_wait = std::chrono::seconds(30)});
    std::atomic<bool> gone{false};
    auto leaving = submit_for_outcome(engine, request(0), -1, [&gone] { return gone.load(); });
    auto staying = submit(engine, request(1));
    gate->wait_until_held();  // both have started before the stage is lost
    gate->open();
    while (vanishing->calls() < 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    gone = true;
    ASSERT_EQ(leaving.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "it waited for the pause to end";
    EXPECT_EQ(leaving.get().reason, FinishReason::Cancelled);
    engine.replace_pipeline(after.list());
    const Outcome got = staying.get();
    EXPECT_EQ(got.tokens, alone[1].tokens);
    EXPECT_EQ(engine.switch_counts().recomputed, 1u) << "only the request still wanted is computed again";
    EXPECT_EQ(before.held(), 0u);
  }
  EXPECT_EQ(after.held(), 0u);
}

// Nodes leave and join a running cluster: the sequences' keys and values move to the new
// stages, none is computed again, and the texts are the whole model's.
TEST(Pipeline, AHandOverMovesEverySequencesStateAndNothingIsComputedAgain) {
  constexpr int kRequests = 8;
  const std::vector<Outcome> alone = alone_on_whole_model(kRequests);
  Stages first({0, 2, 4});
  Stages second({0, 1, 3, 4});  // a node joined
  Stages third({0, 4});         // two left
  std::vector<std::shared_ptr<GatedStage>> counted;
  // Each pipeline's last stage holds its 6th batch: the next switch comes while it is in flight.
  // The first pipeline's first stage holds its first batch until every request is submitted, so
  // that all have started by then however the threads are scheduled.
  const auto counting = [&](const Stages& stages, int first_hold_at = 0) {
    std::vector<std::shared_ptr<Stage>> list;
    for (const auto& s : stages.local) {
      const int hold_at = list.size() + 1 == stages.local.size() ? 6 : list.empty() ? first_hold_at : 0;
      list.push_back(counted.emplace_back(std::make_shared<GatedStage>(s, hold_at)));
    }
    return list;
  };
  {
    Engine engine(counting(first, 1), 512, [](Token t) { return t == 2; },
                  {.context_size = 128, .max_parallel = 8, .max_queued = 8});
    std::vector<std::future<Outcome>> futures;
    for (int i = 0; i < kRequests; ++i) futures.push_back(submit(engine, request(i)));
    counted.front()->wait_until_held();
    counted.front()->open();
    for (const auto& next : {&second, &third}) {
      const std::shared_ptr<GatedStage> last = counted.back();
      last->wait_until_held();
      engine.replace_pipeline(counting(*next), /*hand_over=*/true);
      last->open();
    }
    counted.back()->wait_until_held();
    counted.back()->open();
    for (int i = 0; i < kRequests; ++i) {
      const Outcome got = futures[static_cast<size_t>(i)].get();
      EXPECT_EQ(got.tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
      EXPECT_EQ(got.logprobs(), alone[static_cast<size_t>(i)].logprobs()) << "request " << i;
    }
    const Engine::SwitchCounts counts = engine.switch_counts();
    EXPECT_EQ(counts.recomputed, 0u);
    EXPECT_GT(counts.handed_over, 0u) << "the switches came after the requests had started";
  }
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(counted[i]->started(), kRequests) << "stage " << i << " of the first pipeline";
  for (size_t i = 2; i < counted.size(); ++i) EXPECT_EQ(counted[i]->started(), 0) << "stage " << i << " started a sequence";
  EXPECT_EQ(first.held() + second.held() + third.held(), 0u) << "the old stages let go of what moved";
}

TEST(Pipeline, AHandOverFromAStageThatIsGoneComputesTheSequencesAgain) {
  constexpr int kRequests = 4;
  const std::vector<Outcome> alone = alone_on_whole_model(kRequests);
  Stages before({0, 2, 4});
  auto vanishing = std::make_shared<VanishingStage>(before.local[1], 1000);  // cannot hand over
  Stages after({0, 3, 4});
  {
    Engine engine({before.local[0], vanishing}, 512, [](Token t) { return t == 2; },
                  {.context_size = 128, .max_parallel = 8, .max_queued = 8});
    std::vector<std::future<Outcome>> futures;
    for (int i = 0; i < kRequests; ++i) futures.push_back(submit(engine, request(i)));
    while (vanishing->calls() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    engine.replace_pipeline(after.list(), /*hand_over=*/true);
    for (int i = 0; i < kRequests; ++i) {
      EXPECT_EQ(futures[static_cast<size_t>(i)].get().tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
    }
    EXPECT_GT(engine.switch_counts().recomputed, 0u);
    EXPECT_EQ(engine.switch_counts().handed_over, 0u);
  }
  EXPECT_EQ(after.held(), 0u);
}

// A scheduler that stops leading passes its requests on once its batches in flight are done:
// their state stays on its stages, and the next scheduler moves it to its own stages and
// computes none of it again, and the old stages let it go; without the old stages it computes
// them again. Either way the texts are the whole model's.
TEST(Pipeline, ARequestPassedOnGoesOnAtTheNextSchedulerWithItsState) {
  constexpr int kRequests = 8;
  const std::vector<Outcome> alone = alone_on_whole_model(kRequests);
  for (const bool old_stages_known : {true, false}) {
    SCOPED_TRACE(old_stages_known ? "the old stages are known" : "the old stages are not known");
    Stages first({0, 2, 4});
    Stages second({0, 3, 4});
    struct Passed {
      std::vector<GeneratedToken> generated;
      std::optional<HeldState> held;
      bool finished = false;
    };
    std::vector<Passed> passed(kRequests);
    {
      // The first batch waits until every request is submitted: all have started by the 6th.
      auto gate = std::make_shared<GatedStage>(first.local[0], 1);
      auto holding = std::make_shared<GatedStage>(first.local[1], 6);
      Engine engine({gate, holding}, 512, [](Token t) { return t == 2; },
                    {.context_size = 128, .max_parallel = 8, .max_queued = 8});
      for (int i = 0; i < kRequests; ++i) {
        Passed& p = passed[static_cast<size_t>(i)];
        RequestCallbacks callbacks;
        callbacks.on_token = [&p](const GeneratedToken& t) {
          p.generated.push_back(t);
          return true;
        };
        callbacks.on_finish = [&p](FinishReason, const std::string&) { p.finished = true; };
        callbacks.on_passed_on = [&p](const HeldState& held) { p.held = held; };
        ASSERT_TRUE(engine.submit(request(i), std::move(callbacks)));
      }
      gate->wait_until_held();
      gate->open();
      holding->wait_until_held();
      std::thread passing([&] { engine.pass_on(7, "passed on"); });
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      holding->open();  // the batch in flight finishes before anything is passed on
      passing.join();
    }
    for (const Passed& p : passed) {
      ASSERT_TRUE(p.held.has_value()) << "every request had started, none had ended";
      EXPECT_EQ(p.held->pipeline, 7u);
      EXPECT_FALSE(p.finished);
    }
    EXPECT_EQ(first.held(), 2u * kRequests) << "the passed-on state stays on the old stages";
    {
      Engine next(second.list(), 512, [](Token t) { return t == 2; },
                  {.context_size = 128,
                   .max_parallel = 8,
                   .max_queued = 8,
                   .held_stages = [&](uint64_t pipeline) {
                     EXPECT_EQ(pipeline, 7u);
                     return old_stages_known ? first.list() : std::vector<std::shared_ptr<Stage>>{};
                   },
                   .first_sequence_id = 1000});
      std::vector<std::future<Outcome>> futures;
      for (int i = 0; i < kRequests; ++i) {
        const Passed& p = passed[static_cast<size_t>(i)];
        GenerationRequest rest = request(i);
        for (const GeneratedToken& t : p.generated) rest.prompt.push_back(t.token);
        rest.max_tokens -= static_cast<int>(p.generated.size());
        rest.resumed_after = static_cast<int>(p.generated.size());
        rest.held = p.held;
        futures.push_back(submit(next, rest));
      }
      for (int i = 0; i < kRequests; ++i) {
        Outcome whole = futures[static_cast<size_t>(i)].get();
        const std::vector<GeneratedToken>& before = passed[static_cast<size_t>(i)].generated;
        whole.generated.insert(whole.generated.begin(), before.begin(), before.end());
        whole.tokens.clear();
        for (const GeneratedToken& t : whole.generated) whole.tokens.push_back(t.token);
        EXPECT_EQ(whole.tokens, alone[static_cast<size_t>(i)].tokens) << "request " << i;
        EXPECT_EQ(whole.logprobs(), alone[static_cast<size_t>(i)].logprobs()) << "request " << i;
      }
      const Engine::SwitchCounts counts = next.switch_counts();
      EXPECT_EQ(counts.handed_over, old_stages_known ? kRequests : 0u);
      EXPECT_EQ(counts.recomputed, old_stages_known ? 0u : kRequests);
    }
    EXPECT_EQ(second.held(), 0u);
    // Unknown old stages keep the state until their node drops them with their placement.
    EXPECT_EQ(first.held(), old_stages_known ? 0u : 2u * kRequests) << "the old stages let go of what moved";
  }
}

TEST(LocalStage, RefusesBatchesOutOfStep) {
  Stages stages({0, 4});
  LocalStage& stage = *stages.local[0];
  StageBatch start{{{7, 0, 2, 16}}, {1, 300}, {}};
  EXPECT_EQ(stage.forward(start).rows.size(), 512u);
  EXPECT_THROW(stage.forward(start), std::invalid_argument);  // started twice
  EXPECT_THROW(stage.forward({{{7, 5, 1, 16}}, {300}, {}}), std::invalid_argument);  // skips positions
  EXPECT_THROW(stage.forward({{{8, 3, 1, 16}}, {300}, {}}), std::invalid_argument);  // unknown sequence
  EXPECT_EQ(stage.forward({{{7, 2, 1, 16}}, {300}, {}}).rows.size(), 512u);
  const SequenceId id = 7;
  stage.release({&id, 1});
  EXPECT_EQ(stage.sequence_count(), 0u);
}

}  // namespace
}  // namespace strata::engine
