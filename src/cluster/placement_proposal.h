// The leader's placements as it sends them: from what each member says of itself, the layers
// each runs (cluster/placement.h), named by the address the leader reaches it at.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/placement.h"
#include "cluster_types/node_info.h"
#include "cluster_types/placement.h"

namespace strata::cluster {

// What every placement of a leader is made by.
struct PlacementRules {
  std::string leader_id;
  Strategy strategy = Strategy::Speed;
  std::vector<Stage> fixed_stages;  // a placement fixed by hand (--stages), checked like a computed one
  uint64_t kv_reserve_tokens = 0;   // of every stage's KV pool
  ModelFootprint footprint;
};

// A member's memory, speed and the weights it holds, as it says.
NodeCapacity capacity_of(const cluster_types::NodeInfo& info);

PlacementRequest placement_request(const PlacementRules& rules);

struct Proposal {
  cluster_types::Placement placement;  // may say why the model does not fit instead (its error)
  // Set, without a placement, while a hand-made placement names nodes that have not joined.
  std::string waits;
};

// The placement of `epoch` over `members` (what each says of itself): `current` repaired, when
// `may_repair` and it can be (only nodes left), else placed anew; a placement fixed by hand, or
// when it names nodes that are not members, `current` repaired after a loss, else it waits.
Proposal propose_placement(uint64_t epoch, const std::vector<cluster_types::NodeInfo>& members, const cluster_types::Placement& current,
                           bool may_repair, const PlacementRules& rules);

// Why a node should not leave now, given the `others` that would hold the model without it (what
// each says of itself), or empty: none runs, or they cannot hold the model.
std::string why_needed(const std::vector<cluster_types::NodeInfo>& others, const PlacementRules& rules);

// "a [0, 3), b 60%+c 40% [3, 5)" (a group of b and c), or the placement's error.
std::string stages_text(const cluster_types::Placement& placement);

}  // namespace strata::cluster
