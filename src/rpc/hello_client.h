// The calling side of Hello, gossip's one call: what a peer answered, or why it did not, in
// the cluster's terms rather than gRPC's status codes.
#pragma once

#include <chrono>
#include <string>

#include "cluster_types/hello.h"
#include "rpc/peer_channel.h"

namespace strata::rpc {

enum class HelloFailure {
  None,
  Unreachable,       // nothing answers at the address (yet)
  HandshakeRefused,  // the TLS handshake failed: the other end has another cluster key, or is no Strata node
  IdTaken,           // the peer refused this node's id: another node has it
  Refused,           // the peer refused this node: the cluster key's check, or another protocol version
  Malformed,         // the reply broke the protocol's rules (rpc/messages.h): the message names how
  Other,             // no answer for another reason (its deadline passed)
};

struct HelloOutcome {
  HelloFailure failure = HelloFailure::None;
  std::string message;         // on a failure, the peer's or the transport's words
  cluster_types::Hello reply;  // without a failure: the peer's own Hello
  double rtt_ms = 0.0;
};

// Says Hello as node `self_id` under `key` to the node behind `channel`, waiting up to `deadline`.
HelloOutcome say_hello(const PeerChannel& channel, const cluster_types::Hello& hello, const std::string& self_id,
                       const ClusterKey& key, std::chrono::milliseconds deadline);

}  // namespace strata::rpc
