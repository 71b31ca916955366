// Gossip's one message, both ways: what a node says of itself, the nodes it knows, and the
// placement it holds (the protocol's HelloRequest and HelloReply, rpc/node.proto).
#pragma once

#include <vector>

#include "cluster_types/node_info.h"
#include "cluster_types/placement.h"

namespace strata::cluster_types {

struct Hello {
  NodeInfo sender;
  std::vector<NodeInfo> known;
  Placement placement;
  bool operator==(const Hello&) const = default;
};

}  // namespace strata::cluster_types
