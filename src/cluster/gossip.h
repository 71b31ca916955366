// A node's gossip: rounds of Hellos to the addresses its node names, every kGossipInterval or
// at once when news calls for it. Each Hello is a task of its own, so that a peer that does not
// answer (a cable cut) holds up only its own Hellos for their deadline, never the round: the
// round waits up to kHelloWait for the answers, then the node acts on what it heard, and news
// (a new placement, a node ready for it) goes on at once. A peer whose Hello is still in flight
// when a round starts is passed by; it is told the news once that Hello returns.
//
// Its own lock guards its state (the Hellos in flight, whether to act now); it never holds it
// while calling its node, whose lock the node's callbacks take, so the node may call act_now()
// under its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster_types/hello.h"

namespace strata::cluster {

inline constexpr auto kGossipInterval = std::chrono::milliseconds(500);
// How long a gossip round waits for its Hellos' answers before it acts on what it knows.
inline constexpr auto kHelloWait = std::chrono::milliseconds(200);
// The longest one Hello may take.
inline constexpr auto kHelloDeadline = std::chrono::milliseconds(1000);

// What in a Hello its receiver acts on at once: the placement, and whether this node is ready
// for it, serves it or leaves.
struct HelloNews {
  uint64_t epoch = 0;
  std::string leader;
  uint64_t ready_epoch = 0;
  bool serving = false;
  bool leaving = false;
  bool operator==(const HelloNews&) const = default;
};

// A Hello as the node would send it now, and the news in it.
struct HelloMessage {
  cluster_types::Hello hello;
  HelloNews news;
};

// What gossip asks of its node; each is called without gossip's lock.
struct GossipHost {
  // This round's addresses, and what their Hellos say (taken together, under the node's lock).
  std::function<std::pair<std::vector<std::string>, HelloMessage>()> round;
  std::function<HelloNews()> news;        // the news now
  std::function<HelloMessage()> message;  // a Hello as it would say it now
  // Says Hello to `address` and takes the answer in; false when that failed on something
  // unexpected (the next round tries again).
  std::function<bool(const std::string& address, const cluster_types::Hello& hello)> greet;
  // After a round's Hellos have answered, or kHelloWait: act on what was heard.
  std::function<void()> act;
};

// Tests shorten or lengthen a node's rounds.
struct GossipTiming {
  std::chrono::milliseconds interval = kGossipInterval;
  std::chrono::milliseconds hello_wait = kHelloWait;
};

class Gossip {
 public:
  explicit Gossip(GossipHost host, GossipTiming timing = {});
  ~Gossip();  // stop()

  // Starts the rounds.
  void start();
  // Something changed that the round acts on, or that peers are to hear: run it now (or, in
  // a round's wait for its Hellos, stop waiting).
  void act_now();
  // Ends the rounds; returns once the Hellos in flight have returned.
  void stop();

 private:
  void run();
  // Says Hello to `address`, and again while its news is older than the node's or a round's
  // that passed it by.
  void greet_until_told(const std::string& address, HelloMessage said, const std::shared_ptr<int>& unanswered);

  GossipHost host_;
  GossipTiming timing_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool act_now_ = false;
  // Addresses with a Hello in flight, each with the news of the last round that passed it by.
  std::map<std::string, std::optional<HelloNews>> in_flight_;
  std::thread thread_;
};

}  // namespace strata::cluster
