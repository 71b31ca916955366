// This node's links to its peers' tensor-parallel group links, each measured once per peer
// process on a thread of the meter's own: what the node says of them (NodeInfo.links), and what
// the leader weighs a group's gathers by (cluster/tensor_groups.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster_types/node_info.h"

namespace strata::parallel {
class GroupLinks;
}

namespace strata::cluster {

class LinkMeter {
 public:
  // Measures the link to the group links at an address (the peer id left empty); throws
  // std::exception saying why it could not.
  using Measure = std::function<cluster_types::LinkMeasure(const std::string& address)>;

  // `measured` is called after each new measurement, without the meter's lock; a failed one is
  // logged once per peer process and tried again after `retry`.
  LinkMeter(Measure measure, std::function<void()> measured, std::function<void(const std::string&)> log,
            std::chrono::milliseconds retry = std::chrono::seconds(10));
  ~LinkMeter();
  LinkMeter(const LinkMeter&) = delete;
  LinkMeter& operator=(const LinkMeter&) = delete;

  // The peers there are now: those not measured at their process (instance) and group links'
  // address (exchange_address) are measured, those no longer there forgotten. Peers without
  // group links are left alone.
  void track(const std::vector<cluster_types::NodeInfo>& peers);
  // The links measured, in peer id order, and their peers.
  std::vector<cluster_types::LinkMeasure> links() const;
  std::vector<std::string> measured_peers() const;
  // Ends the measuring thread, after the measurement it is taking.
  void stop();

 private:
  struct Peer {
    std::string id;
    std::string instance;
    std::string exchange_address;
  };
  struct Link {
    Peer peer;
    bool measured = false;
    cluster_types::LinkMeasure measure;
    std::chrono::steady_clock::time_point failed_at{};
    bool failed = false;
  };
  void run();
  // The next peer due, or nullptr; with the lock held.
  Link* due(std::chrono::steady_clock::time_point now);

  const Measure measure_;
  const std::function<void()> measured_;
  const std::function<void(const std::string&)> log_;
  const std::chrono::milliseconds retry_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::string, Link> links_;  // by peer id
  bool stopping_ = false;
  std::thread thread_;
};

// How long one link's measurement may take.
inline constexpr auto kLinkMeasureLimit = std::chrono::seconds(5);

// A LinkMeter's measure over this node's group links, each taking at most `limit`.
LinkMeter::Measure measure_over(parallel::GroupLinks& links, std::chrono::milliseconds limit);

}  // namespace strata::cluster
