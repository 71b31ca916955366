// Nodes on one LAN find each other without configuration: every second each node announces
// itself by UDP multicast to an administratively scoped group (TTL 1, so it never leaves the
// link), and every node that hears an announcement from a holder of the same cluster key, for
// the same model and protocol, gets its node address to say Hello to. Discovery only says where
// to look: membership is still decided by the authenticated Hello calls.
//
// An announcement is a JSON object: node id, the address it was sent from, node port, model
// hash, protocol version, a time, a nonce and an HMAC-SHA256 of the rest under the cluster key.
// The sending address is under the MAC and must equal the datagram's source, so a recorded
// announcement replayed from another host points nobody anywhere.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace strata::rpc {
class ClusterKey;
}

namespace strata::cluster {

// 7946 would be the usual choice, but Serf, Consul and Docker Swarm gossip there.
inline constexpr int kDefaultDiscoveryPort = 7947;
inline constexpr const char* kDiscoveryGroup = "239.255.77.77";
// Far above a real announcement (~400 bytes); a bigger datagram is refused unread.
inline constexpr size_t kMaxAnnouncementBytes = 2048;

struct Announcement {
  std::string node_id;
  std::string host;  // the IPv4 address it is sent from
  int node_port = 0;
  std::string model_hash;  // empty: a node without a model yet, which finds nodes of any model
  uint32_t protocol_version = 0;
};

// `message` with a "mac" of the rest under `key` added, as a datagram.
std::string sign_announcement(nlohmann::json message, const rpc::ClusterKey& key);

// The datagram for `announcement`, signed under `key` at `time_ms` (ms since the Unix epoch).
std::string encode_announcement(const Announcement& announcement, const rpc::ClusterKey& key, int64_t time_ms,
                                std::string_view nonce);

// What a received datagram means to a node that announces `self`.
struct Verdict {
  enum class Kind {
    Found,         // a node of this cluster: say Hello to `address`
    Own,           // this node's own announcement, looped back
    Incompatible,  // a holder of the key running another model or protocol
    Refused,       // not from a holder of the key, stale, or malformed
  };
  Kind kind = Kind::Refused;
  Announcement announcement;  // as parsed, when it could be
  std::string address;        // source host:node port, for Found
  std::string why;            // for Incompatible and Refused
};

// Never throws: any bytes from the network give a verdict.
Verdict judge_announcement(std::string_view datagram, std::string_view source_host, const Announcement& self,
                           const rpc::ClusterKey& key, int64_t now_ms);

struct MulticastInterface {
  std::string name;
  std::string address;  // its first IPv4 address
};

// Interfaces that are up, can multicast and have an IPv4 address, or only the one named
// `only`; throws std::runtime_error when `only` is not such an interface.
std::vector<MulticastInterface> multicast_interfaces(const std::string& only);

struct DiscoveryOptions {
  Announcement self;  // host is set per interface
  int port = kDefaultDiscoveryPort;
  std::string interface_name;  // empty: every interface multicast_interfaces finds
  std::shared_ptr<const rpc::ClusterKey> key;  // required
  std::function<void(const std::string& node_id, const std::string& address)> on_found;
  std::function<void(const std::string&)> log;
};

// A socket descriptor closed when it goes.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }

 private:
  int fd_;
};

// Announces and listens on its own thread from construction to destruction. Throws
// std::runtime_error when the options cannot work (no key, an unknown interface, a port that
// cannot be bound); logs, and stays off, when no interface can multicast.
class Discovery {
 public:
  explicit Discovery(DiscoveryOptions options);
  ~Discovery();
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

 private:
  void run();
  void announce();
  void receive();
  void log(const std::string& line) const;
  // Logs `line` only the first time for `sender`, so that a sender announcing every second
  // is reported once.
  void log_once(const std::string& sender, const std::string& line);

  DiscoveryOptions options_;
  std::vector<MulticastInterface> interfaces_;
  UniqueFd listen_fd_;
  UniqueFd send_fd_;
  std::set<std::string> logged_senders_;
  std::atomic<bool> stopping_ = false;
  std::thread thread_;
};

}  // namespace strata::cluster
