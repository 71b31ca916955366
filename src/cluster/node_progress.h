// What a node waits for before requests can run through it, as GET /health, a request that
// waits and /cluster tell it: a plain value the node takes under its lock, described here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster_types/cluster_status.h"

namespace strata::cluster {

struct NodeProgress {
  std::string refusal;               // why this node takes no part (its id is another's), or empty
  std::string placement_error;       // why the model does not fit the nodes, or empty
  bool placed = false;               // the placement has stages
  size_t members = 0;                // known, for a node that waits for a placement
  uint64_t epoch = 0;                // the placement's
  std::string leader;                // the placement's
  std::vector<std::string> unready;  // the placement's nodes that do not hold their layers of it yet
  bool serving = false;              // requests run now: here, or at a leader that serves
  bool leaving = false;
  bool stopping = false;
  bool loading = false;                 // this node loads its layers
  double load_progress = 0.0;           // of that load, 0 to 1
  std::optional<cluster_types::Weights> fetched;  // a node without the model file: what it holds of it
  bool scheduling = false;           // this node leads and its scheduler runs
  bool fetching = false;             // this node fetches weights from its peers now
  bool holds_current_stage = false;  // this node holds its layers of the current placement
};

// What requests wait for: the refusal, the placement's error, a placement, the nodes that load
// their layers, or the leader to start its scheduler.
std::string waiting_for(const NodeProgress& progress);

// GET /health: "ok" once requests can run, else what it waits for (leaving, refused, loading
// with its progress, waiting), with a fetch's progress.
cluster_types::NodeHealth health(const NodeProgress& progress);

// The word /cluster says of a node's state: refused, serving (its scheduler runs), fetching,
// loading, ready (it holds its layers), idle (placed without it) or starting.
std::string node_state(const NodeProgress& progress);

// engine::Generator::waiting_for: empty when a request runs now or would be refused at once
// (the node stops, the model does not fit), else what it waits for, with this node's load.
std::string readiness(const NodeProgress& progress);

}  // namespace strata::cluster
