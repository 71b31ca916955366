// A cluster node's GET /cluster and GET /health bodies (docs/API.md), rendered from the plain
// values the node gives (cluster_types/cluster_status.h): the API owns every JSON it answers.
#pragma once

#include <string>
#include <utility>

#include "cluster_types/cluster_status.h"

namespace strata::api {

std::string cluster_status_json(const cluster_types::ClusterStatus& status);

// The status code (200 once requests run, else 503) and the body.
std::pair<int, std::string> health_json(const cluster_types::NodeHealth& health);

}  // namespace strata::api
