#include "cluster/control_rules.h"

#include <algorithm>
#include <optional>

namespace strata::cluster {
namespace {

using namespace control;

// Whether the process that says `info` about itself may go by its node id: a node id belongs to
// one process while it runs, the one of those under it that started first (then: the lower
// instance), the same rule on every node. A process restarted on the same address, or once the
// one before it is seen gone, takes it over. (A node that says it is refused is placed nowhere
// until it says otherwise: members().)
struct IdCheck {
  enum Verdict { Fine, Refused, ThisNodeRefused } verdict = Fine;
  std::string why;
};

bool came_first(const NodeView& a, const NodeView& b) {
  return a.started_unix_ms != b.started_unix_ms ? a.started_unix_ms < b.started_unix_ms : a.instance < b.instance;
}

IdCheck check_id(const ControlState& state, const NodeView& info, ControlTime now, int64_t unix_ms) {
  const auto taken_by = [&](const NodeView& holder) {
    const int64_t age_ms = std::max<int64_t>(0, unix_ms - holder.started_unix_ms);
    return "node id '" + info.id + "' is taken by the node at " + holder.address + " (started " +
           std::to_string(age_ms / 1000) + " s ago)";
  };
  if (info.id == state.self.id) {
    if (info.instance == state.self.instance) return {};
    return came_first(state.self, info) ? IdCheck{IdCheck::Refused, taken_by(state.self)}
                                        : IdCheck{IdCheck::ThisNodeRefused, taken_by(info)};
  }
  const auto found = state.peers.find(info.id);
  const bool held = found != state.peers.end() && found->second.seen && alive(found->second, now) &&
                    found->second.info.instance != info.instance && found->second.info.address != info.address;
  if (!held || came_first(info, found->second.info)) return {};
  return {IdCheck::Refused, taken_by(found->second.info)};
}

class Stepper {
 public:
  Stepper(ControlState state, ControlTime now) : state_(std::move(state)), now_(now) {}

  ControlStep finish() && { return {std::move(state_), std::move(actions_)}; }

  void operator()(const HelloHeard& hello) {
    const bool received = hello.address.empty();
    if (!received) state_.refused_by.erase(hello.address);
    const IdCheck id = check_id(state_, hello.sender, now_, hello.unix_ms);
    const std::string& address = received ? hello.sender.address : hello.address;
    if (id.verdict == IdCheck::Refused) {
      actions_.push_back(LogOnce{"refused " + address + hello.sender.instance,
                                 received ? "refused node " + hello.sender.id + " at " + address + ": " + id.why
                                          : "node " + hello.sender.id + " at " + address + " is left out: " + id.why});
      if (received) actions_.push_back(RefuseCaller{id.why});
      return;
    }
    if (id.verdict == IdCheck::ThisNodeRefused) note_refused(address, id.why);
    // A node refused takes nothing in.
    if (!refusal(state_, now_).empty()) return;
    if (!received) {
      if (const auto seed = state_.seeds.find(hello.address); seed != state_.seeds.end()) seed->second = true;
    }
    if (take_in(hello)) actions_.push_back(ActNow{});
  }

  // Refused twice in a row: the node's process is gone, no need to wait for the timeout that a
  // silent (unplugged) node needs.
  void operator()(const HelloRefused& refused) {
    bool gone = false;
    for (auto& [id, peer] : state_.peers) {
      if (peer.info.address == refused.address && ++peer.refused_hellos >= 2 && alive(peer, now_)) {
        peer.last_seen = now_ - kPeerTimeout;
        gone = true;
      }
    }
    if (gone) actions_.push_back(ActNow{});
  }

  void operator()(const IdTaken& taken) { note_refused(taken.address, taken.why); }

  // Counts as the first refused Hello: the one said at once then decides whether its node is
  // gone, and the new placement follows in the same round.
  void operator()(const StageFailed& failed) {
    const auto found = state_.peers.find(failed.peer_id);
    if (found != state_.peers.end() && failed.unreachable) {
      found->second.refused_hellos = std::max(found->second.refused_hellos, 1);
    }
    actions_.push_back(ActNow{});
  }

  void operator()(const DrainAsked&) {
    state_.leaving = true;
    actions_.push_back(ActNow{});
  }

  void operator()(const LinksMeasured& measured) { state_.self.measured_links = measured.peers; }

  void operator()(const Round&) {
    log_departed();
    if (const std::string why = refusal(state_, now_); !why.empty()) {
      // Its placement, made before it was refused, is let go with its stage and its requests.
      if (!state_.placement.stages.empty() || state_.placement.failed) state_.placement = {};
      actions_.push_back(StandAside{why});
      return;
    }
    if (leader_id(state_, now_) == state_.self.id) propose_when_due();
  }

  void operator()(const PlacementMade& made) {
    state_.placed_members = made.members;
    for (auto& [id, peer] : state_.peers) peer.restarted = false;
    state_.placement = made.placement;
    actions_.push_back(ActNow{});  // tell the members now
  }

