// What /metrics tells of the cluster as one node sees it (docs/API.md#metrics): its members,
// the placement, this node's KV pool and weights, and a leader's scheduler.
#pragma once

#include "cluster_types/cluster_status.h"
#include "engine/engine.h"
#include "metrics/metrics.h"

namespace strata::cluster {

// `load`: the scheduler's, taken apart from `status` (the engine's lock is never taken under the
// node's); empty where this node schedules nothing.
void write_metrics(const cluster_types::ClusterStatus& status, const engine::Engine::Load& load,
                   metrics::Exposition& out);

}  // namespace strata::cluster
