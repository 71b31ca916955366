// What this node knows of its cluster: the rules' state (control_rules.h), what each peer last
// said of itself, whole, and the lines already said once. It turns what peers say into the
// rules' events, keeps what a Hello says of its nodes (KeepInfo) and hands
// the other actions back to the node, in order. No threads, no I/O, so that it is tested on
// Hellos of the test's own
// (tests/cluster/membership_test.cpp). Not thread-safe: the node's lock guards it.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cluster_types/cluster_status.h"
#include "cluster/control_rules.h"
#include "cluster/node_weights.h"
#include "cluster_types/hello.h"
#include "rpc/hello_client.h"

namespace strata::cluster {

// The cluster's own types for what peers say.
NodeView view_of(const cluster_types::NodeInfo& info);
PlacementView view_of(const cluster_types::Placement& placement);

class Membership {
 public:
  Membership(ControlState initial, std::function<void(const std::string&)> log);

  const ControlState& control() const { return control_; }
  // The node service listens: this node's address, whether its group links listen too, and the
  // time its membership starts from.
  void listening_at(const std::string& address, bool group_links, ControlTime now);

  // The rules decide on `event`; returns the actions left to the node (all but KeepInfo), in
  // order. A HelloHeard comes through hello_received or hello_answered, which keep what its
  // sender says.
  std::vector<ControlAction> decide(const ControlEvent& event, ControlTime now);
  // A Hello from the node whose call came from transport address `peer` ("ipv4:10.0.0.2:43122"):
  // a node that listens on every interface is reached at the host its call came from.
  // AdoptPlacement adopts the request's placement.
  std::vector<ControlAction> hello_received(const cluster_types::Hello& hello, const std::string& peer, ControlTime now);
  // What came of this node's Hello to `address`: its reply taken in (AdoptPlacement adopts the
  // reply's placement), or its failure decided on (a connection refused counts against the
  // peer); a refusal or a malformed reply is said once (LogOnce).
  std::vector<ControlAction> hello_answered(const std::string& address, const rpc::HelloOutcome& outcome,
                                            ControlTime now);

  // What peer `id` of control() last said of itself.
  const cluster_types::NodeInfo& info(const std::string& id) const { return infos_.at(id); }
  // The same of any node heard of, or null.
  const cluster_types::NodeInfo* find(const std::string& id) const;
  // What the peers this node sees alive say of themselves, as its Hellos tell them; and what
  // every peer it knows says, as its replies do.
  std::vector<cluster_types::NodeInfo> alive_infos(ControlTime now) const;
  std::vector<cluster_types::NodeInfo> all_infos() const;
  // Every peer as /cluster shows it: what it says of itself, and how this node hears from it.
  std::vector<cluster_types::NodeStatus> peer_statuses(ControlTime now) const;
  // The live peers of this model, with the weights each says it holds, in id order.
  std::vector<WeightsHolder> weights_holders(ControlTime now) const;
  // The live nodes that a placement leaves out for their model or protocol, as lines of the
  // placement's log: a node alone among such nodes says why.
  std::string left_out_text(ControlTime now) const;

  // Logs `line` the first time `key` is said (the node carries out LogOnce so).
  void log_once(const std::string& key, const std::string& line);

 private:
  // The Hello an event came from: what KeepInfo takes of it.
  std::vector<ControlAction> decide(const ControlEvent& event, ControlTime now, const cluster_types::Hello* heard);
  // A Hello received (`address` empty), or the reply to this node's Hello to `address`.
  std::vector<ControlAction> hear(const cluster_types::Hello& hello, const std::string& address, double rtt_ms,
                                  ControlTime now);

  ControlState control_;
  std::map<std::string, cluster_types::NodeInfo> infos_;  // what each peer of control_ said of itself, whole
  std::set<std::string> said_once_;             // keys of log lines said once
  std::function<void(const std::string&)> log_;
};

}  // namespace strata::cluster
