// Where a node's requests run, over schedulers of the test's own: a client's request counted
// until it ends, refused once the node leaves and uncounted when refused, and a request whose
// scheduler is lost going on at the next one the route names, after the tokens it has.
#include "cluster/request_router.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace strata::cluster {
namespace {

// A scheduler that keeps what it is given, for the test to answer.
class FakeScheduler final : public engine::Generator {
 public:
  engine::ModelLimits limits() const override { return {128, 4, 4}; }
  bool submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) override {
    if (throws) throw std::invalid_argument("the prompt does not fit");
    if (full) return false;
    requests.push_back(std::move(request));
    callbacks_.push_back(std::move(callbacks));
    return true;
  }
  void shutdown() override {}

  engine::RequestCallbacks& last() { return callbacks_.back(); }

  bool full = false;
  bool throws = false;
  std::vector<engine::GenerationRequest> requests;

 private:
  std::vector<engine::RequestCallbacks> callbacks_;
};

class RequestRouterTest : public ::testing::Test {
 protected:
  RequestRouterTest()
      : router_(rpc::Caller{"a", 0, std::make_shared<rpc::ClusterKey>("secret")},
                {.node_id = "a",
                 .startup_wait = std::chrono::milliseconds(1000),
                 .route = [this](RouteClock::time_point) { return Route{routes_.at(routed_++), {}}; },
                 .wait_for_change = [](RouteClock::time_point) { return false; },
                 .on_client_done = [this] { ++done_; },
                 .log = {}}) {}

  engine::RequestCallbacks client() {
    engine::RequestCallbacks callbacks;
    callbacks.on_token = [this](const engine::GeneratedToken& token) {
      tokens_.push_back(token.token);
      return true;
    };
    callbacks.on_finish = [this](engine::FinishReason reason, const std::string&) { finished_.push_back(reason); };
    return callbacks;
  }

  engine::GenerationRequest request() {
    engine::GenerationRequest r;
    r.prompt = {1, 2, 3};
    r.max_tokens = 4;
    return r;
  }

  std::shared_ptr<FakeScheduler> first_ = std::make_shared<FakeScheduler>();
  std::shared_ptr<FakeScheduler> second_ = std::make_shared<FakeScheduler>();
  std::vector<std::shared_ptr<engine::Generator>> routes_{first_, second_};
  size_t routed_ = 0;
  int done_ = 0;
  std::vector<engine::Token> tokens_;
  std::vector<engine::FinishReason> finished_;
  RequestRouter router_;
};

TEST_F(RequestRouterTest, AClientsRequestIsCountedUntilItEnds) {
  ASSERT_TRUE(router_.submit_for_client(request(), client()));
  EXPECT_EQ(router_.client_requests(), 1);
  first_->last().on_token(engine::GeneratedToken{7});
  first_->last().on_finish(engine::FinishReason::Stop, {});
  EXPECT_EQ(router_.client_requests(), 0);
  EXPECT_EQ(done_, 1);
  EXPECT_EQ(tokens_, std::vector<engine::Token>{7});
  EXPECT_EQ(finished_, std::vector<engine::FinishReason>{engine::FinishReason::Stop});
}

TEST_F(RequestRouterTest, ARefusedRequestIsNotCounted) {
  first_->full = true;
  EXPECT_FALSE(router_.submit_for_client(request(), client()));
  EXPECT_EQ(router_.client_requests(), 0);
  second_->throws = true;
  EXPECT_THROW(router_.submit_for_client(request(), client()), std::invalid_argument);
  EXPECT_EQ(router_.client_requests(), 0);
  EXPECT_EQ(done_, 2);
  EXPECT_TRUE(finished_.empty()) << "the callbacks of a refused request are never called";
}

TEST_F(RequestRouterTest, ALeavingNodeRefusesItsClientsButNotResumedRequests) {
  ASSERT_TRUE(router_.submit_for_client(request(), client()));
  router_.close_to_clients();
  try {
    router_.submit_for_client(request(), client());
    FAIL() << "a leaving node took a request";
  } catch (const engine::Unavailable& e) {
    EXPECT_EQ(std::string(e.what()), "node a is leaving the cluster: send requests to another node");
    EXPECT_EQ(e.retry_after_seconds, 1);
  }
  first_->last().on_finish(engine::FinishReason::Lost, "the node running the request was lost: gone");
  EXPECT_EQ(second_->requests.size(), 1u) << "a request already in flight goes on";
  EXPECT_EQ(router_.client_requests(), 1);
}

TEST_F(RequestRouterTest, ARequestWhoseSchedulerIsLostGoesOnAtTheNextAfterItsTokens) {
  ASSERT_TRUE(router_.submit_for_client(request(), client()));
  first_->last().on_token(engine::GeneratedToken{7});
  first_->last().on_finish(engine::FinishReason::Lost, "the node running the request was lost: gone");
  EXPECT_TRUE(finished_.empty()) << "a lost scheduler is not the request's end";
  ASSERT_EQ(second_->requests.size(), 1u);
  const engine::GenerationRequest& rest = second_->requests[0];
  EXPECT_EQ(rest.prompt, (std::vector<engine::Token>{1, 2, 3, 7}));
  EXPECT_EQ(rest.resumed_after, 1);
  EXPECT_EQ(rest.max_tokens, 3);
  second_->last().on_token(engine::GeneratedToken{8});
  second_->last().on_finish(engine::FinishReason::Length, {});
  EXPECT_EQ(tokens_, (std::vector<engine::Token>{7, 8}));
  EXPECT_EQ(finished_, std::vector<engine::FinishReason>{engine::FinishReason::Length});
  EXPECT_EQ(router_.client_requests(), 0);
}

}  // namespace
}  // namespace strata::cluster
