// A request whose scheduler is lost or passes it on: what goes on at the next scheduler, and
// what its client is told, with schedulers played by hand.
#include "cluster/resumable_request.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata::cluster {
namespace {

struct Client {
  std::vector<engine::GeneratedToken> tokens;
  std::vector<std::pair<engine::FinishReason, std::string>> finishes;
  engine::RequestCallbacks callbacks() {
    engine::RequestCallbacks c;
    c.on_token = [this](const engine::GeneratedToken& t) {
      tokens.push_back(t);
      return true;
    };
    c.on_finish = [this](engine::FinishReason reason, const std::string& error) { finishes.emplace_back(reason, error); };
    return c;
  }
};

// Takes every request resubmitted, as the next scheduler would.
struct NextScheduler {
  std::vector<engine::GenerationRequest> requests;
  std::vector<engine::RequestCallbacks> callbacks;
  bool accepts = true;
  Resubmit resubmit() {
    return [this](engine::GenerationRequest request, engine::RequestCallbacks c) {
      if (!accepts) return false;
      requests.push_back(std::move(request));
      callbacks.push_back(std::move(c));
      return true;
    };
  }
};

engine::GenerationRequest request_of(std::vector<engine::Token> prompt, int max_tokens) {
  engine::GenerationRequest request;
  request.prompt = std::move(prompt);
  request.max_tokens = max_tokens;
  return request;
}

engine::GeneratedToken token(engine::Token t, int cached_tokens = 0, bool end = false) {
  engine::GeneratedToken g;
  g.token = t;
  g.cached_tokens = cached_tokens;
  g.end_of_generation = end;
  return g;
}

TEST(ResumableRequest, ALostSchedulersRequestGoesOnFromItsTokensAtTheNext) {
  Client client;
  NextScheduler next;
  std::vector<std::string> logged;
  engine::RequestCallbacks first = resumable(request_of({1, 2}, 5), client.callbacks(), next.resubmit(),
                                             [&](const std::string& line) { logged.push_back(line); });
  ASSERT_TRUE(first.on_token(token(10)));
  ASSERT_TRUE(first.on_token(token(11)));
  first.on_finish(engine::FinishReason::Lost, "gone");

  ASSERT_EQ(next.requests.size(), 1u);
  EXPECT_EQ(next.requests[0].prompt, (std::vector<engine::Token>{1, 2, 10, 11}));
  EXPECT_EQ(next.requests[0].max_tokens, 3);
  EXPECT_EQ(next.requests[0].resumed_after, 2);
  EXPECT_FALSE(next.requests[0].held.has_value());
  EXPECT_TRUE(client.finishes.empty());
  ASSERT_EQ(logged.size(), 1u);

  ASSERT_TRUE(next.callbacks[0].on_token(token(12)));
  next.callbacks[0].on_finish(engine::FinishReason::Length, {});
  ASSERT_EQ(client.tokens.size(), 3u);
  EXPECT_EQ(client.tokens[2].token, 12);
  ASSERT_EQ(client.finishes.size(), 1u);
  EXPECT_EQ(client.finishes[0].first, engine::FinishReason::Length);
}

TEST(ResumableRequest, APassedOnRequestGoesOnWithItsState) {
  Client client;
  NextScheduler next;
  engine::RequestCallbacks first = resumable(request_of({1}, 4), client.callbacks(), next.resubmit(), {});
  first.on_token(token(7));
  first.on_passed_on(engine::HeldState{3, 42, 2});
  ASSERT_EQ(next.requests.size(), 1u);
  ASSERT_TRUE(next.requests[0].held.has_value());
  EXPECT_EQ(next.requests[0].held->sequence, 42u);
  EXPECT_EQ(next.requests[0].resumed_after, 1);
}

TEST(ResumableRequest, OnlyTheNewsOfItsEndLostFinishesWithoutAnotherScheduler) {
  Client client;
  NextScheduler next;
  engine::RequestCallbacks ended = resumable(request_of({1}, 4), client.callbacks(), next.resubmit(), {});
  ended.on_token(token(9, 0, true));
  ended.on_finish(engine::FinishReason::Lost, "gone");
  engine::RequestCallbacks full = resumable(request_of({1}, 1), client.callbacks(), next.resubmit(), {});
  full.on_token(token(9));
  full.on_finish(engine::FinishReason::Lost, "gone");

  EXPECT_TRUE(next.requests.empty());
  ASSERT_EQ(client.finishes.size(), 2u);
  EXPECT_EQ(client.finishes[0].first, engine::FinishReason::Stop);
  EXPECT_EQ(client.finishes[1].first, engine::FinishReason::Length);
}

TEST(ResumableRequest, TheClientKeepsBeingToldTheFirstSchedulersCachedTokens) {
  Client client;
  NextScheduler next;
  engine::RequestCallbacks first = resumable(request_of({1, 2, 3}, 4), client.callbacks(), next.resubmit(), {});
  first.on_token(token(10, 2));
  first.on_finish(engine::FinishReason::Lost, "gone");
  ASSERT_EQ(next.callbacks.size(), 1u);
  next.callbacks[0].on_token(token(11, 4));  // the resumption's prompt, cached at the next scheduler
  ASSERT_EQ(client.tokens.size(), 2u);
  EXPECT_EQ(client.tokens[0].cached_tokens, 2);
  EXPECT_EQ(client.tokens[1].cached_tokens, 2);
}

TEST(ResumableRequest, ARequestNoSchedulerTakesEndsWithTheLossAndTheRefusal) {
  Client client;
  NextScheduler next;
  next.accepts = false;
  engine::RequestCallbacks first = resumable(request_of({1}, 4), client.callbacks(), next.resubmit(), {});
  first.on_token(token(5));
  first.on_finish(engine::FinishReason::Lost, "the node running the request was lost: b");
  ASSERT_EQ(client.finishes.size(), 1u);
  EXPECT_EQ(client.finishes[0].first, engine::FinishReason::Error);
  EXPECT_EQ(client.finishes[0].second, "the node running the request was lost: b; too many requests are waiting");
}

}  // namespace
}  // namespace strata::cluster
