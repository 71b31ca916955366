// GET /cluster's and GET /health's answers on a cluster node: plain values that the node takes
// under its lock (cluster/node.h) and the API renders as JSON after (api/cluster_json.h,
// docs/API.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cluster_types/node_info.h"
#include "cluster_types/placement.h"

namespace strata::cluster_types {

// How this node hears from a peer.
struct PeerLink {
  bool alive = false;
  std::optional<double> last_seen_seconds;  // nullopt: never reached directly
  double rtt_ms = 0.0;
  std::string problem;  // why it cannot take part (another model or protocol); empty when it can
};

struct NodeStatus {
  NodeInfo info;  // what it says of itself
  bool self = false;
  std::optional<PeerLink> link;  // a peer's
};

// A leader's counts of sequences at its placement switches and pre-emptions.
struct SchedulerCounts {
  uint64_t handed_over = 0;  // moved with their state (a node left or joined)
  uint64_t recomputed = 0;   // computed again (a node was lost)
  uint64_t preempted = 0;    // for want of KV blocks, computed again later
  // Speculative decoding: steps with drafts, draft tokens checked, and those confirmed.
  uint64_t speculative_steps = 0;
  uint64_t drafted = 0;
  uint64_t accepted = 0;
};

struct ClusterStatus {
  std::string node_id;
  std::string model_name;
  std::string model_hash;
  int layers = 0;
  uint32_t protocol_version = 0;  // this node's (rpc::kProtocolVersion)
  std::string leader;
  bool serving = false;
  std::vector<NodeStatus> nodes;  // this node first
  Placement placement;
  std::optional<std::string> waiting_for;    // while there is no placement, or it failed
  std::optional<SchedulerCounts> scheduler;  // while this node schedules
  bool leaving = false;
};

// GET /health: whether requests can run through this node now, and if not, what it waits for.
struct NodeHealth {
  std::string status;                   // "ok" (requests run), "leaving", "refused", "loading" or "waiting"
  std::string waiting_for;              // empty with "ok" and "leaving"
  std::optional<double> load_progress;  // its layers' load, 0 to 1, while "loading"
  std::optional<Weights> transfer;      // a node without the model file: its weights' fetch, while it waits
  bool operator==(const NodeHealth&) const = default;
};

}  // namespace strata::cluster_types
