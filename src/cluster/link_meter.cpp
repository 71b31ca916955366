#include "cluster/link_meter.h"

#include <exception>

#include "parallel/group_links.h"

namespace strata::cluster {

LinkMeter::LinkMeter(Measure measure, std::function<void()> measured, std::function<void(const std::string&)> log,
                     std::chrono::milliseconds retry)
    : measure_(std::move(measure)), measured_(std::move(measured)), log_(std::move(log)), retry_(retry) {
  thread_ = std::thread([this] { run(); });
}

LinkMeter::~LinkMeter() { stop(); }

void LinkMeter::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LinkMeter::track(const std::vector<cluster_types::NodeInfo>& peers) {
  {
    std::lock_guard lock(mutex_);
    std::map<std::string, Link> kept;
    for (const cluster_types::NodeInfo& info : peers) {
      const Peer peer{info.node_id, info.instance, info.exchange_address};
      if (peer.exchange_address.empty() || peer.exchange_address.front() == ':') continue;
      const auto known = links_.find(peer.id);
      const bool same = known != links_.end() && known->second.peer.instance == peer.instance &&
                        known->second.peer.exchange_address == peer.exchange_address;
      kept[peer.id] = same ? known->second : Link{peer};
    }
    links_ = std::move(kept);
  }
  wake_.notify_all();
}

std::vector<cluster_types::LinkMeasure> LinkMeter::links() const {
  std::lock_guard lock(mutex_);
  std::vector<cluster_types::LinkMeasure> measured;
  for (const auto& [id, link] : links_) {
    if (link.measured) measured.push_back(link.measure);
  }
  return measured;
}

std::vector<std::string> LinkMeter::measured_peers() const {
  std::vector<std::string> peers;
  for (const cluster_types::LinkMeasure& link : links()) peers.push_back(link.peer_id);
  return peers;
}

LinkMeter::Link* LinkMeter::due(std::chrono::steady_clock::time_point now) {
  for (auto& [id, link] : links_) {
    if (!link.measured && (!link.failed || now - link.failed_at >= retry_)) return &link;
  }
  return nullptr;
}

void LinkMeter::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const Link* next = due(std::chrono::steady_clock::now());
    if (next == nullptr) {
      // A failed link comes due again by itself; a new peer comes with track().
      wake_.wait_for(lock, retry_);
      continue;
    }
    const Peer peer = next->peer;
    lock.unlock();
    cluster_types::LinkMeasure result;
    std::string failure;
    try {
      result = measure_(peer.exchange_address);
      result.peer_id = peer.id;
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lock.lock();
    const auto link = links_.find(peer.id);
    // Forgotten, or another process of it, while it was measured: what came of it is not its.
    if (link == links_.end() || link->second.peer.instance != peer.instance ||
        link->second.peer.exchange_address != peer.exchange_address) {
      continue;
    }
    if (failure.empty()) {
      link->second.measured = true;
      link->second.measure = result;
      lock.unlock();
      if (measured_) measured_();
      lock.lock();
    } else {
      const bool first = !link->second.failed;
      link->second.failed = true;
      link->second.failed_at = std::chrono::steady_clock::now();
      if (first && log_) {
        lock.unlock();
        log_("the link to " + peer.id + " could not be measured (it is tried again): " + failure);
        lock.lock();
      }
    }
  }
}

LinkMeter::Measure measure_over(parallel::GroupLinks& links, std::chrono::milliseconds limit) {
  return [&links, limit](const std::string& address) {
    const parallel::LinkMeasurement link = links.measure(address, limit);
    return cluster_types::LinkMeasure{{}, link.latency_seconds, link.bytes_per_second};
  };
}

}  // namespace strata::cluster
