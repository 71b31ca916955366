// What a node says it waits for, and GET /health's answer, from progress values made by hand
// (its JSON: tests/api/cluster_json_test.cpp).
#include "cluster/node_progress.h"

#include <gtest/gtest.h>

namespace strata::cluster {
namespace {

NodeProgress placed(std::vector<std::string> unready) {
  NodeProgress p;
  p.placed = true;
  p.epoch = 7;
  p.leader = "a";
  p.members = 3;
  p.unready = std::move(unready);
  return p;
}

TEST(NodeProgress, ItWaitsForAPlacementThenItsNodesThenTheLeader) {
  NodeProgress none;
  none.members = 2;
  EXPECT_EQ(waiting_for(none),
            "a placement (2 node(s) known; the leader places the model once the members have settled)");
  EXPECT_EQ(waiting_for(placed({"b", "c"})), "nodes loading their layers of placement 7: b, c");
  EXPECT_EQ(waiting_for(placed({})), "the leader a to start its scheduler");
  NodeProgress failed = placed({"b"});
  failed.placement_error = "the model does not fit this cluster: 1 GiB missing";
  EXPECT_EQ(waiting_for(failed), failed.placement_error);
  failed.refusal = "this node takes no part: node id 'a' is taken";
  EXPECT_EQ(waiting_for(failed), failed.refusal) << "a refusal comes first";
}

TEST(NodeProgress, HealthSaysWhatItWaitsForUntilRequestsRun) {
  using cluster_types::NodeHealth;
  NodeProgress p = placed({"b"});
  p.loading = true;
  p.load_progress = 0.25;
  EXPECT_EQ(health(p), (NodeHealth{"loading", "nodes loading their layers of placement 7: b", 0.25}));
  p.loading = false;
  p.fetched = cluster_types::Weights{.fetching = true, .wanted_bytes = 100};
  EXPECT_EQ(health(p), (NodeHealth{"waiting", "nodes loading their layers of placement 7: b", std::nullopt, p.fetched}));
  p.serving = true;
  EXPECT_EQ(health(p), NodeHealth{"ok"});
  p.refusal = "this node takes no part";
  EXPECT_EQ(health(p), (NodeHealth{"refused", "this node takes no part"}));
  p.leaving = true;
  EXPECT_EQ(health(p), NodeHealth{"leaving"});
}

TEST(NodeProgress, ARequestWaitsOnlyForWhatWillCome) {
  NodeProgress p = placed({"a"});
  p.loading = true;
  p.load_progress = 0.4;
  EXPECT_EQ(readiness(p), "nodes loading their layers of placement 7: a (this node has 40% of its layers)");
  p.serving = true;
  EXPECT_EQ(readiness(p), "") << "it runs now";
  p.serving = false;
  p.stopping = true;
  EXPECT_EQ(readiness(p), "") << "refused at once";
  p.stopping = false;
  p.placement_error = "the model does not fit this cluster";
  EXPECT_EQ(readiness(p), "") << "refused at once";
  p.refusal = "this node takes no part";
  EXPECT_EQ(readiness(p), "this node takes no part");
}

TEST(NodeProgress, ANodesStateSaysTheFirstOfWhatHoldsForIt) {
  NodeProgress p;
  EXPECT_EQ(node_state(p), "starting");
  p.placed = true;
  EXPECT_EQ(node_state(p), "idle") << "placed without it";
  p.holds_current_stage = true;
  EXPECT_EQ(node_state(p), "ready");
  p.loading = true;
  EXPECT_EQ(node_state(p), "loading") << "a new placement's layers";
  p.fetching = true;
  EXPECT_EQ(node_state(p), "fetching");
  p.scheduling = true;
  EXPECT_EQ(node_state(p), "serving");
  p.refusal = "this node takes no part";
  EXPECT_EQ(node_state(p), "refused");
}

}  // namespace
}  // namespace strata::cluster
