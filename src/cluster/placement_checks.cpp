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
    const auto node = std::find_if(nodes.begin(), nodes.end(), [&](const auto& n) { return n.id == stage.node_id; });
    if (node == nodes.end()) throw std::invalid_argument(name + ": no such node");
    if (!seen.insert(stage.node_id).second) throw std::invalid_argument(name + ": the node already has a stage");
    const uint64_t need = needs.memory_bytes(*node, stage.first_layer, stage.last_layer);
    if (need > node->memory_bytes) {
      throw std::invalid_argument(name + " needs " + units::describe_bytes(need) + " but the node has " +
                                  units::describe_bytes(node->memory_bytes) + " usable");
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
  for (const Stage& s : current.stages) {
    if (std::find(members.begin(), members.end(), s.node_id) == members.end()) {
      if (!repaired.stages.empty()) {
        repaired.stages.back().last_layer = s.last_layer;
      } else if (!orphaned_from) {
        orphaned_from = s.first_layer;
      }
      continue;
    }
    repaired.stages.push_back({s.node_id, orphaned_from.value_or(s.first_layer), s.last_layer});
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
