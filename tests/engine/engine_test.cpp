// Every request stands alone: its tokens depend only on the request and seed, never on what ran
// before it or beside it.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <future>
#include <latch>
#include <thread>

#include "engine/engine.h"
#include "outcome.h"

namespace strata::engine {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  void start(EngineOptions options) {
    auto file = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
    engine_ = std::make_unique<Engine>(model::Model::load(file), [](Token t) { return t == 2; }, options);
  }

  std::future<Outcome> submit(GenerationRequest request, int stop_after = -1) {
    return submit_for_outcome(*engine_, std::move(request), stop_after);
  }

  Outcome run(GenerationRequest request) { return submit(std::move(request)).get(); }

  // Submits a request whose first token waits for `release`, then ends it.
  std::future<void> submit_blocked_until(std::latch& release, GenerationRequest request) {
    auto done = std::make_shared<std::promise<void>>();
    RequestCallbacks blocking;
    blocking.on_token = [&release](const GeneratedToken&) {
      release.wait();
      return false;
    };
    blocking.on_finish = [done](FinishReason, const std::string&) { done->set_value(); };
    EXPECT_TRUE(engine_->submit(std::move(request), blocking));
    return done->get_future();
  }

  struct Stopped {
    FinishReason running;  // the request running when the engine began to stop
    Outcome waiting;       // one queued behind it
  };
  // A new engine, stopped by `stop` on another thread while it runs one request, held in its
  // first token, and another waits behind it.
  Stopped stop_while_busy(const std::function<void()>& stop);

  std::unique_ptr<Engine> engine_;
};

