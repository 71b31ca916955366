// The control plane's rules, one by one, on a clock of the test's own: a node joining, lost,
// draining, the leader lost, a node restarted under its id, two processes claiming one id, a
// partition that heals, an older placement arriving late, a peer of another model.
#include "cluster/control_rules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;
using Ids = std::vector<std::string>;

constexpr uint32_t kProtocol = 4;
const ControlTime t0 = ControlTime{} + 1h;

NodeView node(const std::string& id, const std::string& address, int64_t started_unix_ms = 1000) {
  NodeView view;
  view.id = id;
  view.address = address;
  view.instance = id + "@" + address + "/" + std::to_string(started_unix_ms);
  view.started_unix_ms = started_unix_ms;
  view.state = "idle";
  view.protocol_version = kProtocol;
  view.model_hash = "model";
  view.model_name = "model";
  return view;
}

PlacementView placement(uint64_t epoch, const std::string& leader, const std::vector<NodeView>& stages) {
  PlacementView p{epoch, leader, {}, false};
  for (const NodeView& n : stages) p.stages.push_back({n.id, n.address});
  return p;
}

// A node, fed events as its driver would, keeping the actions of the last one.
struct Node {
  explicit Node(NodeView self, const Ids& seeds = {}) : state(initial_control_state(std::move(self), seeds, t0)) {}

  const std::vector<ControlAction>& on(const ControlEvent& event, ControlTime now) {
    ControlStep next = step(state, event, now);
    state = std::move(next.state);
    actions = std::move(next.actions);
    return actions;
  }
  // A Hello received from `sender`.
  const std::vector<ControlAction>& hears(const NodeView& sender, ControlTime now, PlacementView p = {},
                                          std::vector<NodeView> known = {}) {
    return on(control::HelloHeard{sender, std::move(known), std::move(p), {}, 0.0, 2'000'000}, now);
  }
  // The reply of `sender` to this node's Hello.
  const std::vector<ControlAction>& answered_by(const NodeView& sender, ControlTime now, PlacementView p = {}) {
    return on(control::HelloHeard{sender, {}, std::move(p), sender.address, 1.5, 2'000'000}, now);
  }

  template <class A>
  std::vector<A> all() const {
    std::vector<A> found;
    for (const ControlAction& action : actions) {
      if (const A* a = std::get_if<A>(&action)) found.push_back(*a);
    }
    return found;
  }
  template <class A>
  bool did() const {
    return !all<A>().empty();
  }
  bool logged(const std::string& part) const {
    return std::any_of(actions.begin(), actions.end(), [&](const ControlAction& action) {
      if (const auto* log = std::get_if<control::Log>(&action)) return log->line.find(part) != std::string::npos;
      if (const auto* log = std::get_if<control::LogOnce>(&action)) return log->line.find(part) != std::string::npos;
      return false;
    });
  }
  // The placement the leader proposes in a round at `now`, if it does.
  std::optional<control::ProposePlacement> round(ControlTime now) {
    on(control::Round{}, now);
    const auto proposals = all<control::ProposePlacement>();
    if (proposals.empty()) return std::nullopt;
    EXPECT_EQ(proposals.size(), 1u);
    return proposals.front();
  }
  // The leader's proposal, made.
  void made(const control::ProposePlacement& proposal, const std::vector<NodeView>& stages, ControlTime now) {
    on(control::PlacementMade{proposal.members, placement(proposal.epoch, state.self.id, stages)}, now);
  }

  ControlState state;
  std::vector<ControlAction> actions;
};

const NodeView a = node("a", "h:1");
const NodeView b = node("b", "h:2");
const NodeView c = node("c", "h:3");

// a and b, placed by a at epoch 1 at t0 + kSettle, b last heard then.
Node placed_pair() {
  Node leader(a);
  leader.hears(b, t0);
  EXPECT_FALSE(leader.round(t0));
  leader.hears(b, t0 + kSettle);
  const auto proposal = leader.round(t0 + kSettle);
  EXPECT_TRUE(proposal);
  leader.made(*proposal, {a, b}, t0 + kSettle);
  return leader;
}

