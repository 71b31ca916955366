// A link to one peer's node service, as cluster code holds it: it passes the link to the clients
// here (Hello, weights, the leader's scheduler, a remote stage) and never sees the transport
// (gRPC) behind it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/stage.h"

namespace grpc {
class Channel;
}

namespace strata::rpc {

class ClusterKey;
struct Caller;

class PeerChannel {
 public:
  // To the node service at `address` (rpc/channel.h's make_channel).
  static PeerChannel to(const std::string& address, const ClusterKey& key);
  // With a connection of its own, for bulk transfers (make_bulk_channel).
  static PeerChannel bulk_to(const std::string& address, const ClusterKey& key);

  PeerChannel() = default;
  explicit PeerChannel(std::shared_ptr<grpc::Channel> channel) : channel_(std::move(channel)) {}
  explicit operator bool() const { return channel_ != nullptr; }
  // For the clients in src/rpc.
  const std::shared_ptr<grpc::Channel>& transport() const { return channel_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
};

// One channel per peer address, made when first asked for and kept, so that every call to a
// peer shares its connection. Thread-safe.
class PeerChannels {
 public:
  explicit PeerChannels(std::shared_ptr<const ClusterKey> key) : key_(std::move(key)) {}
  PeerChannel to(const std::string& address);

 private:
  std::shared_ptr<const ClusterKey> key_;
  std::mutex mutex_;
  std::map<std::string, PeerChannel> channels_;  // by address
};

// The pipeline stage `peer_id` runs behind `channel` (rpc/remote_stage.h).
std::shared_ptr<engine::Stage> remote_stage(std::string peer_id, const PeerChannel& channel, Caller caller,
                                            engine::StageLayers layers);

}  // namespace strata::rpc