GenerationRequest request(std::vector<Token> prompt, int max_tokens, float temperature, uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

// Distinct prompts: BOS then a few ordinary tokens.
std::vector<Token> prompt(int i) {
  std::vector<Token> p{1};
  for (int j = 0; j < 3 + i % 5; ++j) p.push_back(static_cast<Token>(259 + (i * 37 + j * 11) % 250));
  return p;
}

EngineTest::Stopped EngineTest::stop_while_busy(const std::function<void()>& stop) {
  start({.max_parallel = 1, .max_queued = 1000});
  std::latch release(1);
  RequestCallbacks blocking;
  blocking.on_token = [&](const GeneratedToken&) {
    release.wait();
    return true;
  };
  std::promise<FinishReason> first;
  blocking.on_finish = [&](FinishReason r, const std::string&) { first.set_value(r); };
  EXPECT_TRUE(engine_->submit(request(prompt(1), 50, 0.0f, 1), blocking));
  auto waiting = submit(request(prompt(2), 50, 0.0f, 1));
  std::thread stopper(stop);
  // Until the engine refuses new requests it may not have begun to stop (the queue holds far
  // more than this loop can submit meanwhile); those accepted end as the others do.
  RequestCallbacks probe;
  probe.on_token = [](const GeneratedToken&) { return true; };
  probe.on_finish = [](FinishReason, const std::string&) {};
  int probes = 0;
  while (engine_->submit(request(prompt(3), 5, 0.0f, 1), probe)) {
    ++probes;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_LT(probes, 999) << "the queue filled up before the engine began to stop";
  release.count_down();
  stopper.join();
  Outcome waited = waiting.get();
  return {first.get_future().get(), std::move(waited)};
}

TEST_F(EngineTest, RequestsABAGiveTheSameAnswerForA) {
  start({.max_parallel = 4});
  for (float temperature : {0.0f, 0.9f}) {
    const auto a1 = run(request(prompt(1), 40, temperature, 42));
    const auto b = run(request(prompt(2), 40, temperature, 42));
    const auto a2 = run(request(prompt(1), 40, temperature, 42));
    EXPECT_EQ(a1, a2) << "temperature " << temperature;
    EXPECT_NE(a1.tokens, b.tokens);
    EXPECT_FALSE(a1.tokens.empty());
  }
}

TEST_F(EngineTest, ConcurrentRequestsEachGiveWhatTheyGiveAlone) {
  start({.max_parallel = 8, .max_queued = 16});
  std::vector<Outcome> alone;
  for (int i = 0; i < 16; ++i) alone.push_back(run(request(prompt(i), 30 + i, i % 2 ? 0.8f : 0.0f, 100 + i)));
  std::vector<std::future<Outcome>> futures;
  for (int i = 0; i < 16; ++i) futures.push_back(submit(request(prompt(i), 30 + i, i % 2 ? 0.8f : 0.0f, 100 + i)));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(futures[static_cast<size_t>(i)].get(), alone[static_cast<size_t>(i)]) << "request " << i;
}

TEST_F(EngineTest, ARequestAfterACancelledOneIsUnaffected) {
  start({.max_parallel = 2});
  const auto clean = run(request(prompt(3), 30, 0.0f, 1));
  const auto cancelled = submit(request(prompt(4), 30, 0.0f, 1), 5).get();
  EXPECT_EQ(cancelled.reason, FinishReason::Cancelled);
  EXPECT_EQ(cancelled.tokens.size(), 5u);
  EXPECT_EQ(run(request(prompt(3), 30, 0.0f, 1)), clean);
}

TEST_F(EngineTest, AFailingCallbackEndsOnlyItsOwnRequest) {
  start({.max_parallel = 2});
  const auto clean = run(request(prompt(6), 20, 0.0f, 1));
  std::promise<std::pair<FinishReason, std::string>> failed;
  RequestCallbacks throwing;
  throwing.on_token = [](const GeneratedToken&) -> bool { throw std::runtime_error("consumer broke"); };
  throwing.on_finish = [&](FinishReason r, const std::string& e) { failed.set_value({r, e}); };
  ASSERT_TRUE(engine_->submit(request(prompt(7), 20, 0.0f, 1), throwing));
  const auto [reason, error] = failed.get_future().get();
  EXPECT_EQ(reason, FinishReason::Error);
  EXPECT_NE(error.find("consumer broke"), std::string::npos) << error;
  EXPECT_EQ(run(request(prompt(6), 20, 0.0f, 1)), clean);
}

// A request that resumes elsewhere after k tokens, with them appended to its prompt, goes on with
// exactly the tokens it would have generated.
TEST_F(EngineTest, AResumedRequestGoesOnWithTheSameTokens) {
  start({.max_parallel = 2});
  for (float temperature : {0.0f, 0.9f}) {
    GenerationRequest whole = request(prompt(2), 30, temperature, 77);
    const auto all = run(whole);
    ASSERT_EQ(all.tokens.size(), 30u);
    for (int k : {1, 13, 29}) {
      GenerationRequest rest = whole;
      rest.prompt.insert(rest.prompt.end(), all.tokens.begin(), all.tokens.begin() + k);
      rest.max_tokens -= k;
      rest.resumed_after = k;
      const auto resumed = run(rest);
      EXPECT_EQ(resumed.tokens, std::vector<Token>(all.tokens.begin() + k, all.tokens.end()))
          << "temperature " << temperature << ", resumed after " << k;
    }
  }
  GenerationRequest nothing_left = request(prompt(2), 5, 0.9f, 1);
  nothing_left.resumed_after = static_cast<int>(nothing_left.prompt.size());
  EXPECT_THROW(engine_->submit(nothing_left, {}), std::invalid_argument);
}

TEST_F(EngineTest, FinishesWithLengthOrStop) {
  start({});
  const auto out = run(request(prompt(5), 7, 0.0f, 1));
  if (out.reason == FinishReason::Length) {
    EXPECT_EQ(out.tokens.size(), 7u);
  } else {
    EXPECT_EQ(out.reason, FinishReason::Stop);
    EXPECT_EQ(out.tokens.back(), 2);
  }
}

TEST_F(EngineTest, ReportsLogprobsOnlyWhenAsked) {
  start({});
  GenerationRequest asked = request(prompt(3), 6, 0.0f, 1);
  asked.logprobs = true;
  asked.top_logprobs = 3;
  const auto with = run(asked);
  ASSERT_FALSE(with.generated.empty());
  for (const GeneratedToken& t : with.generated) {
    EXPECT_LT(t.logprob, 0.0f);
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].token, t.token);  // greedy takes the most likely token
    EXPECT_EQ(t.top[0].logprob, t.logprob);
  }
  const auto without = run(request(prompt(3), 6, 0.0f, 1));
  EXPECT_EQ(without.tokens, with.tokens);
  for (const GeneratedToken& t : without.generated) {
    EXPECT_EQ(t.logprob, 0.0f);
    EXPECT_TRUE(t.top.empty());
  }
}