TEST(ControlRules, ANodeHeardJoinsAndIsPlacedOnceTheMembersSettle) {
  Node n(a);
  n.hears(b, t0);
  EXPECT_TRUE(n.did<control::ActNow>());
  ASSERT_EQ(n.all<control::KeepInfo>().size(), 1u);
  EXPECT_EQ(n.all<control::KeepInfo>()[0].source, -1);
  EXPECT_TRUE(n.logged("node b at h:2 is known"));
  EXPECT_EQ(members(n.state, t0), (Ids{"a", "b"}));
  EXPECT_EQ(leader_id(n.state, t0), "a");

  // Nodes joining may come in a group: the leader waits until the members have settled.
  EXPECT_FALSE(n.round(t0));
  n.hears(b, t0 + 900ms);
  EXPECT_FALSE(n.round(t0 + 900ms));
  const auto proposal = n.round(t0 + kSettle);
  ASSERT_TRUE(proposal);
  EXPECT_EQ(proposal->members, (Ids{"a", "b"}));
  EXPECT_EQ(proposal->epoch, 1u);
  EXPECT_FALSE(proposal->may_repair);

  n.made(*proposal, {a, b}, t0 + kSettle);
  EXPECT_TRUE(n.did<control::ActNow>());
  EXPECT_EQ(n.state.placement.epoch, 1u);
  EXPECT_FALSE(n.round(t0 + kSettle + 100ms));  // placed already

  // b's layers loaded: news the leader acts on at once; the same Hello again is none.
  NodeView ready = b;
  ready.ready_epoch = 1;
  n.hears(ready, t0 + 1500ms);
  EXPECT_TRUE(n.did<control::ActNow>());
  EXPECT_TRUE(peer_ready(n.state, "b", 1, t0 + 1500ms));
  n.hears(ready, t0 + 1600ms);
  EXPECT_FALSE(n.did<control::ActNow>());
}

// Nodes with group links: the leader places them once each two have measured the link between
// them (either one), or once kLinkWait has passed; a node without group links waits for none.
TEST(ControlRules, ALeaderWaitsForTheLinksOfNodesThatJoinToBeMeasured) {
  NodeView linked_a = a, linked_b = b, linked_c = c, plain_d = node("d", "h:4");
  for (NodeView* v : {&linked_a, &linked_b, &linked_c}) v->has_group_links = true;
  Node n(linked_a);
  for (const NodeView& peer : {linked_b, linked_c, plain_d}) n.hears(peer, t0);
  EXPECT_FALSE(n.round(t0));
  EXPECT_FALSE(n.round(t0 + kSettle));  // settled, no link measured
  n.on(control::LinksMeasured{{"b", "c"}}, t0 + kSettle);  // a's links; b-c still unmeasured
  EXPECT_FALSE(n.round(t0 + kSettle));
  linked_c.measured_links = {"b"};
  n.hears(linked_b, t0 + kSettle + 100ms);
  n.hears(linked_c, t0 + kSettle + 100ms);
  n.hears(plain_d, t0 + kSettle + 100ms);
  const auto proposal = n.round(t0 + kSettle + 100ms);
  ASSERT_TRUE(proposal);
  EXPECT_EQ(proposal->members, (Ids{"a", "b", "c", "d"}));

  // Never measured: placed once the wait is over.
  Node late(linked_a);
  late.hears(linked_b, t0);
  EXPECT_FALSE(late.round(t0));
  EXPECT_FALSE(late.round(t0 + kSettle));
  late.hears(linked_b, t0 + kLinkWait / 2);  // alive all along
  late.hears(linked_b, t0 + kLinkWait - 100ms);
  EXPECT_FALSE(late.round(t0 + kLinkWait - 100ms));
  late.hears(linked_b, t0 + kLinkWait);
  EXPECT_TRUE(late.round(t0 + kLinkWait));
}

