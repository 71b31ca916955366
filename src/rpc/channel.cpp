#include "rpc/channel.h"

#include <grpc/support/log.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string_view>

#include "rpc/link_metrics.h"

namespace strata::rpc {
namespace {

std::atomic<const std::function<void(const std::string&)>*> grpc_log{nullptr};

// Each line once (of the first thousand kinds): gRPC says the same again at every
// reconnection, such as a handshake refused to a caller without the cluster key, which another
// cluster's node tries again every second.
void forward_grpc_log(gpr_log_func_args* args) {
  const auto* log = grpc_log.load();
  if (log == nullptr) return;
  static std::mutex mutex;
  static std::set<std::string, std::less<>> said;
  constexpr size_t kMostRemembered = 1024;
  const std::string_view message = args->message;
  {
    std::lock_guard lock(mutex);
    if (said.contains(message)) return;
    if (said.size() < kMostRemembered) said.emplace(message);
  }
  (*log)("gRPC: " + std::string(message) +
         (is_handshake_failure(message)
              ? " (a TLS handshake refused: the other end lacks this cluster's key, or is not a Strata node)"
              : ""));
}

// A prompt chunk of 256 tokens of an 8192-wide model is 8 MiB of activations.
constexpr int kMaxMessageBytes = 64 << 20;
constexpr int kKeepaliveMs = 1000;
// HTTP/2's default 64 KiB window makes a batch of a few rows wait a round trip for a window
// update; a window of a whole prompt chunk's activations lets every message go at once.
constexpr int kWindowBytes = 16 << 20;
constexpr int kKeepaliveTimeoutMs = 2000;

grpc::ChannelArguments channel_arguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kWindowBytes);
  // A peer that comes back is tried again soon, not after gRPC's default back-off of minutes.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  // Nodes are reached by address, and every node's certificate carries the same name.
  args.SetSslTargetNameOverride(kNodeCertificateName);
  return args;
}

}  // namespace

std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const ClusterKey& key) {
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, key.links().channel_credentials(),
                                                                 channel_arguments(), count_calls_made());
}

std::shared_ptr<grpc::Channel> make_bulk_channel(const std::string& address, const ClusterKey& key) {
  grpc::ChannelArguments args = channel_arguments();
  // Channels with equal arguments share connections through gRPC's global pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, key.links().channel_credentials(), args,
                                                                 count_calls_made());
}

void configure_server(grpc::ServerBuilder& builder, const std::string& node_id) {
  builder.experimental().SetInterceptorCreators(count_calls_served(node_id));
  // Two nodes given the same port must not share it silently: the second one fails to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveMs / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kWindowBytes);
}

bool is_handshake_failure(std::string_view message) {
  return message.find("andshake failed") != std::string_view::npos ||
         message.find("certificate verify failed") != std::string_view::npos;
}

void route_grpc_log(std::function<void(const std::string&)> log) {
  // Never freed: gRPC's threads may still log while the process exits.
  grpc_log = new std::function<void(const std::string&)>(std::move(log));
  gpr_set_log_function(forward_grpc_log);
}

}  // namespace strata::rpc
