// What a node does with what the rules decide (control_rules.h, through its membership): the
// one place their actions are carried out on the node's parts (a placement taken up or made by
// leadership, the layers held by the stage host, news told at once by gossip, lines logged),
// and what the node does once a gossip round's Hellos have answered. It holds no state of its
// own: the parts do. Not thread-safe: the node's lock guards it and the parts it drives (the
// stage host and gossip have locks of their own, taken after the node's).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cluster/control_rules.h"
#include "cluster/gossip.h"
#include "cluster/leadership.h"
#include "cluster/membership.h"
#include "cluster/stage_host.h"

namespace strata::cluster {

struct ControlParts {
  Membership& membership;
  Leadership& leadership;
  StageHost& stages;
  Gossip& gossip;
};

class ControlDriver {
 public:
  // `self_info`: what the node says of itself now, as the placements it makes count it.
  ControlDriver(std::string node_id, ControlParts parts, std::function<cluster_types::NodeInfo()> self_info,
                std::function<void(const std::string&)> log);

  // What the rules decided on an event that its caller acts on.
  struct Decision {
    std::string refuse_caller;  // the Hello received is answered with this refusal
    bool stood_aside = false;
  };
  // Carries out `actions` in order; `heard` is the placement of the Hello they were decided on.
  Decision carry_out(const std::vector<ControlAction>& actions, const cluster_types::Placement* heard = nullptr);
  // The rules decide on `event`, and their actions are carried out.
  Decision decide(const ControlEvent& event, ControlTime now);

  // After a gossip round's Hellos: the rules' round (peers gone, a new placement). A new
  // placement goes out first (the next round, at once): loading layers here would take the
  // cores its Hellos need. Otherwise the node holds its layers of the placement, schedules it
  // when it leads, and lets its previous stage go once none needs it.
  void round(ControlTime now);

 private:
  // Leader only: the new placement the rules ask for.
  void place(const control::ProposePlacement& proposal, ControlTime now);
  void log(const std::string& line) const;

  std::string node_id_;
  ControlParts parts_;
  std::function<cluster_types::NodeInfo()> self_info_;
  std::function<void(const std::string&)> log_;
};

}  // namespace strata::cluster