TEST(ControlRules, ALeaderWaitsForItsSeedsToAnswerOrForTheSeedWait) {
  Node waits(a, {"h:2"});
  EXPECT_FALSE(waits.round(t0));
  EXPECT_FALSE(waits.round(t0 + 2s));  // alone, settled, but its seed has not answered
  waits.answered_by(b, t0 + 2s);
  EXPECT_TRUE(waits.state.seeds.at("h:2"));
  EXPECT_EQ(waits.state.peers.at("b").rtt_ms, 1.5);
  EXPECT_FALSE(waits.round(t0 + 2s));  // b has just joined
  ASSERT_TRUE(waits.round(t0 + 3s));

  Node alone(a, {"h:9"});
  EXPECT_FALSE(alone.round(t0));
  EXPECT_FALSE(alone.round(t0 + kSeedWait - 1ms));
  const auto proposal = alone.round(t0 + kSeedWait);
  ASSERT_TRUE(proposal);
  EXPECT_EQ(proposal->members, (Ids{"a"}));
}

TEST(ControlRules, APeerSilentForThePeerTimeoutIsLostAndTheLeaderRepairsAtOnce) {
  Node n = placed_pair();
  const ControlTime heard = t0 + kSettle;
  EXPECT_FALSE(n.round(heard + kPeerTimeout - 1ms));
  EXPECT_FALSE(n.logged("left"));
  const auto proposal = n.round(heard + kPeerTimeout);
  EXPECT_TRUE(n.logged("node b has not answered for 3 s: left"));
  ASSERT_TRUE(proposal);  // no settling: nodes that left are gone
  EXPECT_EQ(proposal->members, (Ids{"a"}));
  EXPECT_EQ(proposal->epoch, 2u);
  EXPECT_TRUE(proposal->may_repair);
  n.made(*proposal, {a}, heard + kPeerTimeout);
  EXPECT_FALSE(n.round(heard + kPeerTimeout + 500ms));
  EXPECT_FALSE(n.logged("left"));  // said once
}

TEST(ControlRules, TwoRefusedHellosOrAFailedStageAndOneLoseAPeerBeforeItsTimeout) {
  Node n = placed_pair();
  const ControlTime now = t0 + kSettle + 100ms;
  n.on(control::HelloRefused{"h:2"}, now);
  EXPECT_FALSE(n.did<control::ActNow>());
  EXPECT_TRUE(alive(n.state.peers.at("b"), now));
  n.on(control::HelloRefused{"h:2"}, now);
  EXPECT_TRUE(n.did<control::ActNow>());
  EXPECT_FALSE(alive(n.state.peers.at("b"), now));
  EXPECT_EQ(members(n.state, now), (Ids{"a"}));

  Node m = placed_pair();
  m.on(control::StageFailed{"b", true}, now);
  EXPECT_TRUE(m.did<control::ActNow>());
  EXPECT_TRUE(alive(m.state.peers.at("b"), now));
  m.on(control::HelloRefused{"h:2"}, now);
  EXPECT_FALSE(alive(m.state.peers.at("b"), now));

  // A stage that answered with an error is no sign of its node's loss.
  Node k = placed_pair();
  k.on(control::StageFailed{"b", false}, now);
  k.on(control::HelloRefused{"h:2"}, now);
  EXPECT_TRUE(alive(k.state.peers.at("b"), now));
}

TEST(ControlRules, ADrainingNodeLeavesItselfOutAndItsPeerPlacesWithoutIt) {
  Node leaving = placed_pair();
  const ControlTime now = t0 + kSettle + 100ms;
  EXPECT_TRUE(someone_takes_over(leaving.state, now));
  leaving.on(control::DrainAsked{}, now);
  EXPECT_TRUE(leaving.did<control::ActNow>());
  EXPECT_EQ(members(leaving.state, now), (Ids{"b"}));
  EXPECT_EQ(leader_id(leaving.state, now), "b");
  EXPECT_FALSE(leaving.round(now));  // it leads no more

  Node peer(b);
  peer.hears(a, t0, placement(1, "a", {a, b}));
  NodeView says_leaving = a;
  says_leaving.leaving = true;
  peer.hears(says_leaving, now);
  EXPECT_EQ(members(peer.state, now), (Ids{"b"}));
  EXPECT_FALSE(someone_takes_over(peer.state, now));  // nobody would take b's layers
  const auto proposal = peer.round(now);
  ASSERT_TRUE(proposal);
  EXPECT_EQ(proposal->members, (Ids{"b"}));
  EXPECT_EQ(proposal->epoch, 2u);
  EXPECT_TRUE(proposal->may_repair);
}

