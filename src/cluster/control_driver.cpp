#include "cluster/control_driver.h"

namespace strata::cluster {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
// Clang before 17 deduces no aggregate's template arguments by itself.
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace

ControlDriver::ControlDriver(std::string node_id, ControlParts parts, std::function<cluster_types::NodeInfo()> self_info,
                             std::function<void(const std::string&)> log)
    : node_id_(std::move(node_id)), parts_(parts), self_info_(std::move(self_info)), log_(std::move(log)) {}

void ControlDriver::log(const std::string& line) const {
  if (log_) log_(line);
}

ControlDriver::Decision ControlDriver::carry_out(const std::vector<ControlAction>& actions,
                                                 const cluster_types::Placement* heard) {
  Decision decision;
  for (const ControlAction& action : actions) {
    std::visit(Overloaded{
                   [&](const control::Log& a) { log(a.line); },
                   [&](const control::LogOnce& a) { parts_.membership.log_once(a.key, a.line); },
                   [&](const control::ActNow&) { parts_.gossip.act_now(); },
                   [&](const control::RefuseCaller& a) { decision.refuse_caller = a.why; },
                   [&](const control::KeepInfo&) {},  // the membership keeps it
                   [&](const control::AdoptPlacement&) {
                     parts_.leadership.adopt(*heard);
                     log("placement " + std::to_string(heard->epoch) + " from " + heard->leader_id + ": " +
                         stages_text(*heard));
                   },
                   [&](const control::StandAside& a) {
                     // A node refused holds nothing and schedules nothing.
                     parts_.leadership.stand_aside(a.why);
                     parts_.stages.hold(std::nullopt, parts_.leadership.placement().epoch);
                     decision.stood_aside = true;
                   },
                   [&](const control::ProposePlacement& a) { place(a, ControlClock::now()); },
               },
               action);
  }
  return decision;
}

ControlDriver::Decision ControlDriver::decide(const ControlEvent& event, ControlTime now) {
  return carry_out(parts_.membership.decide(event, now));
}

void ControlDriver::round(ControlTime now) {
  const cluster_types::Placement& placement = parts_.leadership.placement();
  const uint64_t epoch = placement.epoch;
  if (decide(control::Round{}, now).stood_aside || placement.epoch != epoch) return;
  parts_.stages.hold(seat_of(placement, node_id_, parts_.membership), epoch);
  const ControlState& control = parts_.membership.control();
  parts_.leadership.follow(control, parts_.stages, now);
  const bool leader_serves = parts_.leadership.scheduling() || serving_leader(control, now) != nullptr;
  parts_.stages.drop_previous(leader_serves, epoch, now, kHandOverLimit);
}

void ControlDriver::place(const control::ProposePlacement& proposal, ControlTime now) {
  std::vector<cluster_types::NodeInfo> members;
  for (const std::string& id : proposal.members) {
    members.push_back(id == node_id_ ? self_info_() : parts_.membership.info(id));
  }
  const ControlEvent outcome = parts_.leadership.place(proposal, members);
  decide(outcome, now);
  if (!std::holds_alternative<control::PlacementMade>(outcome)) return;
  const cluster_types::Placement& placement = parts_.leadership.placement();
  log("placement " + std::to_string(placement.epoch) + " over " + std::to_string(members.size()) +
      " node(s): " + stages_text(placement) + (placement.reason.empty() ? "" : "\n  " + placement.reason) +
      parts_.membership.left_out_text(now));
}

}  // namespace strata::cluster
