// Gossip's rounds against a node of the test's own: every address greeted, the round acting as
// soon as its Hellos have answered, a silent peer holding up only its own Hello and told the
// news once that returns, act_now starting a round at once, and stop waiting for the Hellos.
#include "cluster/gossip.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A node whose Hellos to the addresses in `blocked` do not return until released.
class FakeNode {
 public:
  explicit FakeNode(std::vector<std::string> targets) : targets_(std::move(targets)) {}

  GossipHost host() {
    return {.round = [this] {
              std::lock_guard lock(mutex_);
              return std::pair{targets_, message()};
            },
            .news = [this] {
              std::lock_guard lock(mutex_);
              return news_;
            },
            .message = [this] {
              std::lock_guard lock(mutex_);
              return message();
            },
            .greet =
                [this](const std::string& address, const cluster_types::Hello& hello) {
                  std::unique_lock lock(mutex_);
                  greeted_.push_back({address, hello.placement.epoch});
                  changed_.notify_all();
                  changed_.wait(lock, [&] { return !blocked_.contains(address); });
                  return true;
                },
            .act = [this] {
              std::lock_guard lock(mutex_);
              ++acts_;
              changed_.notify_all();
            }};
  }

  void block(const std::string& address) {
    std::lock_guard lock(mutex_);
    blocked_.insert(address);
  }
  void release(const std::string& address) {
    std::lock_guard lock(mutex_);
    blocked_.erase(address);
    changed_.notify_all();
  }
  void new_placement(uint64_t epoch) {
    std::lock_guard lock(mutex_);
    news_.epoch = epoch;
  }
  // Waits up to 10 s for `done`, asked under the node's lock.
  bool wait(const std::function<bool()>& done) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 10s, done);
  }
  int greetings(const std::string& address, uint64_t epoch) const {
    int count = 0;
    for (const auto& [to, said] : greeted_) count += to == address && said == epoch;
    return count;
  }
  int acts() const { return acts_; }
  std::mutex& mutex() { return mutex_; }

 private:
  HelloMessage message() const {
    HelloMessage m{{}, news_};
    m.hello.placement.epoch = news_.epoch;
    return m;
  }

  std::vector<std::string> targets_;
  std::mutex mutex_;
  std::condition_variable changed_;
  HelloNews news_{1, "a", 0, false, false};
  std::set<std::string> blocked_;
  std::vector<std::pair<std::string, uint64_t>> greeted_;  // address, the placement its Hello said
  int acts_ = 0;
};

TEST(Gossip, ARoundActsAsSoonAsItsHellosHaveAnswered) {
  FakeNode node({"x", "y"});
  Gossip gossip(node.host(), GossipTiming{.interval = 10s, .hello_wait = 60s});
  gossip.start();
  ASSERT_TRUE(node.wait([&] { return node.acts() == 1; })) << "it did not wait out its 60 s for answers";
  std::lock_guard lock(node.mutex());
  EXPECT_EQ(node.greetings("x", 1), 1);
  EXPECT_EQ(node.greetings("y", 1), 1);
}

TEST(Gossip, ActNowStartsTheNextRoundAtOnce) {
  FakeNode node({"x"});
  Gossip gossip(node.host(), GossipTiming{.interval = 60s, .hello_wait = 60s});
  gossip.start();
  ASSERT_TRUE(node.wait([&] { return node.acts() == 1; }));
  gossip.act_now();
  EXPECT_TRUE(node.wait([&] { return node.acts() == 2 && node.greetings("x", 1) == 2; }))
      << "the second round waited out the interval";
}

TEST(Gossip, ASilentPeerHoldsUpOnlyItsOwnHelloAndHearsTheNewsWhenItReturns) {
  FakeNode node({"silent", "fast"});
  node.block("silent");
  Gossip gossip(node.host(), GossipTiming{.interval = 60s, .hello_wait = 20ms});
  gossip.start();
  ASSERT_TRUE(node.wait([&] { return node.acts() == 1; })) << "the round waits for its answers only so long";
  node.new_placement(2);
  gossip.act_now();
  ASSERT_TRUE(node.wait([&] { return node.acts() == 2 && node.greetings("fast", 2) >= 1; }));
  {
    std::lock_guard lock(node.mutex());
    EXPECT_EQ(node.greetings("silent", 1), 1);
    EXPECT_EQ(node.greetings("silent", 2), 0) << "a Hello in flight is passed by, not doubled";
  }
  node.release("silent");
  EXPECT_TRUE(node.wait([&] { return node.greetings("silent", 2) == 1; }))
      << "the news that came while its Hello was in flight goes out once it returns";
}

TEST(Gossip, StopWaitsForTheHellosInFlight) {
  FakeNode node({"silent"});
  node.block("silent");
  auto gossip = std::make_unique<Gossip>(node.host(), GossipTiming{.interval = 10ms, .hello_wait = 10ms});
  gossip->start();
  ASSERT_TRUE(node.wait([&] { return node.greetings("silent", 1) == 1; }));
  std::thread releaser([&] {
    std::this_thread::sleep_for(100ms);
    node.release("silent");
  });
  const auto started = Clock::now();
  gossip->stop();
  EXPECT_GE(Clock::now() - started, 90ms) << "stop returned before the Hello in flight";
  releaser.join();
  std::lock_guard lock(node.mutex());
  EXPECT_EQ(node.greetings("silent", 1), 1) << "a Hello that returns after stop is not said again";
}

}  // namespace
}  // namespace strata::cluster