TEST(ControlRules, WhenTheLeaderIsLostTheNextLowestIdPlacesANewerEpoch) {
  Node n(b);
  n.hears(a, t0, placement(3, "a", {a, b, c}));
  EXPECT_TRUE(n.did<control::AdoptPlacement>());
  n.hears(c, t0);
  NodeView serving = a;
  serving.state = "serving";
  serving.ready_epoch = 3;
  n.hears(serving, t0 + 1s);
  EXPECT_EQ(leader_id(n.state, t0 + 1s), "a");
  ASSERT_NE(serving_leader(n.state, t0 + 1s), nullptr);
  EXPECT_FALSE(n.round(t0 + 1s));

  n.hears(c, t0 + 1s + kPeerTimeout);
  const ControlTime lost = t0 + 1s + kPeerTimeout;
  EXPECT_EQ(serving_leader(n.state, lost), nullptr);
  EXPECT_EQ(leader_id(n.state, lost), "b");
  const auto proposal = n.round(lost);
  ASSERT_TRUE(proposal);
  EXPECT_EQ(proposal->members, (Ids{"b", "c"}));
  EXPECT_EQ(proposal->epoch, 4u);
  EXPECT_TRUE(proposal->may_repair);
}

TEST(ControlRules, ANodeRestartedUnderItsIdOnItsAddressIsPlacedAnew) {
  Node n = placed_pair();
  const ControlTime now = t0 + kSettle + 200ms;
  NodeView restarted = node("b", "h:2", 5000);
  n.hears(restarted, now);
  EXPECT_FALSE(n.did<control::RefuseCaller>());
  EXPECT_TRUE(n.did<control::ActNow>());
  EXPECT_TRUE(n.state.peers.at("b").restarted);
  // The same members, but its stage is gone with its old process.
  const auto proposal = n.round(now);
  ASSERT_TRUE(proposal);
  EXPECT_EQ(proposal->members, (Ids{"a", "b"}));
  EXPECT_EQ(proposal->epoch, 2u);
  n.made(*proposal, {a, restarted}, now);
  EXPECT_FALSE(n.state.peers.at("b").restarted);
  EXPECT_FALSE(n.round(now + 100ms));
}

TEST(ControlRules, OfTwoProcessesUnderOneIdTheFirstStartedKeepsIt) {
  Node n = placed_pair();
  const ControlTime now = t0 + kSettle + 200ms;
  const NodeView impostor = node("b", "h:7", 9000);
  n.hears(impostor, now);
  ASSERT_EQ(n.all<control::RefuseCaller>().size(), 1u);
  EXPECT_NE(n.all<control::RefuseCaller>()[0].why.find("node id 'b' is taken by the node at h:2"), std::string::npos);
  EXPECT_FALSE(n.did<control::KeepInfo>());
  EXPECT_EQ(n.state.peers.at("b").info.address, "h:2");
  // Found by this node's own Hello: left out, the caller not answered with a refusal.
  n.answered_by(impostor, now);
  EXPECT_FALSE(n.did<control::RefuseCaller>());
  EXPECT_TRUE(n.logged("node b at h:7 is left out"));
  EXPECT_FALSE(n.round(now));

  // Once the first is seen gone, the other takes the id over.
  const ControlTime gone = t0 + kSettle + kPeerTimeout;
  n.hears(impostor, gone);
  EXPECT_FALSE(n.did<control::RefuseCaller>());
  EXPECT_EQ(n.state.peers.at("b").info.address, "h:7");
}

