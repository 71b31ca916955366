// Whom a gossip round says Hello to: seeds, discovered nodes while they announce themselves,
// and known peers, each address once.
#include "cluster/hello_targets.h"

#include <gtest/gtest.h>

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;

TEST(HelloTargets, SeedsThenDiscoveredNodesThenPeersEachOnce) {
  ControlState control;
  control.seeds = {{"10.0.0.1:7000", true}, {"10.0.0.2:7000", false}};
  control.peers["b"].info.address = "10.0.0.2:7000";  // a seed that answered
  control.peers["c"].info.address = "10.0.0.3:7000";  // discovered, and a peer now
  control.peers["d"].info.address = "10.0.0.4:7000";
  control.peers["e"];                                 // heard of, its address unknown
  EXPECT_EQ(hello_targets(control, {"10.0.0.1:7000", "10.0.0.3:7000"}),
            (std::vector<std::string>{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000"}));
}

TEST(DiscoveredNodes, ANodeThatStopsAnnouncingIsForgotten) {
  DiscoveredNodes discovered;
  const ControlTime start{};
  EXPECT_TRUE(discovered.found("10.0.0.5:7000", start));
  EXPECT_FALSE(discovered.found("10.0.0.5:7000", start + 1s)) << "heard again";
  EXPECT_TRUE(discovered.found("10.0.0.6:7000", start + 2s));
  EXPECT_EQ(discovered.addresses(start + 1s + kPeerTimeout),
            (std::vector<std::string>{"10.0.0.5:7000", "10.0.0.6:7000"}));
  EXPECT_EQ(discovered.addresses(start + 1s + kPeerTimeout + 1ms), (std::vector<std::string>{"10.0.0.6:7000"}));
  EXPECT_TRUE(discovered.found("10.0.0.5:7000", start + 5s)) << "forgotten, then found anew";
}

}  // namespace
}  // namespace strata::cluster
