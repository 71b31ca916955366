#include "cluster/node_progress.h"

#include <nlohmann/json.hpp>

#include "cluster/cluster_status.h"

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

std::pair<int, std::string> health(const NodeProgress& progress) {
  using json = nlohmann::json;
  if (progress.leaving) return {503, R"({"status":"leaving"})"};
  if (!progress.refusal.empty()) return {503, json{{"status", "refused"}, {"waiting_for", progress.refusal}}.dump()};
  if (progress.serving) return {200, R"({"status":"ok"})"};
  json body{{"status", progress.loading ? "loading" : "waiting"}, {"waiting_for", waiting_for(progress)}};
  if (progress.loading) body["progress"] = progress.load_progress;
  if (progress.fetched) body["transfer"] = transfer_json(*progress.fetched);
  return {503, body.dump()};
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

}  // namespace strata::cluster
