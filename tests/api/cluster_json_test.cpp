// GET /cluster's JSON from a status value made by hand: what is said of this node, of its
// peers, of the placement and of a leader's scheduler, and what is left out when it is unknown;
// and GET /health's from health values made by hand.
#include "api/cluster_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace strata::api {
namespace {

using json = nlohmann::json;
using cluster_types::ClusterStatus;
using cluster_types::PeerLink;
using cluster_types::SchedulerCounts;

cluster_types::NodeInfo info_of(const std::string& id) {
  cluster_types::NodeInfo info;
  info.node_id = id;
  info.node_address = "127.0.0.1:7001";
  info.exchange_address = "127.0.0.1:7002";
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
  status.nodes.back().info.links = {{"b", 4e-5, 9e8}};
  status.nodes.push_back({info_of("b"), false, PeerLink{true, std::nullopt, 1.5, ""}});
  status.placement.stages.push_back({.node_id = "a", .first_layer = 0, .last_layer = 5});
  status.placement.epoch = 3;
  return status;
}

TEST(ClusterStatusJson, TellsOfThisNodeItsPeersAndThePlacement) {
  const json body = json::parse(cluster_status_json(two_nodes()));
  EXPECT_EQ(body["node_id"], "a");
  EXPECT_EQ(body["model"], (json{{"name", "dreams"}, {"hash", "abc"}, {"layers", 5}}));
  EXPECT_EQ(body["protocol_version"], 9);
  ASSERT_EQ(body["nodes"].size(), 2u);
  const json& self = body["nodes"][0];
  EXPECT_TRUE(self["self"]);
  EXPECT_EQ(self["memory"], "3.0 GiB");
  EXPECT_EQ(self["exchange_address"], "127.0.0.1:7002");
  EXPECT_EQ(self["links"], (json{{{"peer", "b"}, {"latency_seconds", 4e-5}, {"bytes_per_second", 9e8}}}));
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

TEST(ClusterStatusJson, AGroupsMembersAndSharesAreShown) {
  ClusterStatus status = two_nodes();
  status.placement.stages[0].group = {{"a", "10.0.0.1:1", "10.0.0.1:2", 0.75}, {"b", "10.0.0.2:1", "10.0.0.2:2", 0.25}};
  const json body = json::parse(cluster_status_json(status));
  EXPECT_EQ(body["placement"]["stages"][0]["group"],
            (json{{{"node", "a"}, {"node_address", "10.0.0.1:1"}, {"exchange_address", "10.0.0.1:2"}, {"share", 0.75}},
                  {{"node", "b"}, {"node_address", "10.0.0.2:1"}, {"exchange_address", "10.0.0.2:2"}, {"share", 0.25}}}));
}

TEST(ClusterStatusJson, APeersProblemAndPartialWeightsAreShown) {
  ClusterStatus status = two_nodes();
  status.nodes[1].link->problem = "runs another model";
  status.nodes[1].link->last_seen_seconds = 0.25;
  cluster_types::Weights& w = *status.nodes[1].info.weights;
  w.whole_file = false;
  w.layer_bytes = {100, 0};
  w.embedding = true;
  w.fetching = true;
  w.wanted_bytes = 400;
  const json peer = json::parse(cluster_status_json(status))["nodes"][1];
  EXPECT_EQ(peer["problem"], "runs another model");
  EXPECT_EQ(peer["last_seen_seconds"], 0.25);
  EXPECT_EQ(peer["weights"]["layer_bytes"], (json{100, 0}));
  EXPECT_TRUE(peer["weights"]["embedding"]);
  EXPECT_FALSE(peer["weights"]["head"]);
  EXPECT_TRUE(peer["weights"]["fetching"]);
  EXPECT_EQ(peer["weights"]["wanted_bytes"], 400);
}

TEST(ClusterStatusJson, AKvPoolIsSaidInBlocksAndBytes) {
  ClusterStatus status = two_nodes();
  cluster_types::KvCacheStats& kv = status.nodes[0].info.kv_cache.emplace();
  kv.type = "f16";
  kv.block_bytes = 1024;
  kv.pool_blocks = 10;
  kv.used_blocks = 4;
  const json body = json::parse(cluster_status_json(status));
  const json& cache = body["nodes"][0]["kv_cache"];
  EXPECT_EQ(cache["pool_bytes"], 10240);
  EXPECT_EQ(cache["used_bytes"], 4096);
  EXPECT_EQ(cache["type"], "f16");
  EXPECT_FALSE(cache.contains("window")) << "a stage without sliding-window layers";
  EXPECT_FALSE(body["nodes"][1].contains("kv_cache"));
}

TEST(ClusterStatusJson, ASlidingWindowLayersPoolIsSaidBesideTheOther) {
  ClusterStatus status = two_nodes();
  cluster_types::KvCacheStats& kv = status.nodes[0].info.kv_cache.emplace();
  kv.block_bytes = 1024;
  kv.pool_blocks = 10;
  cluster_types::KvPoolStats& window = kv.window.emplace();
  window.type = "f16";
  window.block_bytes = 512;
  window.pool_blocks = 6;
  window.used_blocks = 2;
  const json cache = json::parse(cluster_status_json(status))["nodes"][0]["kv_cache"];
  EXPECT_EQ(cache["pool_bytes"], 10240);
  EXPECT_EQ(cache["window"]["pool_bytes"], 3072);
  EXPECT_EQ(cache["window"]["used_bytes"], 1024);
}

TEST(ClusterStatusJson, ALeaderSaysWhatItsSwitchesDidAndANodeWhatItWaitsFor) {
  ClusterStatus status = two_nodes();
  status.scheduler = SchedulerCounts{2, 1, 7};
  status.waiting_for = "a placement";
  status.leaving = true;
  const json body = json::parse(cluster_status_json(status));
  EXPECT_EQ(body["placement_switches"], (json{{"sequences_handed_over", 2}, {"sequences_recomputed", 1}}));
  EXPECT_EQ(body["sequences_preempted"], 7);
  EXPECT_EQ(body["waiting_for"], "a placement");
  EXPECT_TRUE(body["leaving"]);
}

TEST(HealthJson, SaysWhatItWaitsForUntilRequestsRun) {
  EXPECT_EQ(health_json({"ok"}), (std::pair<int, std::string>{200, R"({"status":"ok"})"}));
  EXPECT_EQ(health_json({"leaving"}), (std::pair<int, std::string>{503, R"({"status":"leaving"})"}));
  const auto [code, refused] = health_json({"refused", "this node takes no part"});
  EXPECT_EQ(code, 503);
  EXPECT_EQ(json::parse(refused), (json{{"status", "refused"}, {"waiting_for", "this node takes no part"}}));
  EXPECT_EQ(json::parse(health_json({"loading", "nodes loading their layers of placement 7: b", 0.25}).second),
            (json{{"status", "loading"}, {"waiting_for", "nodes loading their layers of placement 7: b"}, {"progress", 0.25}}));
  const json waiting =
      json::parse(health_json({"waiting", "a placement", std::nullopt, cluster_types::Weights{.fetching = true, .wanted_bytes = 100}}).second);
  EXPECT_EQ(waiting["status"], "waiting");
  EXPECT_FALSE(waiting.contains("progress"));
  EXPECT_EQ(waiting["transfer"]["fetching"], true);
  EXPECT_EQ(waiting["transfer"]["wanted_bytes"], 100);
  EXPECT_FALSE(waiting["transfer"].contains("whole_file")) << "the fetch only, not what is held";
}

}  // namespace
}  // namespace strata::api
