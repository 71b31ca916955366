#include "cluster/membership.h"

#include "rpc/auth.h"
#include "rpc/messages.h"

namespace strata::cluster {
namespace {

// "ipv4:10.0.0.2:43122" -> "10.0.0.2"
std::string host_of_peer(const std::string& peer) {
  std::string rest = peer;
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (rest.starts_with(scheme)) rest = rest.substr(std::string_view(scheme).size());
  }
  return rest.substr(0, rest.rfind(':'));
}

}  // namespace

PlacementView view_of(const cluster_types::Placement& p) {
  PlacementView view{p.epoch, p.leader_id, {}, !p.error.empty()};
  for (const cluster_types::Stage& s : p.stages) view.stages.push_back({s.node_id, s.node_address});
  return view;
}

NodeView view_of(const cluster_types::NodeInfo& info) {
  NodeView view{info.node_id, info.node_address, info.instance,         info.started_unix_ms, info.ready_epoch,
                info.state,   info.leaving,      info.protocol_version, info.model_hash,      info.model_name,
                !info.exchange_address.empty()};
  for (const cluster_types::LinkMeasure& link : info.links) view.measured_links.push_back(link.peer_id);
  return view;
}

Membership::Membership(ControlState initial, std::function<void(const std::string&)> log)
    : control_(std::move(initial)), log_(std::move(log)) {}

void Membership::listening_at(const std::string& address, bool group_links, ControlTime now) {
  control_.self.address = address;
  control_.self.has_group_links = group_links;
  control_.started = now;
}

std::vector<ControlAction> Membership::decide(const ControlEvent& event, ControlTime now) {
  return decide(event, now, nullptr);
}

std::vector<ControlAction> Membership::decide(const ControlEvent& event, ControlTime now,
                                             const cluster_types::Hello* heard) {
  ControlStep next = step(std::move(control_), event, now);
  control_ = std::move(next.state);
  std::vector<ControlAction> left;
  for (ControlAction& action : next.actions) {
    if (const auto* a = std::get_if<control::KeepInfo>(&action)) {
      const cluster_types::NodeInfo& info = a->source < 0 ? heard->sender : heard->known[a->source];
      infos_[info.node_id] = info;
    } else {
      left.push_back(std::move(action));
    }
  }
  return left;
}

std::vector<ControlAction> Membership::hear(const cluster_types::Hello& hello, const std::string& address,
                                            double rtt_ms, ControlTime now) {
  control::HelloHeard heard{view_of(hello.sender), {}, view_of(hello.placement), address, rtt_ms, rpc::unix_time_ms()};
  for (const cluster_types::NodeInfo& info : hello.known) heard.known.push_back(view_of(info));
  return decide(heard, now, &hello);
}

std::vector<ControlAction> Membership::hello_received(const cluster_types::Hello& hello, const std::string& peer,
                                                      ControlTime now) {
  cluster_types::Hello heard = hello;
  // A node that listens on every interface names its ports only: it is at the host it calls from.
  for (std::string* address : {&heard.sender.node_address, &heard.sender.exchange_address}) {
    if (address->starts_with(":")) *address = host_of_peer(peer) + *address;
  }
  return hear(heard, {}, 0.0, now);
}

std::vector<ControlAction> Membership::hello_answered(const std::string& address, const rpc::HelloOutcome& outcome,
                                                      ControlTime now) {
  switch (outcome.failure) {
    case rpc::HelloFailure::None:
      break;
    case rpc::HelloFailure::Unreachable:
      return decide(control::HelloRefused{address}, now);
    case rpc::HelloFailure::HandshakeRefused: {
      std::vector<ControlAction> actions = decide(control::HelloRefused{address}, now);
      actions.push_back(control::LogOnce{address + " handshake",
                                         "the TLS handshake with the node at " + address +
                                             " was refused: it has another cluster key (or it is not "
                                             "a Strata node of protocol " +
                                             std::to_string(rpc::kProtocolVersion) + "): " + outcome.message});
      return actions;
    }
    case rpc::HelloFailure::IdTaken:
      return decide(control::IdTaken{address, outcome.message}, now);
    case rpc::HelloFailure::Refused:
      return {
          control::LogOnce{address + outcome.message, "node at " + address + " refused this node: " + outcome.message}};
    case rpc::HelloFailure::Malformed:
      return {control::LogOnce{address + outcome.message,
                               "refused the Hello reply of the node at " + address + ": " + outcome.message}};
    case rpc::HelloFailure::Other:
      return {};
  }
  cluster_types::Hello reply = outcome.reply;
  for (std::string* named : {&reply.sender.node_address, &reply.sender.exchange_address}) {
    if (named->starts_with(":")) *named = address.substr(0, address.rfind(':')) + *named;
  }
  return hear(reply, address, outcome.rtt_ms, now);
}

const cluster_types::NodeInfo* Membership::find(const std::string& id) const {
  const auto found = infos_.find(id);
  return found == infos_.end() ? nullptr : &found->second;
}

std::vector<cluster_types::NodeInfo> Membership::alive_infos(ControlTime now) const {
  std::vector<cluster_types::NodeInfo> infos;
  for (const auto& [id, peer] : control_.peers) {
    if (alive(peer, now)) infos.push_back(infos_.at(id));
  }
  return infos;
}

std::vector<cluster_types::NodeInfo> Membership::all_infos() const {
  std::vector<cluster_types::NodeInfo> infos;
  for (const auto& [id, info] : infos_) infos.push_back(info);
  return infos;
}

std::vector<cluster_types::NodeStatus> Membership::peer_statuses(ControlTime now) const {
  std::vector<cluster_types::NodeStatus> statuses;
  for (const auto& [id, peer] : control_.peers) {
    const std::optional<double> last_seen =
        peer.seen ? std::optional(std::chrono::duration<double>(now - peer.last_seen).count()) : std::nullopt;
    statuses.push_back({infos_.at(id), false, cluster_types::PeerLink{alive(peer, now), last_seen, peer.rtt_ms, peer.problem}});
  }
  return statuses;
}

std::vector<WeightsHolder> Membership::weights_holders(ControlTime now) const {
  std::vector<WeightsHolder> holders;
  for (const auto& [id, peer] : control_.peers) {
    if (!alive(peer, now) || !compatible(peer)) continue;
    const cluster_types::NodeInfo& info = infos_.at(id);
    holders.push_back({info.node_address, info.weights.value_or(cluster_types::Weights{})});
  }
  return holders;
}

std::string Membership::left_out_text(ControlTime now) const {
  std::string text;
  for (const auto& [id, peer] : control_.peers) {
    if (alive(peer, now) && !compatible(peer)) {
      text += "\n  " + id + " at " + peer.info.address + " is left out: it " + peer.problem;
    }
  }
  return text;
}

void Membership::log_once(const std::string& key, const std::string& line) {
  if (said_once_.insert(key).second && log_) log_(line);
}

}  // namespace strata::cluster
