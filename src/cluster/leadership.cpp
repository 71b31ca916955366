#include "cluster/leadership.h"

#include <algorithm>

#include "engine/group_stage.h"
#include "metrics/metrics.h"
#include "rpc/remote_generator.h"

namespace strata::cluster {
namespace {

// Placements a node remembers, the current one included: a new leader finds the stages of the
// one before it there, which hold the state of the requests the old leader passes on.
constexpr size_t kRecentPlacements = 4;

}  // namespace

std::vector<std::string> nodes_of(const cluster_types::Stage& stage) {
  if (stage.group.empty()) return {stage.node_id};
  std::vector<std::string> nodes;
  for (const cluster_types::StageMember& m : stage.group) nodes.push_back(m.node_id);
  return nodes;
}

std::optional<StageSeat> seat_of(const cluster_types::Placement& placement, const std::string& node_id,
                                 const Membership& membership) {
  for (const cluster_types::Stage& s : placement.stages) {
    const std::vector<std::string> nodes = nodes_of(s);
    const auto found = std::find(nodes.begin(), nodes.end(), node_id);
    if (found == nodes.end()) continue;
    StageSeat seat{{s.first_layer, s.last_layer}};
    if (!s.group.empty()) {
      seat.member = static_cast<int>(found - nodes.begin());
      seat.group = "placement " + std::to_string(placement.epoch) + ", layers " + std::to_string(s.first_layer) + "-" +
                   std::to_string(s.last_layer - 1);
      for (const cluster_types::StageMember& m : s.group) {
        seat.weights.push_back(m.weight);
        const cluster_types::NodeInfo* known = membership.find(m.node_id);
        seat.exchange_addresses.push_back(known != nullptr && !known->exchange_address.empty() ? known->exchange_address
                                                                                               : m.exchange_address);
      }
    }
    return seat;
  }
  return std::nullopt;
}

std::optional<model::LayerRange> layers_of(const cluster_types::Placement& placement, const std::string& node_id) {
  for (const cluster_types::Stage& s : placement.stages) {
    const std::vector<std::string> nodes = nodes_of(s);
    if (std::find(nodes.begin(), nodes.end(), node_id) != nodes.end()) return model::LayerRange{s.first_layer, s.last_layer};
  }
  return std::nullopt;
}

std::shared_ptr<engine::Stage> Leadership::pipeline_stage(
    const cluster_types::Stage& stage,
    const std::function<std::shared_ptr<engine::Stage>(const cluster_types::Stage&)>& one) const {
  if (stage.group.empty()) return one(stage);
  std::vector<std::shared_ptr<engine::Stage>> members;
  std::vector<double> weights;
  for (const cluster_types::StageMember& m : stage.group) {
    std::shared_ptr<engine::Stage> member = one({m.node_id, m.node_address, stage.first_layer, stage.last_layer, {}});
    if (!member) return nullptr;
    members.push_back(std::move(member));
    weights.push_back(m.weight);
  }
  const std::vector<model::TensorShare> shares =
      options_.tensor_shares ? options_.tensor_shares(weights) : std::vector<model::TensorShare>{};
  return std::make_shared<engine::GroupStage>(std::move(members), shares);
}

Leadership::Leadership(LeadershipOptions options) : options_(std::move(options)), scheduler_(options_.make_engine) {}

void Leadership::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

std::optional<cluster_types::SchedulerCounts> Leadership::scheduler_counts() const {
  const std::shared_ptr<engine::Engine>& engine = scheduler_.engine();
  if (!engine) return std::nullopt;
  const engine::Engine::SwitchCounts counts = engine->switch_counts();
  const engine::Engine::SpeculationCounts drafts = engine->speculation();
  return cluster_types::SchedulerCounts{counts.handed_over, counts.recomputed, engine->preemptions(),
                         drafts.steps,       drafts.drafted,    drafts.accepted};
}

void Leadership::adopt(const cluster_types::Placement& placement) {
  if (placement.epoch != placement_.epoch) {
    metrics::process_registry().counter("strata_placement_switches_total", "Placements this node has taken up.").add();
  }
  placement_ = placement;
  recent_[placement.epoch] = placement;
  while (recent_.size() > kRecentPlacements) recent_.erase(recent_.begin());
}

ControlEvent Leadership::place(const control::ProposePlacement& proposal, const std::vector<cluster_types::NodeInfo>& members) {
  const Proposal next = propose_placement(proposal.epoch, members, placement_, proposal.may_repair, options_.rules);
  if (!next.waits.empty()) {
    // A hand-made placement may name nodes that have not joined yet: wait for them. These
    // members are seen, so that a node of the placement that left and comes back (a new
    // process, holding no sequences) gets a new epoch.
    if (waits_logged_.insert(next.waits).second) log("the fixed placement waits: " + next.waits);
    return control::PlacementWaits{proposal.members};
  }
  adopt(next.placement);
  return control::PlacementMade{proposal.members, view_of(next.placement)};
}

void Leadership::stand_aside(const std::string& why) {
  if (scheduler_.engine()) scheduler_.retire(engine::FinishReason::Error, why, std::nullopt);
  if (!placement_.stages.empty() || !placement_.error.empty()) placement_ = cluster_types::Placement();
}

void Leadership::follow(const ControlState& control, const StageHost& stages, ControlTime now) {
  const std::string& self = options_.rules.leader_id;
  // Every node of the pipeline this node schedules still runs.
  const auto scheduled_nodes_alive = [&] { return all_alive(control, scheduler_.nodes(), now); };
  const std::string lost = std::string(rpc::kSchedulerLost) + "this node no longer leads the cluster";
  if (scheduler_.engine() && placement_.leader_id != self) {
    const bool alive = scheduled_nodes_alive();
    // Until then its requests go on here, and new ones wait for the new leader.
    if (alive && placement_.error.empty() && serving_leader(control, now) == nullptr) return;
    log(alive ? "another node leads now: the requests scheduled here move to it with their state"
              : "another node leads now: the requests scheduled here move to it");
    // A request passed on, or ended as Lost, goes on at the next leader.
    scheduler_.retire(engine::FinishReason::Lost, lost, alive ? std::optional(scheduler_.epoch()) : std::nullopt);
  }
  if (scheduler_.engine() && !placement_.error.empty()) {
    // The nodes left cannot hold the model: its requests end now, saying what is missing.
    log("the requests scheduled here end: " + placement_.error);
    scheduler_.retire(engine::FinishReason::Error, placement_.error, std::nullopt);
  }
  if (placement_.leader_id != self || placement_.stages.empty()) return;
  if (scheduling()) return;
  // Every stage holds its layers first; only then are the links to them made.
  for (const cluster_types::Stage& s : placement_.stages) {
    for (const std::string& node : nodes_of(s)) {
      const bool ready = node == self ? stages.ready_for(placement_.epoch) : peer_ready(control, node, placement_.epoch, now);
      if (!ready) return;
    }
  }
  std::vector<std::shared_ptr<engine::Stage>> pipeline;
  std::vector<std::string> nodes;
  for (const cluster_types::Stage& s : placement_.stages) {
    pipeline.push_back(pipeline_stage(s, [&](const cluster_types::Stage& part) {
      return part.node_id == self ? stages.current() : options_.remote_stage(part, placement_.epoch, /*leading=*/true);
    }));
    for (std::string& node : nodes_of(s)) nodes.push_back(std::move(node));
  }
  // When every node of the old pipeline still runs (one leaves or joins), the sequences'
  // state moves to the new stages; after a loss they are computed again.
  scheduler_.serve(std::move(pipeline), scheduled_nodes_alive(), placement_.epoch, std::move(nodes));
  log("serving placement " + std::to_string(scheduler_.epoch()) + " (" + std::to_string(placement_.stages.size()) +
      " stage(s))");
}

std::shared_ptr<engine::Stage> Leadership::reached_stage(cluster_types::Stage stage, uint64_t epoch, bool leading,
                                                         const Membership& membership) {
  if (const cluster_types::NodeInfo* peer = membership.find(stage.node_id)) stage.node_address = peer->node_address;
  return options_.remote_stage(stage, epoch, leading);
}

std::vector<std::shared_ptr<engine::Stage>> Leadership::stages_of(uint64_t epoch, const StageHost& stages,
                                                                  const Membership& membership) {
  const auto found = recent_.find(epoch);
  if (found == recent_.end()) return {};
  std::vector<std::shared_ptr<engine::Stage>> pipeline;
  for (const cluster_types::Stage& s : found->second.stages) {
    std::shared_ptr<engine::Stage> stage = pipeline_stage(s, [&](const cluster_types::Stage& part) {
      return part.node_id != options_.rules.leader_id ? reached_stage(part, epoch, /*leading=*/true, membership)
                                                      : stages.stage_of(epoch);
    });
    if (!stage) return {};
    pipeline.push_back(std::move(stage));
  }
  return pipeline;
}

std::shared_ptr<engine::Stage> Leadership::chain_stage(uint64_t epoch, const std::string& node_id,
                                                       const Membership& membership) {
  const auto found = recent_.find(epoch);
  if (found == recent_.end() || node_id == options_.rules.leader_id) return nullptr;
  // A group is named by its first member; a batch passed on to it goes to every member.
  for (const cluster_types::Stage& s : found->second.stages) {
    if (s.node_id != node_id) continue;
    return pipeline_stage(s, [&](const cluster_types::Stage& part) {
      return reached_stage(part, epoch, /*leading=*/false, membership);
    });
  }
  return nullptr;
}

}  // namespace strata::cluster
