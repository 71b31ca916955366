#include "cluster/cluster_metrics.h"

#include <algorithm>
#include <string>

namespace strata::cluster {
namespace {

void write_node(const cluster_types::NodeInfo& info, bool up, metrics::Exposition& out) {
  const metrics::Labels node{{"node", info.node_id}};
  out.gauge("strata_node_up", "Whether this node hears from the node (1), or takes it for gone (0).", node, up);
  out.gauge("strata_node_state", "The node's state: 1 for the state it is in.",
            {{"node", info.node_id}, {"state", info.state}}, 1);
  out.gauge("strata_node_memory_bytes", "Memory the node may use for weights and KV cache.", node,
            static_cast<double>(info.memory_bytes));
  out.gauge("strata_node_weight_bytes_per_second", "The node's measured speed at reading weights.", node,
            info.weight_bytes_per_second);
}

void write_kv_pool(const cluster_types::KvCacheStats& kv, metrics::Exposition& out) {
  const double pinned = kv.pinned_blocks;
  const double used = kv.used_blocks;
  out.gauge("strata_kv_blocks", "This node's KV pool blocks: used by running sequences (pinned: also by a "
            "sequence starting on a cached prefix), cached (held for later prefixes only) or free.",
            {{"state", "used"}}, used);
  out.gauge("strata_kv_blocks", "", {{"state", "pinned"}}, pinned);
  out.gauge("strata_kv_blocks", "", {{"state", "free"}}, std::max(0.0, kv.pool_blocks - used));
  out.gauge("strata_kv_pool_blocks", "Blocks of this node's KV pool.", {}, kv.pool_blocks);
  out.gauge("strata_kv_block_bytes", "Bytes of one KV block of this node's layers.", {},
            static_cast<double>(kv.block_bytes));
  out.counter("strata_prefix_cache_hits_total", "Blocks a new sequence found in this node's prefix cache.", {},
              static_cast<double>(kv.hits));
  out.counter("strata_prefix_cache_misses_total", "Blocks a new sequence looked for and did not find.", {},
              static_cast<double>(kv.misses));
  out.counter("strata_kv_evictions_total", "Cached blocks given to other sequences.", {},
              static_cast<double>(kv.evictions));
  if (!kv.window) return;
  const cluster_types::KvPoolStats& window = *kv.window;
  const double window_used = window.used_blocks;
  out.gauge("strata_kv_window_blocks", "This node's blocks of its sliding-window layers' KV pool, which a sequence "
            "lets go as its window moves on: used, pinned or free, as strata_kv_blocks.",
            {{"state", "used"}}, window_used);
  out.gauge("strata_kv_window_blocks", "", {{"state", "pinned"}}, window.pinned_blocks);
  out.gauge("strata_kv_window_blocks", "", {{"state", "free"}}, std::max(0.0, window.pool_blocks - window_used));
  out.gauge("strata_kv_window_pool_blocks", "Blocks of this node's sliding-window layers' KV pool.", {},
            window.pool_blocks);
  out.gauge("strata_kv_window_block_bytes", "Bytes of one block of this node's sliding-window layers.", {},
            static_cast<double>(window.block_bytes));
}

void write_weights(const cluster_types::Weights& w, metrics::Exposition& out) {
  out.counter("strata_weights_received_bytes_total", "Bytes of weights this node fetched from its peers.", {},
              static_cast<double>(w.received_bytes));
  out.gauge("strata_weights_wanted_bytes", "Bytes the current (or last) fetch of weights lacked at its start.", {},
            static_cast<double>(w.wanted_bytes));
  out.gauge("strata_weights_fetch_progress", "Share of the current (or last) fetch received, 0 to 1.", {},
            w.wanted_bytes > 0 ? std::min(1.0, static_cast<double>(w.fetch_received_bytes) /
                                                     static_cast<double>(w.wanted_bytes))
                                 : 1.0);
}

}  // namespace

void write_metrics(const cluster_types::ClusterStatus& status, const engine::Engine::Load& load, metrics::Exposition& out) {
  for (const cluster_types::NodeStatus& node : status.nodes) {
    write_node(node.info, !node.link || node.link->alive, out);
    if (node.link && node.link->last_seen_seconds) {
      out.gauge("strata_link_heartbeat_rtt_seconds", "Round-trip time of the last gossip call to the peer.",
                {{"peer", node.info.node_id}}, node.link->rtt_ms / 1000.0);
    }
  }
  for (const cluster_types::Stage& s : status.placement.stages) {  // layers [first, last)
    out.gauge("strata_placement_stage_layers", "Layers each node computes in the current placement.",
              {{"node", s.node_id},
               {"layers", std::to_string(s.first_layer) + "-" + std::to_string(s.last_layer - 1)}},
              s.last_layer - s.first_layer);
  }
  out.gauge("strata_placement_epoch", "The placement's epoch, one more at each new placement.", {},
            static_cast<double>(status.placement.epoch));
  out.gauge("strata_is_leader", "Whether this node leads (places layers and schedules every request).", {},
            status.leader == status.node_id);
  const cluster_types::NodeInfo& self = status.nodes.front().info;
  if (self.kv_cache) write_kv_pool(*self.kv_cache, out);
  write_weights(self.weights.value_or(cluster_types::Weights{}), out);
  out.gauge("strata_load_progress", "Share of this node's layers loaded, 0 to 1.", {}, self.load_progress);
  if (status.scheduler) {
    out.counter("strata_sequences_handed_over_total",
                "Running sequences a placement switch moved with their state (leader).", {},
                static_cast<double>(status.scheduler->handed_over));
    out.counter("strata_sequences_recomputed_total", "Running sequences a placement switch computed again (leader).",
                {}, static_cast<double>(status.scheduler->recomputed));
    out.counter("strata_sequences_preempted_total", "Running sequences pre-empted for want of KV blocks (leader).", {},
                static_cast<double>(status.scheduler->preempted));
    const cluster_types::SchedulerCounts& drafts = *status.scheduler;
    out.counter("strata_speculative_steps_total", "Decode steps that carried draft tokens (leader).", {},
                static_cast<double>(drafts.speculative_steps));
    out.counter("strata_draft_tokens_total", "Draft tokens the last stage checked (leader).", {},
                static_cast<double>(drafts.drafted));
    out.counter("strata_draft_tokens_accepted_total",
                "Draft tokens the last stage confirmed: tokens that came without a step of their own (leader).", {},
                static_cast<double>(drafts.accepted));
  }
  out.gauge("strata_requests_waiting", "Requests in the scheduler's queue (leader; 0 elsewhere).", {}, load.waiting);
  out.gauge("strata_requests_running", "Sequences the scheduler runs (leader; 0 elsewhere).", {}, load.running);
}

}  // namespace strata::cluster
