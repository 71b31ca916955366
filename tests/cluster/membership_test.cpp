// What a node keeps of what its peers say, on Hellos of the test's own, without threads or
// sockets: a Hello's sender and the nodes it knows, kept whole and told on; a placement to
// adopt; each way a Hello can fail, decided on or said once; and the live peers' weights.
#include "cluster/membership.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "rpc/messages.h"
#include "node_info_fixture.h"

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;

const std::string& kModel = kFixtureModel;
const std::string kOtherModel(64, 'b');
const ControlTime t0 = ControlTime{} + 1h;

cluster_types::Placement placement(uint64_t epoch, const std::string& leader,
                                   const std::vector<cluster_types::NodeInfo>& nodes) {
  cluster_types::Placement p{.epoch = epoch, .leader_id = leader, .strategy = "speed"};
  int first = 0;
  for (const cluster_types::NodeInfo& n : nodes) {
    p.stages.push_back({n.node_id, n.node_address, first, first + 2});
    first += 2;
  }
  return p;
}

template <class A>
bool has(const std::vector<ControlAction>& actions) {
  return std::any_of(actions.begin(), actions.end(), [](const ControlAction& a) { return std::holds_alternative<A>(a); });
}

std::string logged_once(const std::vector<ControlAction>& actions) {
  for (const ControlAction& a : actions) {
    if (const auto* once = std::get_if<control::LogOnce>(&a)) return once->line;
  }
  return {};
}

class MembershipTest : public ::testing::Test {
 protected:
  MembershipTest()
      : membership_(initial_control_state(view_of(node("a", "127.0.0.1:7001")), {}, t0),
                    [this](const std::string& line) { lines_.push_back(line); }) {
    membership_.listening_at("127.0.0.1:7001", false, t0);
  }

  // The reply of the node at `address`.
  rpc::HelloOutcome reply(const cluster_types::NodeInfo& from, const cluster_types::Placement& p = {}) {
    rpc::HelloOutcome outcome;
    outcome.reply = {from, {}, p};
    outcome.rtt_ms = 2.5;
    return outcome;
  }

  std::vector<std::string> lines_;
  Membership membership_;
};

TEST_F(MembershipTest, AHelloKeepsItsSenderWholeAtTheHostItsCallCameFrom) {
  cluster_types::Hello hello{node("b", ":7002")};  // b listens on every interface
  hello.sender.memory_bytes = 12345;
  const std::vector<ControlAction> actions = membership_.hello_received(hello, "ipv4:10.0.0.2:40000", t0);
  EXPECT_FALSE(has<control::KeepInfo>(actions)) << "the membership keeps what it is told itself";
  ASSERT_NE(membership_.find("b"), nullptr);
  EXPECT_EQ(membership_.info("b").node_address, "10.0.0.2:7002");
  EXPECT_EQ(membership_.info("b").memory_bytes, 12345u) << "every field, not only the rules' view";
  EXPECT_EQ(membership_.control().peers.at("b").info.address, "10.0.0.2:7002");
  EXPECT_EQ(membership_.find("c"), nullptr);
}

TEST_F(MembershipTest, AReplyIsTakenInAndItsNewerPlacementAdopted) {
  const cluster_types::NodeInfo b = node("b", ":7002");
  const std::vector<ControlAction> actions =
      membership_.hello_answered("127.0.0.1:7002", reply(b, placement(4, "b", {b, node("a", "127.0.0.1:7001")})), t0);
  EXPECT_TRUE(has<control::AdoptPlacement>(actions));
  EXPECT_EQ(membership_.info("b").node_address, "127.0.0.1:7002") << "the host it was reached at";
  EXPECT_TRUE(membership_.control().peers.at("b").seen);
  EXPECT_DOUBLE_EQ(membership_.control().peers.at("b").rtt_ms, 2.5);
}