TEST(ControlRules, ANodeWhoseIdAnEarlierProcessHoldsStandsAsideWhileItIsSaid) {
  Node n = placed_pair();
  const ControlTime now = t0 + kSettle + 200ms;
  const NodeView earlier = node("a", "h:8", 500);
  n.hears(earlier, now);
  EXPECT_FALSE(n.did<control::RefuseCaller>());
  EXPECT_TRUE(n.logged("this node takes no part in the cluster: node id 'a' is taken by the node at h:8"));
  EXPECT_NE(refusal(n.state, now), "");
  n.on(control::Round{}, now);
  ASSERT_EQ(n.all<control::StandAside>().size(), 1u);
  EXPECT_EQ(n.state.placement.epoch, 0u);
  EXPECT_TRUE(n.state.placement.stages.empty());
  // A node refused takes nothing in.
  n.hears(c, now, placement(9, "c", {c}));
  EXPECT_FALSE(n.did<control::KeepInfo>());
  EXPECT_FALSE(n.did<control::AdoptPlacement>());

  // Refused again by another node's word, said once.
  n.on(control::IdTaken{"h:8", "node id 'a' is taken"}, now + 1s);
  EXPECT_FALSE(n.logged("takes no part"));
  EXPECT_EQ(refusal(n.state, now + 1s + kPeerTimeout - 1ms), "this node takes no part: node id 'a' is taken");
  EXPECT_EQ(refusal(n.state, now + 1s + kPeerTimeout), "");

  // A later process under this node's id is the one refused.
  Node first(a);
  first.hears(node("a", "h:8", 9000), t0);
  EXPECT_TRUE(first.did<control::RefuseCaller>());
  EXPECT_EQ(refusal(first.state, t0), "");
}

TEST(ControlRules, APartitionThatHealsAgreesOnTheLowestLeaderAndANewerEpoch) {
  // Cut apart, a placed the model alone at epoch 2, b at epoch 5.
  Node left(a);
  left.made({{"a"}, 2, false}, {a}, t0);
  Node right(b);
  right.made({{"b"}, 5, false}, {b}, t0);
  NodeView b_ready = b;
  b_ready.ready_epoch = 5;
  b_ready.state = "serving";

  left.hears(b_ready, t0 + 10s, right.state.placement);
  EXPECT_TRUE(left.did<control::AdoptPlacement>());
  EXPECT_EQ(left.state.placement.epoch, 5u);
  EXPECT_EQ(leader_id(left.state, t0 + 10s), "a");
  left.hears(b_ready, t0 + 10s + kSettle);
  const auto proposal = left.round(t0 + 10s + kSettle);
  ASSERT_TRUE(proposal);
  EXPECT_EQ(proposal->members, (Ids{"a", "b"}));
  EXPECT_EQ(proposal->epoch, 6u);
  left.made(*proposal, {a, b}, t0 + 10s + kSettle);

  right.hears(a, t0 + 10s + kSettle, left.state.placement);
  EXPECT_TRUE(right.did<control::AdoptPlacement>());
  EXPECT_EQ(right.state.placement.leader_id, "a");
  EXPECT_EQ(leader_id(right.state, t0 + 10s + kSettle), "a");
  EXPECT_FALSE(right.round(t0 + 10s + kSettle));
}

TEST(ControlRules, AtTheSameEpochThePlacementOfTheLowerLeaderWins) {
  Node n(c);
  n.hears(b, t0, placement(4, "b", {b}));
  EXPECT_TRUE(n.did<control::AdoptPlacement>());
  n.hears(a, t0, placement(4, "a", {a}));
  EXPECT_TRUE(n.did<control::AdoptPlacement>());
  EXPECT_EQ(n.state.placement.leader_id, "a");
  n.hears(b, t0, placement(4, "b", {b}));
  EXPECT_FALSE(n.did<control::AdoptPlacement>());
  EXPECT_EQ(n.state.placement.leader_id, "a");
}

TEST(ControlRules, AnOlderPlacementArrivingLateChangesNothing) {
  Node n(c);
  n.hears(a, t0, placement(5, "a", {a, c}));
  EXPECT_TRUE(n.did<control::AdoptPlacement>());
  n.hears(b, t0 + 100ms, placement(4, "a", {a, b, c}));
  EXPECT_FALSE(n.did<control::AdoptPlacement>());
  EXPECT_EQ(n.state.placement.epoch, 5u);
  EXPECT_EQ(n.state.placement.stages.size(), 2u);
}

