#include "cluster/hello_targets.h"

#include <algorithm>

namespace strata::cluster {

bool DiscoveredNodes::found(const std::string& address, ControlTime now) {
  std::lock_guard lock(mutex_);
  const bool known = heard_.contains(address);
  heard_[address] = now;
  return !known;
}

std::vector<std::string> DiscoveredNodes::addresses(ControlTime now) {
  std::lock_guard lock(mutex_);
  std::erase_if(heard_, [now](const auto& entry) { return now - entry.second > kPeerTimeout; });
  std::vector<std::string> addresses;
  for (const auto& [address, heard_at] : heard_) addresses.push_back(address);
  return addresses;
}

std::vector<std::string> hello_targets(const ControlState& control, const std::vector<std::string>& discovered) {
  std::vector<std::string> addresses;
  for (const auto& [address, answered] : control.seeds) addresses.push_back(address);
  for (const std::string& address : discovered) {
    if (!control.seeds.contains(address)) addresses.push_back(address);
  }
  for (const auto& [id, peer] : control.peers) {
    if (!peer.info.address.empty() &&
        std::find(addresses.begin(), addresses.end(), peer.info.address) == addresses.end()) {
      addresses.push_back(peer.info.address);
    }
  }
  return addresses;
}

}  // namespace strata::cluster
