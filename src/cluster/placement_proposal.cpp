#include "cluster/placement_proposal.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>

#include "cluster/tensor_groups.h"

namespace strata::cluster {
namespace {

// Weights in proportion to one another as shares adding up to 1; a group fixed by hand
// without weights (all 0) shares by the members' measured speeds.
std::vector<GroupMember> shares_of(std::vector<GroupMember> group, const std::vector<cluster_types::NodeInfo>& members) {
  const bool by_speed = std::all_of(group.begin(), group.end(), [](const GroupMember& m) { return m.share == 0.0; });
  double total = 0.0;
  for (GroupMember& m : group) {
    if (by_speed) {
      const auto info = std::find_if(members.begin(), members.end(), [&](const auto& i) { return i.node_id == m.node_id; });
      m.share = info == members.end() ? 0.0 : info->weight_bytes_per_second;
    }
    total += m.share;
  }
  for (GroupMember& m : group) m.share = total > 0.0 ? m.share / total : 0.0;
  return group;
}

Placement placement_of(const cluster_types::Placement& p) {
  Placement placement;
  placement.epoch = p.epoch;
  placement.reason = p.reason;
  for (const cluster_types::Stage& s : p.stages) {
    Stage& stage = placement.stages.emplace_back(Stage{s.node_id, s.first_layer, s.last_layer});
    for (const cluster_types::StageMember& m : s.group) stage.group.push_back({m.node_id, m.weight});
  }
  return placement;
}

// A link no node has measured is taken as too slow for a group to gather over.
constexpr LinkCost kUnmeasuredLink{1.0, 1e3};

// The links between `members` as they measured them; of a link measured from both ends, the
// slower measurement.
LinkCosts links_between(const std::vector<cluster_types::NodeInfo>& members) {
  std::map<std::pair<std::string, std::string>, LinkCost> slowest;
  for (const cluster_types::NodeInfo& info : members) {
    for (const cluster_types::LinkMeasure& link : info.links) {
      if (!(link.bytes_per_second > 0.0) || !(link.latency_seconds >= 0.0)) continue;
      const auto key = std::minmax(info.node_id, link.peer_id);
      const auto [known, first] = slowest.try_emplace({key.first, key.second}, LinkCost{link.latency_seconds, link.bytes_per_second});
      if (!first) {
        known->second.latency_seconds = std::max(known->second.latency_seconds, link.latency_seconds);
        known->second.bytes_per_second = std::min(known->second.bytes_per_second, link.bytes_per_second);
      }
    }
  }
  LinkCosts links(kUnmeasuredLink);
  for (const auto& [pair, cost] : slowest) links.set(pair.first, pair.second, cost);
  return links;
}

// A placement from scratch: with the speed strategy, tensor-parallel groups where the links
// between their members make them faster (tensor_groups.h).
Placement place_anew(const std::vector<NodeCapacity>& nodes, const std::vector<cluster_types::NodeInfo>& members,
                     const PlacementRules& rules) {
  const GroupPlacement grouped = place_groups(nodes, rules.footprint, links_between(members), placement_request(rules));
  Placement placement;
  placement.reason = grouped.reason;
  placement.predicted_seconds_per_token = grouped.predicted_seconds_per_token;
  for (const GroupStage& s : grouped.stages) {
    Stage& stage = placement.stages.emplace_back(Stage{s.members.front().node_id, s.first_layer, s.last_layer});
    if (s.members.size() > 1) stage.group = s.members;
  }
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
    const std::optional<Placement> repaired =
        may_repair ? repair_placement(placement_of(current), ids, nodes, rules.footprint, rules.kv_reserve_tokens)
                   : std::nullopt;
    if (rules.fixed_stages.empty()) {
      p = repaired ? *repaired : place_anew(nodes, members, rules);
    } else {
      p.stages = rules.fixed_stages;
      for (Stage& s : p.stages) s.group = shares_of(std::move(s.group), members);
      p.reason = "fixed by hand (--stages)";
      try {
        check_placement(p, nodes, rules.footprint, rules.kv_reserve_tokens);
        // What the speed strategy's cost model says of it, on the nodes and links measured.
        char predicted[64];
        std::snprintf(predicted, sizeof predicted, "; predicted %.1f ms per token",
                      predict_placement(p, nodes, rules.footprint, links_between(members), placement_request(rules)) * 1e3);
        p.reason += predicted;
      } catch (const std::invalid_argument&) {
        // A node of the fixed placement was lost: the nodes left serve on, repaired, until it is
        // back. Before the fixed placement has served, it waits for its nodes.
        if (!repaired) throw;
        p = *repaired;
        p.reason += "; the placement fixed by hand (--stages) returns when its nodes do";
      }
    }
    const auto info_of = [&](const std::string& id) {
      const auto info = std::find_if(members.begin(), members.end(), [&](const auto& i) { return i.node_id == id; });
      return info != members.end() ? *info : cluster_types::NodeInfo{};
    };
    for (const Stage& s : p.stages) {
      cluster_types::Stage& out = next.stages.emplace_back(
          cluster_types::Stage{s.node_id, info_of(s.node_id).node_address, s.first_layer, s.last_layer, {}});
      for (const GroupMember& m : s.group) {
        const cluster_types::NodeInfo member = info_of(m.node_id);
        out.group.push_back({m.node_id, member.node_address, member.exchange_address, m.share});
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
    std::string nodes = s.node_id;
    if (!s.group.empty()) {
      nodes.clear();
      for (const cluster_types::StageMember& m : s.group) {
        nodes += (nodes.empty() ? "" : "+") + m.node_id + " " + std::to_string(static_cast<int>(m.weight * 100 + 0.5)) + "%";
      }
    }
    text += (text.empty() ? "" : ", ") + nodes + " [" + std::to_string(s.first_layer) + ", " +
            std::to_string(s.last_layer) + ")";
  }
  return text;
}

}  // namespace strata::cluster
