// A request's output from the scheduler's thread to a reader on another: items in order, the
// end, the reader's cancellation heard by the scheduler, and waiting with a deadline; the
// callbacks that queue TokenEvents, and delivering them to other callbacks.
#include "engine/token_stream.h"

#include <gtest/gtest.h>

#include <thread>

namespace strata::engine {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(TokenStream, ItemsComeInTheOrderTheyWerePushedAcrossThreads) {
  TokenStream<int> stream;
  std::thread producer([&] {
    for (int i = 0; i < 1000; ++i) stream.push(i, i == 999);
  });
  std::vector<int> read;
  bool ended = false;
  while (!ended) {
    TokenStream<int>::Taken taken = stream.take(Clock::now() + 10s);
    read.insert(read.end(), taken.items.begin(), taken.items.end());
    ended = taken.ended;
  }
  producer.join();
  ASSERT_EQ(read.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(read[static_cast<size_t>(i)], i);
}

TEST(TokenStream, NothingIsQueuedAfterTheEnd) {
  TokenStream<std::string> stream;
  stream.push("a");
  stream.push("end", /*last=*/true);
  stream.push("late");
  stream.push("late end", /*last=*/true);
  EXPECT_TRUE(stream.ended());
  const auto taken = stream.take(Clock::now());
  EXPECT_EQ(taken.items, (std::vector<std::string>{"a", "end"}));
  EXPECT_TRUE(taken.ended);
  const auto after = stream.take(Clock::now() + 10s);
  EXPECT_TRUE(after.items.empty());
  EXPECT_TRUE(after.ended) << "an ended stream answers at once";
}

TEST(TokenStream, TakeReturnsAtTheDeadlineWithNothing) {
  TokenStream<int> stream;
  const auto started = Clock::now();
  const auto taken = stream.take(started + 50ms);
  EXPECT_GE(Clock::now() - started, 50ms);
  EXPECT_TRUE(taken.items.empty());
  EXPECT_FALSE(taken.ended);
}

TEST(TokenStream, TakeWakesAsSoonAsAnItemComes) {
  TokenStream<int> stream;
  std::thread producer([&] {
    std::this_thread::sleep_for(20ms);
    stream.push(7);
  });
  const auto started = Clock::now();
  const auto taken = stream.take(started + 60s);
  producer.join();
  EXPECT_LT(Clock::now() - started, 30s);
  EXPECT_EQ(taken.items, std::vector<int>{7});
  EXPECT_FALSE(taken.ended);
}

TEST(TokenStream, TheSchedulerHearsTheReadersCancellation) {
  auto stream = std::make_shared<TokenStream<TokenEvent>>();
  RequestCallbacks callbacks = queue_events(stream);
  EXPECT_FALSE(callbacks.cancelled());
  EXPECT_TRUE(callbacks.on_token(GeneratedToken{5}));
  stream->cancel();
  EXPECT_TRUE(callbacks.cancelled());
  EXPECT_FALSE(callbacks.on_token(GeneratedToken{6})) << "the request ends at its next token";
  callbacks.on_finish(FinishReason::Cancelled, {});
  const auto taken = stream->take(Clock::now());
  ASSERT_EQ(taken.items.size(), 3u) << "a cancelled stream still carries what came, and its end";
  EXPECT_EQ(std::get<GeneratedToken>(taken.items[1]).token, 6);
  EXPECT_EQ(std::get<RequestFinished>(taken.items[2]).reason, FinishReason::Cancelled);
  EXPECT_TRUE(taken.ended);
}

TEST(TokenStream, EveryCallbackBecomesItsEventAndBackAgain) {
  auto stream = std::make_shared<TokenStream<TokenEvent>>();
  RequestCallbacks queued = queue_events(stream);
  queued.on_started();
  GeneratedToken token{42, -0.5f, {{42, -0.5f}, {3, -2.0f}}, false, 16};
  queued.on_token(token);
  queued.on_embedding({1.0f, 2.0f});
  queued.on_passed_on(HeldState{9, 77, 31});
  queued.on_finish(FinishReason::Stop, {});  // after the last event: dropped
  const auto taken = stream->take(Clock::now());
  ASSERT_EQ(taken.items.size(), 4u);
  EXPECT_TRUE(taken.ended);
  EXPECT_FALSE(ends_request(taken.items[2]));
  EXPECT_TRUE(ends_request(taken.items[3]));

  std::vector<std::string> heard;
  RequestCallbacks target;
  target.on_started = [&] { heard.push_back("started"); };
  target.on_token = [&](const GeneratedToken& t) {
    heard.push_back("token " + std::to_string(t.token) + " top " + std::to_string(t.top.size()) + " cached " +
                    std::to_string(t.cached_tokens));
    return false;
  };
  target.on_embedding = [&](std::vector<float> v) { heard.push_back("embedding " + std::to_string(v.size())); };
  target.on_passed_on = [&](const HeldState& held) {
    heard.push_back("passed on " + std::to_string(held.pipeline) + "/" + std::to_string(held.sequence) + "/" +
                    std::to_string(held.positions));
  };
  std::vector<bool> answers;
  for (const TokenEvent& event : taken.items) answers.push_back(deliver(event, target, "unused"));
  EXPECT_EQ(heard,
            (std::vector<std::string>{"started", "token 42 top 2 cached 16", "embedding 2", "passed on 9/77/31"}));
  EXPECT_EQ(answers, (std::vector<bool>{true, false, true, true})) << "a token's answer is on_token's";
}

TEST(TokenStream, APassOnWithoutATakerFinishesTheRequestAsLost) {
  RequestCallbacks target;
  FinishReason reason = FinishReason::Stop;
  std::string error;
  target.on_finish = [&](FinishReason r, const std::string& e) {
    reason = r;
    error = e;
  };
  deliver(RequestPassedOn{HeldState{1, 2, 3}}, target, "its scheduler no longer leads");
  EXPECT_EQ(reason, FinishReason::Lost);
  EXPECT_EQ(error, "its scheduler no longer leads");
  deliver(RequestFinished{FinishReason::Error, "broken"}, target, "unused");
  EXPECT_EQ(reason, FinishReason::Error);
  EXPECT_EQ(error, "broken");
}

}  // namespace
}  // namespace strata::engine
