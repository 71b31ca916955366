// Counts every message of every call between nodes, at both ends, in the process's metrics:
// bytes (protobuf-encoded, as on the wire before HTTP/2 framing and TLS) and messages each way,
// by the peer node and the method (see docs/API.md#get-metrics). Counting in gRPC interceptors,
// which every node channel and the node server carry, keeps it in one place for gossip, the
// pipeline's batches, state hand-overs, relayed requests and weight transfers alike.
//
// Both ends label by node id: a caller names itself in its call's signature (x-strata-sender,
// rpc/auth.h), a server in its initial metadata. What a call carries is counted once the other
// end is known; a call whose other end never named itself (a peer that could not be reached, an
// unsigned call) counts nothing.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

namespace strata::rpc {

// For a channel to a node: counts the calls made on it.
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> count_calls_made();

// For the node server of node `node_id`: counts the calls it serves, and names it to its callers.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> count_calls_served(
    std::string node_id);

}  // namespace strata::rpc
