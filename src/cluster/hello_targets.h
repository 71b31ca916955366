// Whom gossip says Hello to each round: the seeds (--peers), the nodes that discovery found on
// the LAN while they go on announcing themselves, and every peer known, each address once.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cluster/control_rules.h"

namespace strata::cluster {

// The addresses discovery found, said Hello to like seeds, though a leader never waits for
// them. Thread-safe: discovery's thread adds, gossip reads.
class DiscoveredNodes {
 public:
  // Whether `address` is new.
  bool found(const std::string& address, ControlTime now);
  // The addresses announced within kPeerTimeout of `now`. The others are forgotten: a node that
  // stopped announcing is reached as a peer while it is a member, and its old address, perhaps
  // reused by another port, is not tried forever.
  std::vector<std::string> addresses(ControlTime now);

 private:
  std::mutex mutex_;
  std::map<std::string, ControlTime> heard_;  // address -> last announcement
};

// This round's addresses: the seeds, then the `discovered` ones, then the peers', each once.
std::vector<std::string> hello_targets(const ControlState& control, const std::vector<std::string>& discovered);

}  // namespace strata::cluster
