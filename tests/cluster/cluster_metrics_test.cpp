// /metrics' cluster samples from a status value made by hand: a peer that is gone, one that
// was never reached directly, this node's lead and its scheduler's load.
#include "cluster/cluster_metrics.h"

#include <gtest/gtest.h>

namespace strata::cluster {
namespace {

using cluster_types::ClusterStatus;
using cluster_types::PeerLink;
using cluster_types::SchedulerCounts;

cluster_types::NodeInfo info_of(const std::string& id) {
  cluster_types::NodeInfo info;
  info.node_id = id;
  info.state = "ready";
  return info;
}

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(ClusterMetrics, SaysWhichNodesAreUpTheirLinksAndTheLeadersLoad) {
  ClusterStatus status;
  status.node_id = "a";
  status.leader = "a";
  status.nodes.push_back({info_of("a"), true, std::nullopt});
  status.nodes.push_back({info_of("b"), false, PeerLink{false, 2.0, 1.5, ""}});
  status.nodes.push_back({info_of("c"), false, PeerLink{true, std::nullopt, 0.0, ""}});
  status.placement.stages.push_back({.node_id = "a", .first_layer = 0, .last_layer = 5});
  status.placement.epoch = 4;
  status.scheduler = SchedulerCounts{1, 2, 3};
  metrics::Exposition out;
  write_metrics(status, {7, 2}, out);
  const std::string text = out.text();

  EXPECT_TRUE(has_line(text, R"(strata_node_up{node="a"} 1)")) << text;
  EXPECT_TRUE(has_line(text, R"(strata_node_up{node="b"} 0)"));
  EXPECT_TRUE(has_line(text, R"(strata_node_up{node="c"} 1)"));
  EXPECT_TRUE(has_line(text, R"(strata_link_heartbeat_rtt_seconds{peer="b"} 0.0015)"));
  EXPECT_EQ(text.find(R"(strata_link_heartbeat_rtt_seconds{peer="c"})"), std::string::npos)
      << "no round trip to a peer never reached";
  EXPECT_TRUE(has_line(text, R"(strata_placement_stage_layers{node="a",layers="0-4"} 5)"));
  EXPECT_TRUE(has_line(text, "strata_placement_epoch 4"));
  EXPECT_TRUE(has_line(text, "strata_is_leader 1"));
  EXPECT_TRUE(has_line(text, "strata_sequences_preempted_total 3"));
  EXPECT_TRUE(has_line(text, "strata_requests_waiting 7"));
  EXPECT_TRUE(has_line(text, "strata_requests_running 2"));
  EXPECT_TRUE(has_line(text, "strata_weights_fetch_progress 1")) << "nothing wanted is all received";
  EXPECT_EQ(text.find("strata_kv_blocks"), std::string::npos) << "a node without a stage has no KV pool";
}

// A stage with sliding-window layers says their pool's blocks beside the other pool's.
TEST(ClusterMetrics, SaysBothKvPoolsOfAStageWithSlidingWindowLayers) {
  ClusterStatus status;
  status.node_id = "a";
  status.leader = "a";
  cluster_types::NodeInfo a = info_of("a");
  cluster_types::KvCacheStats& kv = a.kv_cache.emplace();
  kv.pool_blocks = 40;
  kv.used_blocks = 10;
  kv.window = cluster_types::KvPoolStats{.block_bytes = 512, .pool_blocks = 6, .used_blocks = 4, .pinned_blocks = 3};
  status.nodes.push_back({a, true, std::nullopt});
  metrics::Exposition out;
  write_metrics(status, {0, 0}, out);
  const std::string text = out.text();
  EXPECT_TRUE(has_line(text, R"(strata_kv_blocks{state="free"} 30)")) << text;
  EXPECT_TRUE(has_line(text, R"(strata_kv_window_blocks{state="used"} 4)"));
  EXPECT_TRUE(has_line(text, R"(strata_kv_window_blocks{state="pinned"} 3)"));
  EXPECT_TRUE(has_line(text, R"(strata_kv_window_blocks{state="free"} 2)"));
  EXPECT_TRUE(has_line(text, "strata_kv_window_pool_blocks 6"));
  EXPECT_TRUE(has_line(text, "strata_kv_window_block_bytes 512"));
}

}  // namespace
}  // namespace strata::cluster
