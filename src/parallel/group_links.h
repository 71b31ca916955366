// The links between the members of tensor-parallel groups on different nodes: TCP connections
// carrying TLS 1.3, each end presenting a certificate the cluster's authority signed and
// accepting only such a one (the trust rule of the nodes' gRPC links, rpc/tls.h), so that a
// process without the cluster secret is refused during the handshake.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/socket_exchange.h"

namespace strata::parallel {

// PEM, as rpc::LinkSecurity holds them.
struct LinkCredentials {
  std::string authority_pem;
  std::string certificate_pem;
  std::string private_key_pem;
};

struct GroupLinkLimits {
  // For an arriving connection's handshake and its saying which group and member it is.
  std::chrono::milliseconds introduction{10'000};
  // How long an introduced connection waits for the join it is for before it is dropped.
  std::chrono::milliseconds unclaimed{30'000};
  // The exchanges' limit on a silent peer (SocketExchange).
  std::chrono::milliseconds silence = kDefaultSilenceLimit;
  // How long the exchanges wait for a peer busily before they sleep (SocketExchange).
  std::chrono::microseconds busy_wait = kDefaultBusyWait;
  // Benchmarks only: the exchanges send each frame this much later (SocketExchange).
  std::chrono::microseconds test_send_delay{0};
};

// What the link to another node's GroupLinks costs, as measure() found it.
struct LinkMeasurement {
  double latency_seconds = 0.0;   // one way: half the median round trip of a small message
  double bytes_per_second = 0.0;  // of the fastest of a few bulk transfers, a round trip taken out
};

// One per node process: listens for the other members of the groups this node joins, and
// connects to them.
class GroupLinks {
 public:
  // Listens on host:port (port 0: any free one); throws std::runtime_error naming the reason
  // when it cannot, or when OpenSSL cannot read the credentials.
  GroupLinks(const std::string& host, int port, LinkCredentials credentials, GroupLinkLimits limits = {});
  ~GroupLinks();  // drops connections no join claimed; joins must have returned
  GroupLinks(const GroupLinks&) = delete;
  GroupLinks& operator=(const GroupLinks&) = delete;

  int port() const;

  // This node as member `member` of the group `group` (a name every member is given alike, e.g.
  // "placement 7, layers 0-11"), of addresses.size() members: addresses[j] is "host:port" of
  // member j's GroupLinks (this member's own is not used). Connects to every member before it,
  // retrying until `timeout`, and takes the connections of every member after it (which may
  // have arrived before this call); returns once all are connected. Throws std::runtime_error
  // naming a member not connected within `timeout`. A dialer's connection counts once the other
  // member's join took it, so joins meet: a node joining several groups at once joins each on a
  // thread of its own. A member whose join failed closes the connections it had, so the others'
  // first gather fails naming it. std::invalid_argument for a member outside the group, an
  // address that is not host:port, or a name of no bytes or more than 4096.
  std::unique_ptr<SocketExchange> join(const std::string& group, int member, const std::vector<std::string>& addresses,
                                       std::chrono::milliseconds timeout);

  // Times small round trips and then a few bulk transfers to the GroupLinks at `address`, which
  // answers them itself, over a TLS connection of the kind groups use: what the placement
  // weighs a group's gathers by. Throws std::runtime_error saying why it could not (no answer,
  // refused, past `timeout`), std::invalid_argument for an address that is not host:port.
  LinkMeasurement measure(const std::string& address, std::chrono::milliseconds timeout);

 private:
  struct State;  // the TLS context, the listening socket, the connections waiting for their joins
  std::unique_ptr<State> state_;
};

}  // namespace strata::parallel