TEST_F(MembershipTest, EachWayAHelloFailsIsDecidedOnOrSaidOnce) {
  membership_.hello_answered("127.0.0.1:7002", reply(node("b", "127.0.0.1:7002")), t0);
  rpc::HelloOutcome refused_connection;
  refused_connection.failure = rpc::HelloFailure::Unreachable;
  membership_.hello_answered("127.0.0.1:7002", refused_connection, t0 + 1s);
  EXPECT_TRUE(alive(membership_.control().peers.at("b"), t0 + 1s)) << "one refusal is not enough";
  membership_.hello_answered("127.0.0.1:7002", refused_connection, t0 + 1s);
  EXPECT_FALSE(alive(membership_.control().peers.at("b"), t0 + 1s)) << "two in a row are";

  rpc::HelloOutcome handshake;
  handshake.failure = rpc::HelloFailure::HandshakeRefused;
  handshake.message = "bad certificate";
  EXPECT_NE(logged_once(membership_.hello_answered("127.0.0.1:7009", handshake, t0)).find("TLS handshake"),
            std::string::npos);

  rpc::HelloOutcome refused;
  refused.failure = rpc::HelloFailure::Refused;
  refused.message = "protocol version 2 is not this node's";
  EXPECT_EQ(logged_once(membership_.hello_answered("127.0.0.1:7008", refused, t0)),
            "node at 127.0.0.1:7008 refused this node: protocol version 2 is not this node's");

  rpc::HelloOutcome other;
  other.failure = rpc::HelloFailure::Other;
  EXPECT_TRUE(membership_.hello_answered("127.0.0.1:7008", other, t0).empty());

  rpc::HelloOutcome malformed_reply;  // say_hello checks a reply before anything of it is taken in
  malformed_reply.failure = rpc::HelloFailure::Malformed;
  malformed_reply.message = "node.model_hash: is not a SHA-256 in hex";
  const std::vector<ControlAction> malformed = membership_.hello_answered("127.0.0.1:7003", malformed_reply, t0);
  EXPECT_NE(logged_once(malformed).find("refused the Hello reply of the node at 127.0.0.1:7003"), std::string::npos);
  EXPECT_EQ(membership_.find("c"), nullptr) << "nothing of a malformed reply is taken in";

  membership_.log_once("key", "said once");
  membership_.log_once("key", "said once");
  EXPECT_EQ(std::count(lines_.begin(), lines_.end(), "said once"), 1);
}

TEST_F(MembershipTest, ItTellsLivePeersAndTheirWeights) {
  cluster_types::NodeInfo b = node("b", "127.0.0.1:7002");
  b.weights = cluster_types::Weights{.whole_file = true};
  membership_.hello_answered("127.0.0.1:7002", reply(b), t0);
  membership_.hello_answered("127.0.0.1:7003", reply(node("c", "127.0.0.1:7003", kOtherModel)), t0);

  EXPECT_EQ(membership_.alive_infos(t0 + 1s).size(), 2u);
  EXPECT_EQ(membership_.all_infos().size(), 2u);
  const std::vector<WeightsHolder> holders = membership_.weights_holders(t0 + 1s);
  ASSERT_EQ(holders.size(), 1u) << "only peers of this model hold its weights";
  EXPECT_EQ(holders[0].address, "127.0.0.1:7002");
  EXPECT_TRUE(holders[0].weights.whole_file);
  EXPECT_NE(membership_.left_out_text(t0 + 1s).find("c at 127.0.0.1:7003 is left out"), std::string::npos);

  const std::vector<cluster_types::NodeStatus> statuses = membership_.peer_statuses(t0 + 1s);
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].info.node_id, "b");
  ASSERT_TRUE(statuses[0].link && statuses[0].link->last_seen_seconds);
  EXPECT_DOUBLE_EQ(*statuses[0].link->last_seen_seconds, 1.0);
  EXPECT_FALSE(statuses[1].link->problem.empty());

  EXPECT_TRUE(membership_.alive_infos(t0 + kPeerTimeout + 1s).empty()) << "peers not heard from are not told on";
  EXPECT_EQ(membership_.all_infos().size(), 2u) << "a reply tells every node known";
}

}  // namespace
}  // namespace strata::cluster
