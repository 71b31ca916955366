// The rules a node of a cluster decides by: which peers it knows and which of them live, which
// process may go by a node id, who leads, which placement holds, and when the leader places the
// model anew. A pure state machine: the node (node.cpp) feeds it what it hears, with the time,
// and carries out the actions it returns. No threads, no I/O, no protobuf, so that every rule
// is tested on a clock of the test's own (tests/cluster/control_rules_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace strata::cluster {

using ControlClock = std::chrono::steady_clock;
using ControlTime = ControlClock::time_point;

// A peer not heard from for this long has left; keepalive and deadlines see it sooner on the
// links that carry requests.
inline constexpr auto kPeerTimeout = std::chrono::milliseconds(3000);
// Members must stay the same this long before the leader places the model over them, so that
// nodes starting together are placed once.
inline constexpr auto kSettle = std::chrono::milliseconds(1000);
// How long a leader waits for peers named with --peers that have never answered.
inline constexpr auto kSeedWait = std::chrono::milliseconds(5000);
// How long, at most, a leader waits for nodes that joined to measure their links to the others
// (a placement weighs tensor-parallel groups by them).
inline constexpr auto kLinkWait = std::chrono::milliseconds(5000);

// What a node says about itself, as far as the rules go.
struct NodeView {
  std::string id;
  std::string address;   // host:node-port
  std::string instance;  // one per process: a node restarted under its id says another
  int64_t started_unix_ms = 0;
  uint64_t ready_epoch = 0;  // the placement whose layers it holds
  std::string state;         // "serving" (it schedules), "refused" (its id is another's), ...
  bool leaving = false;
  uint32_t protocol_version = 0;
  std::string model_hash;
  std::string model_name;
  // Its tensor-parallel group links: whether it has them, and the peers whose links it has
  // measured (NodeInfo.links).
  bool has_group_links = false;
  std::vector<std::string> measured_links;
};

struct PeerState {
  NodeView info;
  bool seen = false;  // reached directly, not only heard of
  ControlTime last_seen{};
  double rtt_ms = 0.0;
  std::string problem;  // why it cannot take part (another model or protocol)
  bool gone_logged = false;
  int refused_hellos = 0;  // in a row
  bool restarted = false;  // another process of it answers than when the placement was made
};

struct PlacedStage {
  std::string node_id;
  std::string node_address;  // as the leader named it
};

// A placement, as far as the rules go.
struct PlacementView {
  uint64_t epoch = 0;
  std::string leader_id;
  std::vector<PlacedStage> stages;  // pipeline order
  bool failed = false;              // it says why the model does not fit instead
};

struct ControlState {
  NodeView self;
  ControlTime started{};
  bool leaving = false;  // draining: the next placement leaves this node out
  std::map<std::string, PeerState> peers;
  std::map<std::string, bool> seeds;  // address (--peers) -> answered once
  struct Refusal {
    std::string why;
    ControlTime at;
  };
  std::map<std::string, Refusal> refused_by;  // address -> why it refuses this node's id, when it said so last
  PlacementView placement;
  // The leader's: the members as last seen and since when, and those its last placement was made over.
  std::vector<std::string> last_members;
  ControlTime members_changed_at{};
  std::vector<std::string> placed_members;
};

ControlState initial_control_state(NodeView self, const std::vector<std::string>& seeds, ControlTime now);

namespace control {

// A Hello this node received (`address` empty), or the answer to the one it sent to `address`.
struct HelloHeard {
  NodeView sender;
  std::vector<NodeView> known;  // the nodes the sender sees alive
  PlacementView placement;      // the sender's
  std::string address;
  double rtt_ms = 0.0;  // of this node's Hello
  int64_t unix_ms = 0;  // the wall clock, for the age of a node id's holder
};
// The connection to `address` was refused: its process is gone, or not there yet.
struct HelloRefused {
  std::string address;
};
// The node at `address` says that another process, which came first, holds this node's id.
struct IdTaken {
  std::string address;
  std::string why;
};
// A call to a stage of `peer_id` failed, its node `unreachable` or not.
struct StageFailed {
  std::string peer_id;
  bool unreachable = false;
};
struct DrainAsked {};
// This node has measured its links to these peers' group links.
struct LinksMeasured {
  std::vector<std::string> peers;
};
// The gossip round decides: peers gone, standing aside, a new placement.
struct Round {};
// The leader made `placement` (perhaps one saying that the model does not fit) over `members`.
struct PlacementMade {
  std::vector<std::string> members;
  PlacementView placement;
};
// A placement fixed by hand waits for nodes it names; `members` are seen.
struct PlacementWaits {
  std::vector<std::string> members;
};

struct Log {
  std::string line;
};
struct LogOnce {  // said once per key
  std::string key;
  std::string line;
};
struct ActNow {};  // run the gossip round now: news that peers or the stage host act on
struct RefuseCaller {  // answer the Hello received with this, taking nothing of it in
  std::string why;
};
// What this node keeps of the peer that a Hello's `sender` (source -1) or `known[source]` says.
struct KeepInfo {
  int source = -1;
};
struct AdoptPlacement {};  // the placement of the Hello replaces this node's
struct StandAside {        // another process holds this node's id: hold and schedule nothing
  std::string why;
};
// Leader: place the model over `members` as placement `epoch`; after a loss only (`may_repair`),
// the nodes left may keep their layers (repair_placement).
struct ProposePlacement {
  std::vector<std::string> members;
  uint64_t epoch = 0;
  bool may_repair = false;
};

}  // namespace control

using ControlEvent = std::variant<control::HelloHeard, control::HelloRefused, control::IdTaken, control::StageFailed,
                                  control::DrainAsked, control::LinksMeasured, control::Round, control::PlacementMade,
                                  control::PlacementWaits>;
using ControlAction = std::variant<control::Log, control::LogOnce, control::ActNow, control::RefuseCaller,
                                   control::KeepInfo, control::AdoptPlacement, control::StandAside,
                                   control::ProposePlacement>;

struct ControlStep {
  ControlState state;
  std::vector<ControlAction> actions;  // in the order the driver carries them out
};

ControlStep step(ControlState state, const ControlEvent& event, ControlTime now);

// What the rules conclude from a state, for the driver.
bool alive(const PeerState& peer, ControlTime now);
inline bool compatible(const PeerState& peer) { return peer.problem.empty(); }
// The nodes placements are made over, in id order: alive, of this model, not leaving, not refused.
std::vector<std::string> members(const ControlState& state, ControlTime now);
// The lowest member leads.
std::string leader_id(const ControlState& state, ControlTime now);
// Why this node takes no part now ("this node takes no part: node id 'b' is taken by ..."), or empty.
std::string refusal(const ControlState& state, ControlTime now);
// The leader of the placement, when it is another node, alive and serving that placement.
const PeerState* serving_leader(const ControlState& state, ControlTime now);
bool peer_ready(const ControlState& state, const std::string& id, uint64_t epoch, ControlTime now);
// Every one of `ids`, this node or a peer, runs.
bool all_alive(const ControlState& state, const std::vector<std::string>& ids, ControlTime now);
// Some other node of this model runs, not leaving, to take this node's layers over.
bool someone_takes_over(const ControlState& state, ControlTime now);

}  // namespace strata::cluster
