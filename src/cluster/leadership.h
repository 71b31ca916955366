// Leadership and placement: the placement this node holds (the leader's, adopted from its
// Hellos, or made here when this node leads), the last few before it, whose stages may still
// hold the state of requests passed on, and, on the leader, the scheduler that runs every
// request over the current placement's pipeline, following the placement as it changes. Not
// thread-safe: the node's lock guards it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cluster_types/cluster_status.h"
#include "cluster/control_rules.h"
#include "cluster/leader_scheduler.h"
#include "cluster/membership.h"
#include "cluster/placement_proposal.h"
#include "cluster/stage_host.h"
#include "cluster_types/placement.h"
#include "model/tensor_share.h"

namespace strata::cluster {

// The layers `placement` gives node `node_id` (alone or in a group), or nullopt.
std::optional<model::LayerRange> layers_of(const cluster_types::Placement& placement, const std::string& node_id);
// Node `node_id`'s part of `placement`'s stage: its layers, and its place in their group, whose
// members' links are at the addresses `membership` knows, else the placement's.
std::optional<StageSeat> seat_of(const cluster_types::Placement& placement, const std::string& node_id,
                                 const Membership& membership);
// The nodes that compute `stage`: its node, or its group's members.
std::vector<std::string> nodes_of(const cluster_types::Stage& stage);

struct LeadershipOptions {
  PlacementRules rules;  // rules.leader_id: this node's id
  LeaderScheduler::MakeEngine make_engine;
  // Another node's stage `stage` of placement `epoch`; `leading`: the leader's, which repairs the
  // placement when the stage is lost.
  std::function<std::shared_ptr<engine::Stage>(const cluster_types::Stage& stage, uint64_t epoch, bool leading)> remote_stage;
  std::function<void(const std::string&)> log;
  // The shares of a tensor-parallel group of members of these weights, as its members plan
  // them (model::plan_tensor_shares), by which a group takes sequences' state over at a switch.
  // Unset: a group's sequences are computed again there.
  std::function<std::vector<model::TensorShare>(std::span<const double> weights)> tensor_shares;
};

class Leadership {
 public:
  explicit Leadership(LeadershipOptions options);

  const cluster_types::Placement& placement() const { return placement_; }
  LeaderScheduler& scheduler() { return scheduler_; }
  const LeaderScheduler& scheduler() const { return scheduler_; }
  // This node schedules the requests of the current placement.
  bool scheduling() const { return scheduler_.serves(placement_.epoch); }
  // While a scheduler runs here: its sequences handed over and computed again at placement
  // switches, and pre-empted.
  std::optional<cluster_types::SchedulerCounts> scheduler_counts() const;

  // Takes `placement` up (the leader's, or this node's own); the last few are kept.
  void adopt(const cluster_types::Placement& placement);
  // Leader: places the model as `proposal` asks, over `members` (what each says of itself), and
  // takes the placement up; returns what the rules are to hear of it: PlacementMade, or
  // PlacementWaits while a placement fixed by hand names nodes that have not joined.
  ControlEvent place(const control::ProposePlacement& proposal, const std::vector<cluster_types::NodeInfo>& members);
  // This node takes no part: its placement, made before it was refused, is let go with its
  // scheduler's requests, which end with `why`.
  void stand_aside(const std::string& why);

  // The leader's scheduler follows the placement (`control` says which nodes run, `stages`
  // whether this node's stage is ready): once every stage holds its layers it runs requests
  // there, requests of an older placement going on in the new one, computed again from their
  // tokens or moved with their state. A node that stops leading passes its requests on to the
  // new leader once that serves, with their state while every stage of its pipeline runs; when
  // the model no longer fits, they end.
  void follow(const ControlState& control, const StageHost& stages, ControlTime now);

  // The stages of placement `epoch`, as far as they may still hold sequences' state (the state
  // of requests a previous leader passed on moves from them), other nodes' reached at the
  // address `membership` knows them by now; empty when unknown.
  std::vector<std::shared_ptr<engine::Stage>> stages_of(uint64_t epoch, const StageHost& stages,
                                                        const Membership& membership);
  // Node `node_id`'s stage of placement `epoch` (of a group, its first member's: the group),
  // where this node passes a batch's output on to it (a chain), or null.
  std::shared_ptr<engine::Stage> chain_stage(uint64_t epoch, const std::string& node_id, const Membership& membership);

 private:
  // Another node's stage of a recent placement (the current one too), at the address this node
  // knows it by now: a leader names itself in its placements by the port it listens on only.
  std::shared_ptr<engine::Stage> reached_stage(cluster_types::Stage stage, uint64_t epoch, bool leading,
                                               const Membership& membership);
  // `stage` as a pipeline runs it: `one` gives a node's own part (this node's or another's),
  // and a group's parts make one engine::GroupStage. Null when a part is missing.
  std::shared_ptr<engine::Stage> pipeline_stage(
      const cluster_types::Stage& stage,
      const std::function<std::shared_ptr<engine::Stage>(const cluster_types::Stage&)>& one) const;
  void log(const std::string& line) const;

  LeadershipOptions options_;
  cluster_types::Placement placement_;
  std::map<uint64_t, cluster_types::Placement> recent_;  // by epoch, the current one included
  std::set<std::string> waits_logged_;         // why a fixed placement waits, said once each
  LeaderScheduler scheduler_;
};

}  // namespace strata::cluster
