// The link meter against a measure of the test's own: each peer process measured once, again
// when it restarts or moves, forgotten when gone, a failure tried again; peers without group
// links never measured.
#include "cluster/link_meter.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace strata::cluster {
namespace {

using std::chrono::milliseconds;

// Counts measurements by address; an address in `failing` throws.
struct FakeLinks {
  std::mutex mutex;
  std::map<std::string, int> measured;
  std::map<std::string, bool> failing;
  std::atomic<int> told{0};
  std::vector<std::string> logged;

  LinkMeter meter(milliseconds retry = milliseconds(10'000)) {
    return LinkMeter(
        [this](const std::string& address) {
          std::lock_guard lock(mutex);
          ++measured[address];
          if (failing[address]) throw std::runtime_error("refused");
          return cluster_types::LinkMeasure{"", 1e-4 * static_cast<double>(address.size()), 1e8};
        },
        [this] { ++told; },
        [this](const std::string& line) {
          std::lock_guard lock(mutex);
          logged.push_back(line);
        },
        retry);
  }
  int times(const std::string& address) {
    std::lock_guard lock(mutex);
    return measured[address];
  }
};

std::vector<cluster_types::NodeInfo> peers(const std::vector<std::array<std::string, 3>>& id_instance_address) {
  std::vector<cluster_types::NodeInfo> infos;
  for (const auto& [id, instance, address] : id_instance_address) {
    cluster_types::NodeInfo info;
    info.node_id = id;
    info.instance = instance;
    info.exchange_address = address;
    infos.push_back(info);
  }
  return infos;
}

// Waits until `done` holds (or 5 s pass, and the test fails on what it expects next).
template <typename Done>
void wait_for(Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(milliseconds(2));
}

TEST(LinkMeter, MeasuresEachPeerProcessOnce) {
  FakeLinks fake;
  LinkMeter meter = fake.meter();
  meter.track(peers({{"b", "b1", "10.0.0.2:9000"}, {"c", "c1", "10.0.0.3:9000"}, {"d", "d1", ""}, {"e", "e1", ":9000"}}));
  wait_for([&] { return meter.links().size() == 2; });
  const std::vector<cluster_types::LinkMeasure> links = meter.links();
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0].peer_id, "b");
  EXPECT_EQ(links[1].peer_id, "c");
  EXPECT_DOUBLE_EQ(links[0].latency_seconds, 1.3e-3);  // the fake's, by the address's length
  EXPECT_EQ(meter.measured_peers(), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(fake.told.load(), 2);
  // The same peers again: nothing new to measure.
  meter.track(peers({{"b", "b1", "10.0.0.2:9000"}, {"c", "c1", "10.0.0.3:9000"}}));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(fake.times("10.0.0.2:9000"), 1);
  EXPECT_EQ(fake.times("10.0.0.3:9000"), 1);
}

TEST(LinkMeter, MeasuresARestartedOrMovedPeerAgainAndForgetsOneGone) {
  FakeLinks fake;
  LinkMeter meter = fake.meter();
  meter.track(peers({{"b", "b1", "10.0.0.2:9000"}, {"c", "c1", "10.0.0.3:9000"}}));
  wait_for([&] { return meter.links().size() == 2; });
  meter.track(peers({{"b", "b2", "10.0.0.2:9000"}, {"c", "c1", "10.0.0.33:9000"}}));
  // Until measured again, neither link is said.
  wait_for([&] { return fake.times("10.0.0.33:9000") == 1 && meter.links().size() == 2; });
  EXPECT_EQ(fake.times("10.0.0.2:9000"), 2);
  EXPECT_DOUBLE_EQ(meter.links()[1].latency_seconds, 1.4e-3);
  meter.track(peers({{"c", "c1", "10.0.0.33:9000"}}));
  const std::vector<cluster_types::LinkMeasure> links = meter.links();
  ASSERT_EQ(links.size(), 1u);
  EXPECT_EQ(links[0].peer_id, "c");
}

TEST(LinkMeter, TriesAFailedLinkAgainAndSaysSoOnce) {
  FakeLinks fake;
  fake.failing["10.0.0.2:9000"] = true;
  LinkMeter meter = fake.meter(milliseconds(30));
  meter.track(peers({{"b", "b1", "10.0.0.2:9000"}}));
  wait_for([&] { return fake.times("10.0.0.2:9000") >= 3; });
  EXPECT_GE(fake.times("10.0.0.2:9000"), 3);
  EXPECT_TRUE(meter.links().empty());
  {
    std::lock_guard lock(fake.mutex);
    ASSERT_EQ(fake.logged.size(), 1u);
    EXPECT_EQ(fake.logged[0], "the link to b could not be measured (it is tried again): refused");
    fake.failing["10.0.0.2:9000"] = false;
  }
  wait_for([&] { return meter.links().size() == 1; });
  EXPECT_EQ(meter.links().size(), 1u);
}

TEST(LinkMeter, StopsWhileAPeerKeepsFailing) {
  FakeLinks fake;
  fake.failing["10.0.0.2:9000"] = true;
  LinkMeter meter = fake.meter(milliseconds(60'000));
  meter.track(peers({{"b", "b1", "10.0.0.2:9000"}}));
  wait_for([&] { return fake.times("10.0.0.2:9000") == 1; });
  const auto start = std::chrono::steady_clock::now();
  meter.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

}  // namespace
}  // namespace strata::cluster
