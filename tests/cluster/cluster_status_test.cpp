// GET /cluster's JSON from a status value made by hand: what is said of this node, of its
// peers, of the placement and of a leader's scheduler, and what is left out when it is unknown.
#include "cluster/cluster_status.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace strata::cluster {
namespace {

using json = nlohmann::json;

cluster_types::NodeInfo info_of(const std::string& id) {
  cluster_types::NodeInfo info;
  info.node_id = id;
  info.node_address = "127.0.0.1:7001";
  info.memory_bytes = uint64_t{3} << 30;
  info.state = "serving";
  info.weights = cluster_types::Weights{.whole_file = true};
  return info;
}

ClusterStatus two_nodes() {
  ClusterStatus status;
  status.node_id = "a";
  status.model_name = "dreams";
  status.model_hash = "abc";
  status.layers = 5;
  status.protocol_version = 9;
  status.leader = "a";
  status.serving = true;
  status.nodes.push_back({info_of("a"), true, std::nullopt});
  status.nodes.push_back({info_of("b"), false, PeerLink{true, std::nullopt, 1.5, ""}});
  status.placement.stages.push_back({.node_id = "a", .first_layer = 0, .last_layer = 5});
  status.placement.epoch = 3;
  return status;
}

TEST(ClusterStatus, TellsOfThisNodeItsPeersAndThePlacement) {
  const json body = json::parse(status_json(two_nodes()));
  EXPECT_EQ(body["node_id"], "a");
  EXPECT_EQ(body["model"], (json{{"name", "dreams"}, {"hash", "abc"}, {"layers", 5}}));
  EXPECT_EQ(body["protocol_version"], 9);
  ASSERT_EQ(body["nodes"].size(), 2u);
  const json& self = body["nodes"][0];
  EXPECT_TRUE(self["self"]);
  EXPECT_EQ(self["memory"], "3.0 GiB");
  EXPECT_FALSE(self.contains("alive")) << "a node's link to itself is no link";
  EXPECT_TRUE(self["weights"]["whole_file"]);
  EXPECT_FALSE(self["weights"].contains("layer_bytes"));
  const json& peer = body["nodes"][1];
  EXPECT_TRUE(peer["alive"]);
  EXPECT_EQ(peer["last_seen_seconds"], -1.0) << "never reached directly";
  EXPECT_EQ(peer["rtt_ms"], 1.5);
  EXPECT_FALSE(peer.contains("problem"));
  EXPECT_EQ(body["placement"]["epoch"], 3);
  EXPECT_EQ(body["placement"]["stages"][0], (json{{"node", "a"}, {"node_address", ""}, {"first_layer", 0}, {"last_layer", 5}}));
  for (const char* unknown : {"waiting_for", "placement_switches", "sequences_preempted", "leaving"}) {
    EXPECT_FALSE(body.contains(unknown)) << unknown;
  }
}

TEST(ClusterStatus, APeersProblemAndPartialWeightsAreShown) {
  ClusterStatus status = two_nodes();
  status.nodes[1].link->problem = "runs another model";
  status.nodes[1].link->last_seen_seconds = 0.25;
  cluster_types::Weights& w = *status.nodes[1].info.weights;
  w.whole_file = false;
  w.layer_bytes = {100, 0};
  w.embedding = true;
  w.fetching = true;
  w.wanted_bytes = 400;
  const json peer = json::parse(status_json(status))["nodes"][1];
  EXPECT_EQ(peer["problem"], "runs another model");
  EXPECT_EQ(peer["last_seen_seconds"], 0.25);
  EXPECT_EQ(peer["weights"]["layer_bytes"], (json{100, 0}));
  EXPECT_TRUE(peer["weights"]["embedding"]);
  EXPECT_FALSE(peer["weights"]["head"]);
  EXPECT_TRUE(peer["weights"]["fetching"]);
  EXPECT_EQ(peer["weights"]["wanted_bytes"], 400);
}

TEST(ClusterStatus, AKvPoolIsSaidInBlocksAndBytes) {
  ClusterStatus status = two_nodes();
  cluster_types::KvCacheStats& kv = status.nodes[0].info.kv_cache.emplace();
  kv.type = "f16";
  kv.block_bytes = 1024;
  kv.pool_blocks = 10;
  kv.used_blocks = 4;
  const json body = json::parse(status_json(status));
  const json& cache = body["nodes"][0]["kv_cache"];
  EXPECT_EQ(cache["pool_bytes"], 10240);
  EXPECT_EQ(cache["used_bytes"], 4096);
  EXPECT_EQ(cache["type"], "f16");
  EXPECT_FALSE(cache.contains("window")) << "a stage without sliding-window layers";
  EXPECT_FALSE(body["nodes"][1].contains("kv_cache"));
}

TEST(ClusterStatus, ASlidingWindowLayersPoolIsSaidBesideTheOther) {
  ClusterStatus status = two_nodes();
  cluster_types::KvCacheStats& kv = status.nodes[0].info.kv_cache.emplace();
  kv.block_bytes = 1024;
  kv.pool_blocks = 10;
  cluster_types::KvPoolStats& window = kv.window.emplace();
  window.type = "f16";
  window.block_bytes = 512;
  window.pool_blocks = 6;
  window.used_blocks = 2;
  const json cache = json::parse(status_json(status))["nodes"][0]["kv_cache"];
  EXPECT_EQ(cache["pool_bytes"], 10240);
  EXPECT_EQ(cache["window"]["pool_bytes"], 3072);
  EXPECT_EQ(cache["window"]["used_bytes"], 1024);
}

TEST(ClusterStatus, ALeaderSaysWhatItsSwitchesDidAndANodeWhatItWaitsFor) {
  ClusterStatus status = two_nodes();
  status.scheduler = SchedulerCounts{2, 1, 7};
  status.waiting_for = "a placement";
  status.leaving = true;
  const json body = json::parse(status_json(status));
  EXPECT_EQ(body["placement_switches"], (json{{"sequences_handed_over", 2}, {"sequences_recomputed", 1}}));
  EXPECT_EQ(body["sequences_preempted"], 7);
  EXPECT_EQ(body["waiting_for"], "a placement");
  EXPECT_TRUE(body["leaving"]);
}

}  // namespace
}  // namespace strata::cluster
