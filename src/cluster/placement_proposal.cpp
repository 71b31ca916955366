#include "cluster/placement_proposal.h"

#include <exception>

namespace strata::cluster {
namespace {

Placement placement_of(const cluster_types::Placement& p) {
  Placement placement;
  placement.epoch = p.epoch;
  placement.reason = p.reason;
  for (const cluster_types::Stage& s : p.stages) placement.stages.push_back({s.node_id, s.first_layer, s.last_layer});
  return placement;
}

const char* strategy_name(const PlacementRules& rules) {
  if (!rules.fixed_stages.empty()) return "fixed";
  return rules.strategy == Strategy::Memory ? "memory" : "speed";
}

}  // namespace

NodeCapacity capacity_of(const cluster_types::NodeInfo& info) {
  // A node that says nothing of its weights (an older version) has its own file.
  const std::optional<cluster_types::Weights>& w = info.weights;
  const Holdings held = !w || w->whole_file ? Holdings{} : Holdings{false, w->layer_bytes, w->embedding, w->head};
  return {info.node_id,     info.memory_bytes,          info.weight_bytes_per_second, held,
          info.kv_memory_bytes, info.kv_bytes_per_layer, info.kv_bytes_per_window_layer};
}

PlacementRequest placement_request(const PlacementRules& rules) {
  return {rules.kv_reserve_tokens, rules.strategy, kDefaultHopSeconds};
}

Proposal propose_placement(uint64_t epoch, const std::vector<cluster_types::NodeInfo>& members, const cluster_types::Placement& current,
                           bool may_repair, const PlacementRules& rules) {
  std::vector<std::string> ids;
  std::vector<NodeCapacity> nodes;
  for (const cluster_types::NodeInfo& info : members) {
    ids.push_back(info.node_id);
    nodes.push_back(capacity_of(info));
  }
  Proposal proposal;
  cluster_types::Placement& next = proposal.placement;
  next.epoch = epoch;
  next.leader_id = rules.leader_id;
  next.strategy = strategy_name(rules);
  try {
    Placement p;
    if (rules.fixed_stages.empty()) {
      const std::optional<Placement> repaired =
          may_repair ? repair_placement(placement_of(current), ids, nodes, rules.footprint, rules.kv_reserve_tokens)
                     : std::nullopt;
      p = repaired ? *repaired : place_layers(nodes, rules.footprint, placement_request(rules));
    } else {
      p.stages = rules.fixed_stages;
      p.reason = "fixed by hand (--stages)";
      check_placement(p, nodes, rules.footprint, rules.kv_reserve_tokens);
    }
    for (const Stage& s : p.stages) {
      cluster_types::Stage& out = next.stages.emplace_back(cluster_types::Stage{s.node_id, {}, s.first_layer, s.last_layer});
      for (const cluster_types::NodeInfo& info : members) {
        if (info.node_id == s.node_id) out.node_address = info.node_address;
      }
    }
    next.reason = p.reason;
  } catch (const std::exception& e) {
    if (!rules.fixed_stages.empty() && dynamic_cast<const DoesNotFit*>(&e) == nullptr) {
      proposal.waits = e.what();
      return proposal;
    }
    next.error = std::string("the model does not fit this cluster: ") + e.what();
  }
  return proposal;
}

std::string why_needed(const std::vector<cluster_types::NodeInfo>& others, const PlacementRules& rules) {
  if (others.empty()) return "no other node of its cluster runs to take its layers over";
  try {
    std::vector<NodeCapacity> nodes;
    for (const cluster_types::NodeInfo& info : others) nodes.push_back(capacity_of(info));
    place_layers(nodes, rules.footprint, placement_request(rules));
  } catch (const DoesNotFit& e) {
    return std::string("the other nodes cannot hold the model without this node: ") + e.what();
  }
  return {};
}

std::string stages_text(const cluster_types::Placement& p) {
  if (!p.error.empty()) return p.error;
  std::string text;
  for (const cluster_types::Stage& s : p.stages) {
    text += (text.empty() ? "" : ", ") + s.node_id + " [" + std::to_string(s.first_layer) + ", " +
            std::to_string(s.last_layer) + ")";
  }
  return text;
}

}  // namespace strata::cluster
