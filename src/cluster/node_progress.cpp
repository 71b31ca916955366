#include "cluster/node_progress.h"

namespace strata::cluster {

std::string waiting_for(const NodeProgress& progress) {
  if (!progress.refusal.empty()) return progress.refusal;
  if (!progress.placement_error.empty()) return progress.placement_error;
  if (!progress.placed) {
    return "a placement (" + std::to_string(progress.members) +
           " node(s) known; the leader places the model "
           "once the members have settled)";
  }
  std::string missing;
  for (const std::string& id : progress.unready) missing += (missing.empty() ? "" : ", ") + id;
  if (!missing.empty())
    return "nodes loading their layers of placement " + std::to_string(progress.epoch) + ": " + missing;
  return "the leader " + progress.leader + " to start its scheduler";
}

cluster_types::NodeHealth health(const NodeProgress& progress) {
  if (progress.leaving) return {"leaving"};
  if (!progress.refusal.empty()) return {"refused", progress.refusal};
  if (progress.serving) return {"ok"};
  if (progress.loading) return {"loading", waiting_for(progress), progress.load_progress, progress.fetched};
  return {"waiting", waiting_for(progress), std::nullopt, progress.fetched};
}

std::string readiness(const NodeProgress& progress) {
  if (!progress.refusal.empty()) return waiting_for(progress);
  if (progress.serving || progress.stopping || !progress.placement_error.empty()) return {};
  std::string why = waiting_for(progress);
  if (progress.loading) {
    why += " (this node has " + std::to_string(static_cast<int>(progress.load_progress * 100)) + "% of its layers)";
  }
  return why;
}

std::string node_state(const NodeProgress& progress) {
  if (!progress.refusal.empty()) return "refused";
  if (progress.scheduling) return "serving";
  if (progress.fetching) return "fetching";
  if (progress.loading) return "loading";
  if (progress.holds_current_stage) return "ready";
  return progress.placed ? "idle" : "starting";
}

}  // namespace strata::cluster
