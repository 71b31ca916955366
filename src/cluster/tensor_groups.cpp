#include "cluster/tensor_groups.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>

namespace strata::cluster {
namespace {

std::pair<std::string, std::string> in_id_order(const std::string& a, const std::string& b) {
  return a < b ? std::pair{a, b} : std::pair{b, a};
}

void check_link(LinkCost cost) {
  if (!std::isfinite(cost.latency_seconds) || cost.latency_seconds < 0.0) {
    throw std::invalid_argument("a link's latency must be a non-negative number of seconds, not " +
                                std::to_string(cost.latency_seconds));
  }
  if (!std::isfinite(cost.bytes_per_second) || cost.bytes_per_second <= 0.0) {
    throw std::invalid_argument("a link's bandwidth must be a positive number of bytes/s, not " +
                                std::to_string(cost.bytes_per_second));
  }
}

// Every partition of items 0..n-1 into groups, as restricted growth strings: item i's group
// is at most one more than the largest group before it, so each partition comes once, the one
// of n singletons first.
std::vector<std::vector<std::vector<size_t>>> partitions(size_t n) {
  std::vector<std::vector<std::vector<size_t>>> all;
  std::vector<size_t> group_of(n, 0);
  const auto emit = [&] {
    std::vector<std::vector<size_t>> groups;
    for (size_t i = 0; i < n; ++i) {
      if (group_of[i] == groups.size()) groups.emplace_back();
      groups[group_of[i]].push_back(i);
    }
    all.push_back(std::move(groups));
  };
  // Depth-first, each item trying a group of its own before joining an earlier one.
  const auto assign = [&](const auto& self, size_t i, size_t groups) -> void {
    if (i == n) return emit();
    group_of[i] = groups;
    self(self, i + 1, groups + 1);
    for (size_t g = 0; g < groups; ++g) {
      group_of[i] = g;
      self(self, i + 1, groups);
    }
  };
  if (n > 0) assign(assign, 0, 0);
  return all;
}

std::string percent(double share) {
  char text[16];
  std::snprintf(text, sizeof text, "%.0f%%", share * 100.0);
  return text;
}

GroupPlacement alone(const Placement& placement) {
  GroupPlacement result{{}, placement.predicted_seconds_per_token, placement.reason};
  for (const Stage& stage : placement.stages) {
    result.stages.push_back({{{stage.node_id, 1.0}}, stage.first_layer, stage.last_layer});
  }
  return result;
}

// `members` with `shares` as one node of a placement: a group also costs a hop a step, the
// calls that start the step on its members.
NodeCapacity as_one_node(std::span<const NodeCapacity> members, const LinkCosts& links,
                         std::span<const GroupMember> shares, const PlacementRequest& request) {
  NodeCapacity node = group_capacity(members, links, shares);
  if (members.size() > 1) node.seconds_per_step = request.hop_seconds;
  return node;
}

}  // namespace

LinkCosts::LinkCosts(LinkCost unmeasured) : unmeasured_(unmeasured) { check_link(unmeasured); }

void LinkCosts::set(const std::string& a, const std::string& b, LinkCost cost) {
  check_link(cost);
  measured_[in_id_order(a, b)] = cost;
}

LinkCost LinkCosts::between(const std::string& a, const std::string& b) const {
  const auto found = measured_.find(in_id_order(a, b));
  return found != measured_.end() ? found->second : unmeasured_;
}

std::vector<GroupMember> group_shares(std::span<const NodeCapacity> members) {
  double speed = 0.0;
  for (const NodeCapacity& member : members) speed += member.weight_bytes_per_second;
  std::vector<GroupMember> shares;
  for (const NodeCapacity& member : members) shares.push_back({member.id, member.weight_bytes_per_second / speed});
  return shares;
}

NodeCapacity group_capacity(std::span<const NodeCapacity> members, const LinkCosts& links) {
  if (members.empty()) throw std::invalid_argument("a group needs at least one node");
  return group_capacity(members, links, group_shares(members));
}

NodeCapacity group_capacity(std::span<const NodeCapacity> members, const LinkCosts& links,
                            std::span<const GroupMember> shares) {
  if (members.empty() || shares.size() != members.size()) {
    throw std::invalid_argument("a group needs at least one node, and a share for each");
  }
  if (members.size() == 1) return members.front();
  NodeCapacity group;
  group.memory_bytes = std::numeric_limits<uint64_t>::max();
  group.weight_bytes_per_second = std::numeric_limits<double>::max();
  bool pools = true;
  uint64_t pool_bytes = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < members.size(); ++i) {
    const NodeCapacity& member = members[i];
    const double share = shares[i].share;
    group.id += (i > 0 ? "+" : "") + member.id;
    group.weight_bytes_per_second = std::min(group.weight_bytes_per_second, member.weight_bytes_per_second / share);
    // A member keeps its share of the group's weights and KV (its heads'): the group holds as
    // much as the member with the least for its share allows.
    group.memory_bytes =
        std::min(group.memory_bytes, static_cast<uint64_t>(static_cast<double>(member.memory_bytes) / share));
    pools = pools && member.kv_pool_bytes > 0;
    if (member.kv_pool_bytes > 0) {
      pool_bytes = std::min(pool_bytes, static_cast<uint64_t>(static_cast<double>(member.kv_pool_bytes) / share));
    }
    group.kv_bytes_per_layer = std::max(group.kv_bytes_per_layer, member.kv_bytes_per_layer);
    group.kv_bytes_per_window_layer = std::max(group.kv_bytes_per_window_layer, member.kv_bytes_per_window_layer);
    // Weights fetched by part: the group is counted as holding none of its layers unless each
    // member holds every weight, which overstates a group's fetch but never understates it.
    group.held.everything = group.held.everything && member.held.everything;
  }
  // Pools of a fixed size only when every member has one; otherwise KV per layer.
  group.kv_pool_bytes = pools ? pool_bytes : 0;
  // Every exchange waits for the slowest link. Each member receives the others' shares of a
  // gathered row, one link after another through its own network port.
  for (size_t i = 0; i < members.size(); ++i) {
    double seconds_per_byte = 0.0;
    for (size_t j = 0; j < members.size(); ++j) {
      if (j == i) continue;
      const LinkCost link = links.between(members[j].id, members[i].id);
      group.seconds_per_exchange = std::max(group.seconds_per_exchange, link.latency_seconds);
      seconds_per_byte += shares[j].share / link.bytes_per_second;
    }
    group.seconds_per_gathered_byte = std::max(group.seconds_per_gathered_byte, seconds_per_byte);
  }
  return group;
}