  void operator()(const PlacementWaits& waits) { state_.placed_members = waits.members; }

 private:
  // This node takes no part while the node at `address` goes on saying so.
  void note_refused(const std::string& address, const std::string& why) {
    const bool first = !state_.refused_by.contains(address);
    state_.refused_by[address] = {why, now_};
    if (first) {
      actions_.push_back(Log{"this node takes no part in the cluster: " + why +
                             "; give it another --node-id (or --state-dir) (if that node was this one before a "
                             "restart, this one is let in once it is seen gone)"});
    }
  }

  // The sender itself, then, from a node of this model and protocol only, the nodes it knows
  // and its placement (another model's placements are its own cluster's). Returns whether that
  // is news to act on at once.
  bool take_in(const HelloHeard& hello) {
    const bool news = learn(hello.sender, true, hello.rtt_ms, -1);
    const auto found = state_.peers.find(hello.sender.id);
    if (found == state_.peers.end() || !compatible(found->second)) return news;
    for (size_t i = 0; i < hello.known.size(); ++i) learn(hello.known[i], false, 0.0, static_cast<int>(i));
    return adopt(hello.placement) || news;
  }

  // What a node says about itself (direct) or what another said about it. Returns whether the
  // peer's process, readiness or serving state changed, which a leader acts on.
  bool learn(const NodeView& info, bool direct, double rtt_ms, int source) {
    if (info.id.empty() || info.id == state_.self.id) return false;
    auto [it, inserted] = state_.peers.try_emplace(info.id);
    PeerState& peer = it->second;
    const bool news = direct && (inserted || peer.info.instance != info.instance ||
                                 peer.info.ready_epoch != info.ready_epoch || peer.info.state != info.state);
    if (direct && !inserted && !peer.info.instance.empty() && peer.info.instance != info.instance) {
      peer.restarted = true;
    }
    if (direct || inserted) {
      peer.info = info;
      actions_.push_back(KeepInfo{source});
    }
    if (direct) {
      peer.seen = true;
      peer.last_seen = now_;
      peer.refused_hellos = 0;
      if (rtt_ms > 0) peer.rtt_ms = rtt_ms;
    }
    std::string problem;
    if (info.protocol_version != state_.self.protocol_version) {
      problem = "speaks protocol " + std::to_string(info.protocol_version) + ", this node " +
                std::to_string(state_.self.protocol_version);
    } else if (info.model_hash != state_.self.model_hash) {
      problem = "runs another model (" + info.model_name + ", hash " + info.model_hash.substr(0, 12) + ")";
    }
    if (problem != peer.problem && !problem.empty()) actions_.push_back(Log{"node " + info.id + " is left out: it " + problem});
    if (inserted) actions_.push_back(Log{"node " + info.id + " at " + info.address + " is known"});
    peer.problem = problem;
    return news;
  }

  // A newer placement wins; at the same epoch, the one of the lower leader id: an older one
  // arriving late changes nothing, and two leaders of a partition that heals agree.
  bool adopt(const PlacementView& p) {
    if (p.leader_id.empty() || !refusal(state_, now_).empty()) return false;
    if (const auto leader = state_.peers.find(p.leader_id); leader != state_.peers.end() && !compatible(leader->second)) {
      return false;
    }
    const PlacementView& current = state_.placement;
    const bool newer = p.epoch > current.epoch || (p.epoch == current.epoch && p.leader_id < current.leader_id);
    if (!newer) return false;
    state_.placement = p;
    actions_.push_back(AdoptPlacement{});
    return true;
  }

  void log_departed() {
    for (auto& [id, peer] : state_.peers) {
      if (peer.seen && !alive(peer, now_) && !peer.gone_logged) {
        actions_.push_back(Log{"node " + id + " has not answered for " +
                               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kPeerTimeout).count()) +
                               " s: left"});
        peer.gone_logged = true;
      } else if (alive(peer, now_)) {
        peer.gone_logged = false;
      }
    }
  }

  // A node of the placement that restarted faster than it could be seen leaving (another
  // process answers, perhaps at another address): it holds none of its layers, and the
  // placement must name it anew.
  bool stage_moved() const {
    return std::any_of(state_.placement.stages.begin(), state_.placement.stages.end(), [&](const PlacedStage& s) {
      const auto found = state_.peers.find(s.node_id);
      return found != state_.peers.end() && alive(found->second, now_) &&
             (found->second.restarted || found->second.info.address != s.node_address);
    });
  }

  uint64_t max_epoch() const {
    uint64_t epoch = state_.placement.epoch;
    for (const auto& [id, peer] : state_.peers) {
      if (compatible(peer)) epoch = std::max(epoch, peer.info.ready_epoch);
    }
    return epoch;
  }