TEST_F(EngineTest, RefusesWhatCannotFitTheContext) {
  start({.context_size = 64});
  try {
    engine_->submit(request(std::vector<Token>(60, 300), 10, 0.0f, 1), {});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("60 in the prompt + 10"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine_->submit(request({}, 10, 0.0f, 1), {}), std::invalid_argument);
  EXPECT_THROW(engine_->submit(request({1, 9999}, 10, 0.0f, 1), {}), std::invalid_argument);
}

TEST_F(EngineTest, RefusesWhenSlotsAndQueueAreFull) {
  start({.max_parallel = 1, .max_queued = 1});
  std::latch release(1);
  std::future<void> first_done = submit_blocked_until(release, request(prompt(1), 5, 0.0f, 1));
  auto queued = submit(request(prompt(2), 5, 0.0f, 1));
  EXPECT_FALSE(engine_->submit(request(prompt(3), 5, 0.0f, 1), {}));
  release.count_down();
  first_done.get();
  EXPECT_EQ(queued.get().tokens.size() > 0, true);
}

// A queued request whose client went away gives its place up at once, even while the engine is
// busy with another.
TEST_F(EngineTest, ACancelledQueuedRequestFreesItsPlaceAtOnce) {
  start({.max_parallel = 1, .max_queued = 1});
  std::latch release(1);
  std::future<void> first_done = submit_blocked_until(release, request(prompt(1), 5, 0.0f, 1));

  std::atomic<bool> gone{false};
  std::promise<FinishReason> dropped;
  RequestCallbacks queued;
  queued.on_token = [](const GeneratedToken&) { return true; };
  queued.on_finish = [&](FinishReason reason, const std::string&) { dropped.set_value(reason); };
  queued.cancelled = [&] { return gone.load(); };
  ASSERT_TRUE(engine_->submit(request(prompt(2), 5, 0.0f, 1), queued));
  EXPECT_FALSE(engine_->submit(request(prompt(3), 5, 0.0f, 1), {}));  // full
  gone = true;
  auto next = submit(request(prompt(3), 5, 0.0f, 1));  // takes the freed place
  EXPECT_EQ(dropped.get_future().get(), FinishReason::Cancelled);
  release.count_down();
  first_done.get();
  EXPECT_FALSE(next.get().tokens.empty());
}

TEST_F(EngineTest, ShutdownCancelsWhatIsInFlight) {
  const Stopped stopped = stop_while_busy([this] { engine_->shutdown(); });
  EXPECT_EQ(stopped.waiting.reason, FinishReason::Cancelled);
  const FinishReason r = stopped.running;
  EXPECT_TRUE(r == FinishReason::Cancelled || r == FinishReason::Length || r == FinishReason::Stop);
  EXPECT_FALSE(engine_->submit(request(prompt(3), 5, 0.0f, 1), {}));
}

TEST_F(EngineTest, AbortAndPassOnEndWhatIsInFlightWithTheirReason) {
  const std::string why = "its node no longer leads";
  const std::vector<std::pair<std::function<void()>, FinishReason>> stops = {
      {[&] { engine_->abort(FinishReason::Lost, why); }, FinishReason::Lost},
      {[&] { engine_->abort(FinishReason::Error, why); }, FinishReason::Error},
      // Requests it cannot pass on with their state (these take no on_passed_on) are lost.
      {[&] { engine_->pass_on(7, why); }, FinishReason::Lost}};
  for (const auto& [stop, reason] : stops) {
    const Stopped stopped = stop_while_busy(stop);
    EXPECT_EQ(stopped.waiting.reason, reason) << finish_reason_name(reason);
    EXPECT_EQ(stopped.waiting.error, why);
    EXPECT_TRUE(stopped.running == reason || stopped.running == FinishReason::Length ||
                stopped.running == FinishReason::Stop);
  }
}

}  // namespace
}  // namespace strata::engine