double predict_placement(const Placement& placement, std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                         const LinkCosts& links, const PlacementRequest& request) {
  const auto node = [&](const std::string& id) {
    const auto found = std::find_if(nodes.begin(), nodes.end(), [&](const auto& n) { return n.id == id; });
    if (found == nodes.end()) throw std::invalid_argument("no node '" + id + "' to predict a stage of");
    return *found;
  };
  std::vector<NodeCapacity> stage_nodes;
  for (const Stage& stage : placement.stages) {
    const std::vector<GroupMember> shares =
        stage.group.empty() ? std::vector<GroupMember>{{stage.node_id, 1.0}} : stage.group;
    std::vector<NodeCapacity> members;
    for (const GroupMember& member : shares) members.push_back(node(member.node_id));
    stage_nodes.push_back(as_one_node(members, links, shares, request));
  }
  return predicted_seconds_per_token(placement.stages, stage_nodes, model, request);
}

GroupPlacement place_groups(std::span<const NodeCapacity> input_nodes, const ModelFootprint& model,
                            const LinkCosts& links, const PlacementRequest& request) {
  if (request.strategy != Strategy::Speed || model.layer_gathered_bytes.empty() || input_nodes.size() < 2) {
    return alone(place_layers(input_nodes, model, request));
  }
  std::vector<NodeCapacity> nodes(input_nodes.begin(), input_nodes.end());
  std::sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) { return a.id < b.id; });

  std::vector<std::vector<std::vector<size_t>>> groupings;
  if (nodes.size() <= kMaxNodesForEveryGrouping) {
    groupings = partitions(nodes.size());
  } else {
    std::vector<std::vector<size_t>> singletons, one_group(1);
    for (size_t i = 0; i < nodes.size(); ++i) {
      singletons.push_back({i});
      one_group[0].push_back(i);
    }
    groupings = {singletons, one_group};
  }

  std::optional<GroupPlacement> best;
  std::optional<double> alone_seconds;  // the first grouping's: every node alone
  std::optional<DoesNotFit> no_fit;
  for (const std::vector<std::vector<size_t>>& grouping : groupings) {
    std::vector<NodeCapacity> as_nodes;
    std::map<std::string, std::vector<GroupMember>> members_of;
    for (const std::vector<size_t>& group : grouping) {
      std::vector<NodeCapacity> members;
      for (size_t i : group) members.push_back(nodes[i]);
      std::vector<GroupMember> shares = group_shares(members);
      as_nodes.push_back(as_one_node(members, links, shares, request));
      members_of[as_nodes.back().id] = std::move(shares);
    }
    Placement placement;
    try {
      placement = place_layers(as_nodes, model, request);
    } catch (const DoesNotFit& e) {
      if (!no_fit) no_fit = e;  // the nodes alone: the clearest account of what is missing
      continue;
    }
    if (grouping.size() == nodes.size()) alone_seconds = placement.predicted_seconds_per_token;
    // Strictly faster beyond rounding noise.
    if (best && placement.predicted_seconds_per_token >= best->predicted_seconds_per_token * (1.0 - 1e-9)) continue;
    GroupPlacement candidate{{}, placement.predicted_seconds_per_token, {}};
    std::string groups;
    for (const Stage& stage : placement.stages) {
      const std::vector<GroupMember>& members = members_of.at(stage.node_id);
      candidate.stages.push_back({members, stage.first_layer, stage.last_layer});
      if (members.size() < 2) continue;
      groups += "\n  group " + stage.node_id + ":";
      for (const GroupMember& member : members) groups += " " + member.node_id + " " + percent(member.share);
      groups += " of every layer's heads and rows, in proportion to speed";
    }
    candidate.reason = placement.reason + groups;
    best = std::move(candidate);
  }
  if (!best) throw *no_fit;
  const bool grouped = std::any_of(best->stages.begin(), best->stages.end(),
                                   [](const GroupStage& stage) { return stage.members.size() > 1; });
  if (grouped) {
    char why[128];
    if (alone_seconds) {
      std::snprintf(why, sizeof why, "\n  with groups %.1f ms per token predicted, the nodes alone %.1f",
                    best->predicted_seconds_per_token * 1e3, *alone_seconds * 1e3);
    } else {
      std::snprintf(why, sizeof why, "\n  with groups: the nodes alone cannot hold the model");
    }
    best->reason += why;
  }
  return *best;
}

}  // namespace strata::cluster