TEST(ControlRules, APeerOfAnotherModelOrProtocolTakesNoPart) {
  Node n(b);
  NodeView other = node("a", "h:1");
  other.model_hash = "0123456789abcdef";
  other.model_name = "other";
  n.hears(other, t0, placement(7, "a", {other}), {c});
  EXPECT_TRUE(n.logged("node a is left out: it runs another model (other, hash 0123456789ab)"));
  EXPECT_FALSE(n.did<control::AdoptPlacement>());
  EXPECT_FALSE(n.state.peers.contains("c"));  // its cluster's nodes are not this one's
  EXPECT_TRUE(alive(n.state.peers.at("a"), t0));
  EXPECT_EQ(members(n.state, t0), (Ids{"b"}));
  EXPECT_EQ(leader_id(n.state, t0), "b");
  EXPECT_FALSE(someone_takes_over(n.state, t0));
  EXPECT_FALSE(n.round(t0));
  // Its ready epoch does not raise this cluster's.
  other.ready_epoch = 40;
  n.hears(other, t0 + kSettle);
  const auto proposal = n.round(t0 + kSettle);
  ASSERT_TRUE(proposal);
  EXPECT_EQ(proposal->epoch, 1u);

  NodeView newer = node("d", "h:4");
  newer.protocol_version = kProtocol + 1;
  n.hears(newer, t0 + kSettle);
  EXPECT_TRUE(n.logged("node d is left out: it speaks protocol 5, this node 4"));
  EXPECT_EQ(members(n.state, t0 + kSettle), (Ids{"b"}));
}

TEST(ControlRules, AFixedPlacementThatWaitsIsTriedEachRoundAndItsMembersCountAsPlaced) {
  Node n(a);
  n.hears(b, t0);
  n.hears(c, t0);
  EXPECT_FALSE(n.round(t0));
  n.hears(b, t0 + kSettle);
  n.hears(c, t0 + kSettle);
  const auto proposal = n.round(t0 + kSettle);
  ASSERT_TRUE(proposal);
  n.on(control::PlacementWaits{proposal->members}, t0 + kSettle);
  EXPECT_FALSE(n.did<control::ActNow>());
  const auto again = n.round(t0 + kSettle + 500ms);
  ASSERT_TRUE(again);  // the nodes it names may have come meanwhile
  EXPECT_EQ(again->epoch, proposal->epoch);
  // c leaves: only a loss, placed again at once.
  n.hears(b, t0 + 2s);
  n.on(control::HelloRefused{"h:3"}, t0 + 2s);
  n.on(control::HelloRefused{"h:3"}, t0 + 2s);
  const auto after_loss = n.round(t0 + 2s);
  ASSERT_TRUE(after_loss);
  EXPECT_EQ(after_loss->members, (Ids{"a", "b"}));
  EXPECT_FALSE(after_loss->may_repair);  // there is no placement to repair
}

TEST(ControlRules, TheLeaderServesWhenItSchedulesThisPlacementOrAnOlderOne) {
  Node n(b);
  n.hears(a, t0, placement(3, "a", {a, b}));
  EXPECT_EQ(serving_leader(n.state, t0), nullptr);  // not serving yet
  NodeView serving = a;
  serving.state = "serving";
  serving.ready_epoch = 3;
  n.hears(serving, t0);
  ASSERT_NE(serving_leader(n.state, t0), nullptr);
  EXPECT_EQ(serving_leader(n.state, t0)->info.address, "h:1");
  // Ready for a placement this node has not heard of yet: not the one it serves.
  serving.ready_epoch = 4;
  n.hears(serving, t0);
  EXPECT_EQ(serving_leader(n.state, t0), nullptr);
  // This node leads its own placement: no other leader serves it.
  Node leader = placed_pair();
  EXPECT_EQ(serving_leader(leader.state, t0 + kSettle), nullptr);
}

TEST(ControlRules, TheNodesAPeerKnowsAreKnownButNotSeen) {
  Node n(a);
  n.hears(b, t0, {}, {c, b, a});
  // b itself is kept from its own word, c from b's; a is this node.
  const auto kept = n.all<control::KeepInfo>();
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].source, -1);
  EXPECT_EQ(kept[1].source, 0);
  ASSERT_TRUE(n.state.peers.contains("c"));
  EXPECT_FALSE(n.state.peers.at("c").seen);
  EXPECT_EQ(members(n.state, t0), (Ids{"a", "b"}));
  EXPECT_FALSE(all_alive(n.state, {"a", "b", "c"}, t0));
  EXPECT_TRUE(all_alive(n.state, {"a", "b"}, t0));
}

}  // namespace
}  // namespace strata::cluster
