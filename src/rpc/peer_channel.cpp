#include "rpc/peer_channel.h"

#include "rpc/channel.h"
#include "rpc/remote_stage.h"

namespace strata::rpc {

PeerChannel PeerChannel::to(const std::string& address, const ClusterKey& key) {
  return PeerChannel(make_channel(address, key));
}

PeerChannel PeerChannel::bulk_to(const std::string& address, const ClusterKey& key) {
  return PeerChannel(make_bulk_channel(address, key));
}

PeerChannel PeerChannels::to(const std::string& address) {
  std::lock_guard lock(mutex_);
  PeerChannel& channel = channels_[address];
  if (!channel) channel = PeerChannel::to(address, *key_);
  return channel;
}

std::shared_ptr<engine::Stage> remote_stage(std::string peer_id, const PeerChannel& channel, Caller caller,
                                            engine::StageLayers layers) {
  return std::make_shared<RemoteStage>(std::move(peer_id), channel.transport(), std::move(caller), layers);
}

}  // namespace strata::rpc
