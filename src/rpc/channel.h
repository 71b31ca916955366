// gRPC settings shared by both ends of a node link: TLS under the cluster key, keepalive pings
// that find a peer that stopped answering within a few seconds, messages that may carry a
// prompt chunk's activations, and the counting of what links carry (rpc/link_metrics.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "rpc/auth.h"

namespace strata::rpc {

std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const ClusterKey& key);
// A channel with a connection of its own, for bulk transfers (weights) that must not queue
// the pipeline's activations behind them.
std::shared_ptr<grpc::Channel> make_bulk_channel(const std::string& address, const ClusterKey& key);
// For the node server of node `node_id`.
void configure_server(grpc::ServerBuilder& builder, const std::string& node_id);

// Whether gRPC's words (a status message, a log line) say a TLS handshake failed: the other end
// has another cluster key, or is no Strata node.
bool is_handshake_failure(std::string_view message);

// Sends gRPC's own log lines (errors, unless GRPC_VERBOSITY asks for more) to `log`, each once, as
// "gRPC: ..." instead of gRPC's format on stderr. Called once, at start-up, before any call.
void route_grpc_log(std::function<void(const std::string&)> log);

}  // namespace strata::rpc
