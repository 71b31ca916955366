#include "api/cluster_json.h"

#include <nlohmann/json.hpp>

#include "model/kv_pool.h"
#include "units/byte_size.h"

namespace strata::api {
namespace {

using json = nlohmann::json;

// What a node says of its weights' fetch, as /cluster and /health show it.
json transfer_json(const cluster_types::Weights& w) {
  return {{"fetching", w.fetching},
          {"received_bytes", w.received_bytes},
          {"fetch_received_bytes", w.fetch_received_bytes},
          {"wanted_bytes", w.wanted_bytes},
          {"held_at_start_bytes", w.held_at_start_bytes},
          {"bytes_per_second", w.bytes_per_second},
          {"eta_seconds", w.eta_seconds}};
}

json weights_json(const cluster_types::Weights& w) {
  json j = transfer_json(w);
  j["whole_file"] = w.whole_file;
  if (!w.whole_file) {
    j["layer_bytes"] = w.layer_bytes;
    j["embedding"] = w.embedding;
    j["head"] = w.head;
    j["shared"] = w.shared;
  }
  return j;
}

json kv_pool_json(const cluster_types::KvPoolStats& kv) {
  return {{"type", kv.type},
          {"block_positions", model::kKvBlock},
          {"block_bytes", kv.block_bytes},
          {"pool_blocks", kv.pool_blocks},
          {"pool_bytes", kv.block_bytes * static_cast<uint64_t>(kv.pool_blocks)},
          {"used_blocks", kv.used_blocks},
          {"used_bytes", kv.block_bytes * static_cast<uint64_t>(kv.used_blocks)},
          {"pinned_blocks", kv.pinned_blocks},
          {"hits", kv.hits},
          {"misses", kv.misses},
          {"evictions", kv.evictions}};
}

json node_json(const cluster_types::NodeStatus& node) {
  const cluster_types::NodeInfo& info = node.info;
  json n{{"id", info.node_id},
         {"self", node.self},
         {"node_address", info.node_address},
         {"exchange_address", info.exchange_address},
         {"api_address", info.api_address},
         {"memory_bytes", info.memory_bytes},
         {"memory", units::describe_bytes(info.memory_bytes)},
         {"weight_bytes_per_second", info.weight_bytes_per_second},
         {"state", info.state},
         {"ready_epoch", info.ready_epoch},
         {"held_sequences", info.held_sequences},
         {"load_progress", info.load_progress},
         {"stage_inputs", info.stage_inputs},
         {"described_unix_ms", info.described_unix_ms},
         {"weights", weights_json(info.weights.value_or(cluster_types::Weights{}))}};
  json& links = n["links"] = json::array();
  for (const cluster_types::LinkMeasure& link : info.links) {
    links.push_back({{"peer", link.peer_id},
                     {"latency_seconds", link.latency_seconds},
                     {"bytes_per_second", link.bytes_per_second}});
  }
  if (info.kv_cache) {
    json& kv = n["kv_cache"] = kv_pool_json(*info.kv_cache);
    if (info.kv_cache->window) kv["window"] = kv_pool_json(*info.kv_cache->window);  // the sliding-window layers' pool
  }
  if (node.link) {
    n["alive"] = node.link->alive;
    n["last_seen_seconds"] = node.link->last_seen_seconds.value_or(-1.0);
    n["rtt_ms"] = node.link->rtt_ms;
    if (!node.link->problem.empty()) n["problem"] = node.link->problem;
  }
  return n;
}

json placement_json(const cluster_types::Placement& placement) {
  json stages = json::array();
  for (const cluster_types::Stage& s : placement.stages) {
    json stage = {{"node", s.node_id},
                  {"node_address", s.node_address},
                  {"first_layer", s.first_layer},
                  {"last_layer", s.last_layer}};
    // A tensor-parallel group: every member computes its share of each of the stage's layers.
    for (const cluster_types::StageMember& m : s.group) {
      stage["group"].push_back({{"node", m.node_id},
                                {"node_address", m.node_address},
                                {"exchange_address", m.exchange_address},
                                {"share", m.weight}});
    }
    stages.push_back(std::move(stage));
  }
  return {{"epoch", placement.epoch},
          {"leader", placement.leader_id},
          {"strategy", placement.strategy},
          {"stages", stages},
          {"reason", placement.reason},
          {"error", placement.error}};
}

}  // namespace

std::string cluster_status_json(const cluster_types::ClusterStatus& status) {
  json nodes = json::array();
  for (const cluster_types::NodeStatus& node : status.nodes) nodes.push_back(node_json(node));
  json body{{"node_id", status.node_id},
            {"model", {{"name", status.model_name}, {"hash", status.model_hash}, {"layers", status.layers}}},
            {"protocol_version", status.protocol_version},
            {"leader", status.leader},
            {"serving", status.serving},
            {"nodes", nodes},
            {"placement", placement_json(status.placement)}};
  if (status.waiting_for) body["waiting_for"] = *status.waiting_for;
  if (status.scheduler) {
    body["placement_switches"] = {{"sequences_handed_over", status.scheduler->handed_over},
                                  {"sequences_recomputed", status.scheduler->recomputed}};
    body["sequences_preempted"] = status.scheduler->preempted;
    body["speculative_decoding"] = {{"steps", status.scheduler->speculative_steps},
                                    {"drafted_tokens", status.scheduler->drafted},
                                    {"accepted_tokens", status.scheduler->accepted}};
  }
  if (status.leaving) body["leaving"] = true;
  return body.dump();
}

std::pair<int, std::string> health_json(const cluster_types::NodeHealth& health) {
  json body{{"status", health.status}};
  if (!health.waiting_for.empty()) body["waiting_for"] = health.waiting_for;
  if (health.load_progress) body["progress"] = *health.load_progress;
  if (health.transfer) body["transfer"] = transfer_json(*health.transfer);
  return {health.status == "ok" ? 200 : 503, body.dump()};
}

}  // namespace strata::api
