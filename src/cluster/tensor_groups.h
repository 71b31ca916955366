// Tensor-parallel groups in the placement: nodes that compute every layer of one pipeline stage
// together, each a share of every projection's output rows, gathering the rows over their links
// after each projection. What a group costs per token, and which nodes form groups: pure
// functions of the nodes' speeds and memory and the links' measured latency and bandwidth.
#pragma once

#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cluster/placement.h"

namespace strata::cluster {

// One direction of a link between two nodes.
struct LinkCost {
  double latency_seconds = 0.0;
  double bytes_per_second = 0.0;
};

// What the links between nodes cost: as measured, else `unmeasured`.
class LinkCosts {
 public:
  explicit LinkCosts(LinkCost unmeasured);
  // Both directions. Throws std::invalid_argument for a negative or non-finite latency or a
  // bandwidth that is not positive and finite.
  void set(const std::string& a, const std::string& b, LinkCost cost);
  LinkCost between(const std::string& a, const std::string& b) const;

 private:
  LinkCost unmeasured_;
  std::map<std::pair<std::string, std::string>, LinkCost> measured_;  // the pair in id order
};

// One pipeline stage: a node alone (one member, share 1) or a group.
struct GroupStage {
  std::vector<GroupMember> members;  // in id order
  int first_layer = 0;
  int last_layer = 0;  // exclusive
};

struct GroupPlacement {
  std::vector<GroupStage> stages;  // pipeline order, contiguous, covering [0, layer_count)
  double predicted_seconds_per_token = 0.0;
  std::string reason;  // for people: the groups, their shares and the pipeline's lines
};

// `members` (at least one) as one node: shares in proportion to their speeds, the speeds added,
// the memory the member with the least for its share allows, and the exchanges' costs: per
// exchange the slowest link's latency, per gathered byte what the member that receives the most
// for its bandwidth takes. The id is the members' ids joined by '+'.
NodeCapacity group_capacity(std::span<const NodeCapacity> members, const LinkCosts& links);
// The same with the members' `shares` given (adding up to 1): each member reads its share at its
// own speed, so the group reads as fast as the member slowest for its share.
NodeCapacity group_capacity(std::span<const NodeCapacity> members, const LinkCosts& links,
                            std::span<const GroupMember> shares);

// The shares group_capacity gives `members`.
std::vector<GroupMember> group_shares(std::span<const NodeCapacity> members);

// What the cost model predicts per token for `placement` (a placement made by hand: its groups
// with their shares), on `nodes` and `links` as measured: what place_groups would say of it.
// Throws std::invalid_argument for a node not in `nodes`.
double predict_placement(const Placement& placement, std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                         const LinkCosts& links, const PlacementRequest& request);

// At most this many nodes are searched for every grouping (203 partitions); with more, the
// placement compares the pipeline of single nodes with one group of them all.
inline constexpr size_t kMaxNodesForEveryGrouping = 6;

// The speed strategy over groups: every partition of the nodes into groups is placed by
// place_layers with each group as one node, and the least predicted time per token wins; ties
// go to the partition found first, the nodes alone first, so that groups are formed only where
// they are faster. With the memory strategy, or a footprint that does not say what a group
// gathers, every node is alone. Throws as place_layers does.
GroupPlacement place_groups(std::span<const NodeCapacity> nodes, const ModelFootprint& model, const LinkCosts& links,
                            const PlacementRequest& request);

}  // namespace strata::cluster
