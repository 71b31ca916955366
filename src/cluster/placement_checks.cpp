// Placements not searched for: one fixed by hand (--stages), checked against the memory rule,
// and one repaired after a loss, which keeps the nodes left where they are.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

#include "cluster/placement.h"
#include "cluster/stage_needs.h"
#include "units/byte_size.h"

namespace strata::cluster {

void check_placement(const Placement& placement, std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                     uint64_t kv_tokens) {
  const StageNeeds needs(model, kv_tokens);
  if (placement.stages.empty()) throw std::invalid_argument("the placement has no stages");
  std::set<std::string> seen;
  int expected_first = 0;
  for (const Stage& stage : placement.stages) {
    const std::string name = "stage on node '" + stage.node_id + "' (layers [" + std::to_string(stage.first_layer) +
                             ", " + std::to_string(stage.last_layer) + "))";
    if (stage.first_layer != expected_first) {
      throw std::invalid_argument(name + " should start at layer " + std::to_string(expected_first) +
                                  (stage.first_layer > expected_first ? ": layers are left out" : ": layers overlap"));
    }
    if (stage.last_layer <= stage.first_layer) throw std::invalid_argument(name + " holds no layers");
    if (stage.last_layer > needs.count()) {
      throw std::invalid_argument(name + " goes past the model's " + std::to_string(needs.count()) + " layers");
    }
    if (!stage.group.empty() && stage.group.front().node_id != stage.node_id) {
      throw std::invalid_argument(name + ": its group's first member is not its node");
    }
    // A group's member holds its share of the stage's weights and KV.
    const std::vector<GroupMember> members = stage.group.empty() ? std::vector<GroupMember>{{stage.node_id, 1.0}} : stage.group;
    for (const GroupMember& member : members) {
      const auto node = std::find_if(nodes.begin(), nodes.end(), [&](const auto& n) { return n.id == member.node_id; });
      if (node == nodes.end()) throw std::invalid_argument(name + ": no such node '" + member.node_id + "'");
      if (!seen.insert(member.node_id).second) {
        throw std::invalid_argument(name + ": node '" + member.node_id + "' already has a stage");
      }
      if (!(member.share > 0.0 && member.share <= 1.0)) {
        throw std::invalid_argument(name + ": node '" + member.node_id + "' has a share that is not in (0, 1]");
      }
      const auto need = static_cast<uint64_t>(
          static_cast<double>(needs.memory_bytes(*node, stage.first_layer, stage.last_layer)) * member.share);
      if (need > node->memory_bytes) {
        throw std::invalid_argument(name + " needs " + units::describe_bytes(need) + " on node '" + member.node_id +
                                    "' but it has " + units::describe_bytes(node->memory_bytes) + " usable");
      }
    }
    expected_first = stage.last_layer;
  }
  if (expected_first != needs.count()) {
    throw std::invalid_argument("the stages end at layer " + std::to_string(expected_first) + " of " +
                                std::to_string(needs.count()) + ": layers are left out");
  }
}

std::optional<Placement> repair_placement(const Placement& current, std::span<const std::string> members,
                                          std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                                          uint64_t kv_tokens) {
  Placement repaired;
  std::optional<int> orphaned_from;  // first layer of gone stages at the front
  const auto left = [&](const std::string& id) { return std::find(members.begin(), members.end(), id) != members.end(); };
  for (Stage s : current.stages) {
    // A group goes on with the members it has left, their shares in the same proportions.
    std::erase_if(s.group, [&](const GroupMember& m) { return !left(m.node_id); });
    double shares = 0.0;
    for (const GroupMember& m : s.group) shares += m.share;
    for (GroupMember& m : s.group) m.share /= shares;
    if (!s.group.empty()) s.node_id = s.group.front().node_id;
    if (s.group.size() == 1) s.group.clear();
    if (!left(s.node_id)) {
      if (!repaired.stages.empty()) {
        repaired.stages.back().last_layer = s.last_layer;
      } else if (!orphaned_from) {
        orphaned_from = s.first_layer;
      }
      continue;
    }
    repaired.stages.push_back({s.node_id, orphaned_from.value_or(s.first_layer), s.last_layer, s.group});
    orphaned_from.reset();
  }
  if (repaired.stages.empty()) return std::nullopt;
  try {
    check_placement(repaired, nodes, model, kv_tokens);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  repaired.reason =
      "repaired: the nodes left keep their needs, and those of the nodes gone go to their neighbours "
      "in the pipeline (a placement from scratch follows the next change of members)";
  return repaired;
}

}  // namespace strata::cluster
