// GET /cluster's answer rendered as JSON (docs/API.md) from the plain status value
// (cluster_types/cluster_status.h) that the node takes under its lock.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cluster_types/cluster_status.h"

namespace strata::cluster {

using cluster_types::ClusterStatus;
using cluster_types::NodeStatus;
using cluster_types::PeerLink;
using cluster_types::SchedulerCounts;

std::string status_json(const ClusterStatus& status);

// What a node says of its weights' fetch, as /cluster and /health show it.
nlohmann::json transfer_json(const cluster_types::Weights& weights);

}  // namespace strata::cluster
