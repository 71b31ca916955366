// A placement as the leader announces it to every node (in its Hellos) and as /cluster shows
// it: the protocol's Placement and Stage (rpc/node.proto) as plain values, converted at the
// boundary (rpc/cluster_messages.h). How the layers are split is computed in cluster/placement.h;
// this is what is said of the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::cluster_types {

// A member of a tensor-parallel group that computes a stage together (model/tensor_share.h).
struct StageMember {
  std::string node_id;
  std::string node_address;      // as the leader reaches it
  std::string exchange_address;  // where the other members reach its group links
  double weight = 1.0;           // its share of every layer's rows, relative to the others'
  bool operator==(const StageMember&) const = default;
};

struct Stage {
  std::string node_id;       // a group's first member
  std::string node_address;  // as the leader reaches it
  int32_t first_layer = 0;
  int32_t last_layer = 0;  // exclusive
  // A tensor-parallel group's members in member order, node_id first; empty: node_id computes
  // the stage alone.
  std::vector<StageMember> group;
  bool operator==(const Stage&) const = default;
};

struct Placement {
  uint64_t epoch = 0;
  std::string leader_id;      // the node that decided it and schedules requests
  std::vector<Stage> stages;  // in pipeline order
  std::string reason;
  std::string strategy;  // "speed", "memory", "fixed"; empty before the first placement
  std::string error;     // set when the model does not fit: no stages then
  bool operator==(const Placement&) const = default;
};

}  // namespace strata::cluster_types