  const NodeView& view(const std::string& id) const {
    return id == state_.self.id ? state_.self : state_.peers.at(id).info;
  }

  // Every two `members` with group links have measured the link between them, one or the other.
  bool links_measured(const std::vector<std::string>& members) const {
    const auto measured = [](const NodeView& from, const NodeView& to) {
      return std::find(from.measured_links.begin(), from.measured_links.end(), to.id) != from.measured_links.end();
    };
    for (size_t i = 0; i < members.size(); ++i) {
      for (size_t j = i + 1; j < members.size(); ++j) {
        const NodeView& a = view(members[i]);
        const NodeView& b = view(members[j]);
        if (a.has_group_links && b.has_group_links && !measured(a, b) && !measured(b, a)) return false;
      }
    }
    return true;
  }

  // Leader only: a new placement when the members changed and have settled.
  void propose_when_due() {
    const std::vector<std::string> now = members(state_, now_);
    if (now != state_.last_members) {
      state_.last_members = now;
      state_.members_changed_at = now_;
    }
    const PlacementView& placement = state_.placement;
    if (now == state_.placed_members && placement.leader_id == state_.self.id && !stage_moved()) return;
    // Nodes that join may come in a group, so the leader waits for them to settle; nodes that
    // left are gone, and the requests they carried wait for a new placement.
    std::vector<std::string> before = state_.placed_members;
    for (const PlacedStage& stage : placement.stages) before.push_back(stage.node_id);
    std::sort(before.begin(), before.end());
    const bool only_left = std::includes(before.begin(), before.end(), now.begin(), now.end());
    if (now_ - state_.members_changed_at < kSettle && !only_left) return;
    if (!only_left && !links_measured(now) && now_ - state_.members_changed_at < kLinkWait) return;
    const bool seeds_unanswered =
        std::any_of(state_.seeds.begin(), state_.seeds.end(), [](const auto& seed) { return !seed.second; });
    if (seeds_unanswered && now_ - state_.started < kSeedWait) return;
    actions_.push_back(ProposePlacement{now, max_epoch() + 1, only_left && !placement.stages.empty() && !placement.failed});
  }

  ControlState state_;
  ControlTime now_;
  std::vector<ControlAction> actions_;
};

}  // namespace

ControlState initial_control_state(NodeView self, const std::vector<std::string>& seeds, ControlTime now) {
  ControlState state;
  state.self = std::move(self);
  state.started = now;
  for (const std::string& seed : seeds) state.seeds[seed] = false;
  return state;
}

ControlStep step(ControlState state, const ControlEvent& event, ControlTime now) {
  Stepper stepper(std::move(state), now);
  std::visit(stepper, event);
  return std::move(stepper).finish();
}

bool alive(const PeerState& peer, ControlTime now) { return peer.seen && now - peer.last_seen < kPeerTimeout; }

std::vector<std::string> members(const ControlState& state, ControlTime now) {
  std::vector<std::string> ids;
  if (!state.leaving) ids.push_back(state.self.id);
  for (const auto& [id, peer] : state.peers) {
    if (alive(peer, now) && compatible(peer) && !peer.info.leaving && peer.info.state != "refused") ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::string leader_id(const ControlState& state, ControlTime now) {
  const std::vector<std::string> ids = members(state, now);
  return ids.empty() ? state.self.id : ids.front();
}

std::string refusal(const ControlState& state, ControlTime now) {
  for (const auto& [address, refused] : state.refused_by) {
    if (now - refused.at < kPeerTimeout) return "this node takes no part: " + refused.why;
  }
  return {};
}

const PeerState* serving_leader(const ControlState& state, ControlTime now) {
  const PlacementView& placement = state.placement;
  if (placement.leader_id.empty() || placement.leader_id == state.self.id) return nullptr;
  const auto found = state.peers.find(placement.leader_id);
  if (found == state.peers.end() || !alive(found->second, now)) return nullptr;
  const NodeView& info = found->second.info;
  return info.state == "serving" && info.ready_epoch <= placement.epoch ? &found->second : nullptr;
}

bool peer_ready(const ControlState& state, const std::string& id, uint64_t epoch, ControlTime now) {
  const auto found = state.peers.find(id);
  return found != state.peers.end() && alive(found->second, now) && found->second.info.ready_epoch == epoch;
}

bool all_alive(const ControlState& state, const std::vector<std::string>& ids, ControlTime now) {
  return std::all_of(ids.begin(), ids.end(), [&](const std::string& id) {
    const auto found = state.peers.find(id);
    return id == state.self.id || (found != state.peers.end() && alive(found->second, now));
  });
}

bool someone_takes_over(const ControlState& state, ControlTime now) {
  return std::any_of(state.peers.begin(), state.peers.end(), [&](const auto& entry) {
    return alive(entry.second, now) && compatible(entry.second) && !entry.second.info.leaving;
  });
}

}  // namespace strata::cluster
