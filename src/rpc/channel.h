// gRPC settings shared by both ends of a node link: keepalive pings find a peer that stopped
// answering within a few seconds, and messages may carry a prompt chunk's activations.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace strata::rpc {

std::shared_ptr<grpc::Channel> make_channel(const std::string& address);
// A channel with a connection of its own, for bulk transfers (weights) that must not queue
// the pipeline's activations behind them.
std::shared_ptr<grpc::Channel> make_bulk_channel(const std::string& address);
void configure_server(grpc::ServerBuilder& builder);

}  // namespace strata::rpc
