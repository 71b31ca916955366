#include "cluster/discovery.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "rpc/auth.h"

namespace strata::cluster {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr auto kAnnounceInterval = std::chrono::seconds(1);
// How long stopping may take: the receive loop looks at the stop flag this often.
constexpr auto kPollSlice = std::chrono::milliseconds(200);
// Senders whose refusals are logged; past this, a flood of forged sources costs no memory.
constexpr size_t kMaxLoggedSenders = 1024;
// Keeps a discovery MAC apart from every other message the cluster key signs.
constexpr std::string_view kMacDomain = "strata-discovery\n";

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string mac_of(const json& unsigned_message, const rpc::ClusterKey& key) {
  return key.mac(std::string(kMacDomain) + unsigned_message.dump());
}

const json& field(const json& message, const char* name, bool (json::*has_type)() const noexcept,
                  const char* type) {
  const auto found = message.find(name);
  if (found == message.end()) throw std::invalid_argument(std::string("no \"") + name + "\"");
  if (!((*found).*has_type)()) throw std::invalid_argument(std::string("\"") + name + "\" is not " + type);
  return *found;
}

std::string string_field(const json& message, const char* name) {
  return field(message, name, &json::is_string, "a string").get<std::string>();
}

int64_t integer_field(const json& message, const char* name, int64_t min, int64_t max) {
  const json& value = field(message, name, &json::is_number_integer, "an integer");
  const bool in_range = value.is_number_unsigned() ? value.get<uint64_t>() <= static_cast<uint64_t>(max)
                                                   : value.get<int64_t>() >= min && value.get<int64_t>() <= max;
  if (!in_range) throw std::invalid_argument(std::string("\"") + name + "\" is out of range");
  return value.get<int64_t>();
}

Verdict refused(std::string why) { return {Verdict::Kind::Refused, {}, {}, std::move(why)}; }

in_addr ipv4(const std::string& text) {
  in_addr address{};
  if (inet_pton(AF_INET, text.c_str(), &address) != 1) throw std::runtime_error("not an IPv4 address: " + text);
  return address;
}

std::string text_of(const in_addr& address) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &address, text, sizeof text);
  return text;
}

UniqueFd udp_socket() {
  UniqueFd fd(socket(AF_INET, SOCK_DGRAM, 0));
  if (fd.get() < 0) throw std::runtime_error(system_error("discovery cannot open a UDP socket"));
  return fd;
}

void set_option(int fd, int level, int name, const void* value, socklen_t size, const std::string& what) {
  if (setsockopt(fd, level, name, value, size) != 0) throw std::runtime_error(system_error("discovery cannot " + what));
}

// Several nodes on one machine share the discovery port; each gets every announcement.
UniqueFd listening_socket(int port) {
  UniqueFd fd = udp_socket();
  const int on = 1;
  set_option(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on, "share its port");
#ifdef SO_REUSEPORT
  // BSDs and macOS need this as well to let two processes bind one multicast port.
  set_option(fd.get(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on, "share its port");
#endif
#ifdef __linux__
  // Linux only: otherwise a socket bound to any address hears every group any socket on this
  // host has joined.
  const int off = 0;
  set_option(fd.get(), IPPROTO_IP, IP_MULTICAST_ALL, &off, sizeof off, "limit itself to its group");
#endif
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    throw std::runtime_error(system_error("discovery cannot listen on UDP port " + std::to_string(port)) +
                             " (choose another with --discovery-port, or --no-discovery)");
  }
  return fd;
}

UniqueFd sending_socket() {
  UniqueFd fd = udp_socket();
  const unsigned char ttl = 1;  // announcements stay on the link
  const unsigned char loop = 1;  // nodes on this machine hear each other too
  set_option(fd.get(), IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl, "set the multicast TTL");
  set_option(fd.get(), IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop, "loop multicast back");
  return fd;
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  std::swap(fd_, other.fd_);
  return *this;
}

std::string encode_announcement(const Announcement& announcement, const rpc::ClusterKey& key, int64_t time_ms,
                                std::string_view nonce) {
  json message{{"node_id", announcement.node_id},
               {"host", announcement.host},
               {"node_port", announcement.node_port},
               {"model_hash", announcement.model_hash},
               {"protocol_version", announcement.protocol_version},
               {"time", time_ms},
               {"nonce", nonce}};
  return sign_announcement(std::move(message), key);
}

std::string sign_announcement(json message, const rpc::ClusterKey& key) {
  message["mac"] = mac_of(message, key);
  return message.dump();
}

Verdict judge_announcement(std::string_view datagram, std::string_view source_host, const Announcement& self,
                           const rpc::ClusterKey& key, int64_t now_ms) {
  if (datagram.size() > kMaxAnnouncementBytes) {
    return refused("a datagram of more than " + std::to_string(kMaxAnnouncementBytes) + " bytes");
  }
  Verdict verdict;
  try {
    json message = json::parse(datagram);
    if (!message.is_object()) return refused("a datagram that is not a JSON object");
    const auto mac = message.find("mac");
    if (mac == message.end() || !mac->is_string()) return refused("an announcement without a cluster-key MAC");
    const std::string given = mac->get<std::string>();
    message.erase(mac);
    const std::string expected = mac_of(message, key);
    if (given.size() != expected.size() || CRYPTO_memcmp(given.data(), expected.data(), given.size()) != 0) {
      return refused("an announcement with a wrong MAC (the sender has another cluster key)");
    }
    Announcement& a = verdict.announcement;
    a.node_id = string_field(message, "node_id");
    a.host = string_field(message, "host");
    a.node_port = static_cast<int>(integer_field(message, "node_port", 1, 65535));
    a.model_hash = string_field(message, "model_hash");
    a.protocol_version =
        static_cast<uint32_t>(integer_field(message, "protocol_version", 0, std::numeric_limits<uint32_t>::max()));
    const int64_t time = integer_field(message, "time", 0, std::numeric_limits<int64_t>::max());
    string_field(message, "nonce");
    if (time < now_ms - rpc::kClockSkewMs || time > now_ms + rpc::kClockSkewMs) {
      return refused("an announcement whose time is more than a minute from this node's clock (a replay, or "
                     "clocks that disagree)");
    }
    if (a.host != source_host) {
      return refused("an announcement of " + a.host + " sent from " + std::string(source_host) + " (a replay)");
    }
  } catch (const std::exception& e) {
    return refused(std::string("a malformed announcement: ") + e.what());
  }
  const Announcement& a = verdict.announcement;
  if (a.node_id == self.node_id) {
    verdict.kind = Verdict::Kind::Own;
  } else if (a.protocol_version != self.protocol_version) {
    verdict.kind = Verdict::Kind::Incompatible;
    verdict.why = "speaks protocol " + std::to_string(a.protocol_version) + ", this node " +
                  std::to_string(self.protocol_version);
  } else if (!self.model_hash.empty() && a.model_hash != self.model_hash) {
    verdict.kind = Verdict::Kind::Incompatible;
    verdict.why = a.model_hash.empty() ? "has no model yet (it takes the model of a node it finds)"
                                       : "runs another model (hash " + a.model_hash.substr(0, 12) + ")";
  } else {
    verdict.kind = Verdict::Kind::Found;
    verdict.address = a.host + ":" + std::to_string(a.node_port);
  }
  return verdict;
}

std::vector<MulticastInterface> multicast_interfaces(const std::string& only) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw std::runtime_error(system_error("cannot list the network interfaces"));
  const std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owner(list, freeifaddrs);
  std::vector<MulticastInterface> found;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    const std::string name = entry->ifa_name;
    if (!only.empty() && name != only) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_MULTICAST) == 0) {
      if (!only.empty()) throw std::runtime_error("interface " + name + " is down or cannot multicast");
      continue;
    }
    const bool known = std::any_of(found.begin(), found.end(), [&](const auto& i) { return i.name == name; });
    if (!known) found.push_back({name, text_of(reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr)});
  }
  if (!only.empty() && found.empty()) throw std::runtime_error("no network interface " + only + " with an IPv4 address");
  return found;
}

Discovery::Discovery(DiscoveryOptions options) : options_(std::move(options)) {
  if (!options_.key) throw std::runtime_error("discovery needs a cluster key");
  Announcement longest = options_.self;
  longest.host = "255.255.255.255";
  if (encode_announcement(longest, *options_.key, rpc::unix_time_ms(), rpc::fresh_nonce()).size() > kMaxAnnouncementBytes) {
    throw std::runtime_error("node id " + options_.self.node_id.substr(0, 32) + "... is too long to announce");
  }
  const std::vector<MulticastInterface> candidates = multicast_interfaces(options_.interface_name);
  if (candidates.empty()) {
    log("discovery is off: no IPv4 interface that can multicast (name peers with --peers)");
    return;
  }
  listen_fd_ = listening_socket(options_.port);
  std::string joined;
  for (const MulticastInterface& candidate : candidates) {
    ip_mreq membership{};
    membership.imr_multiaddr = ipv4(kDiscoveryGroup);
    membership.imr_interface = ipv4(candidate.address);
    if (setsockopt(listen_fd_.get(), IPPROTO_IP, IP_ADD_MEMBERSHIP, &membership, sizeof membership) != 0) {
      log(system_error("discovery leaves out " + candidate.name + ": cannot join " + kDiscoveryGroup + " there"));
      continue;
    }
    interfaces_.push_back(candidate);
    joined += (joined.empty() ? "" : ", ") + candidate.name + " (" + candidate.address + ")";
  }
  if (interfaces_.empty()) {
    log("discovery is off: no interface could join the group (name peers with --peers)");
    return;
  }
  send_fd_ = sending_socket();
  log("discovery announces this node on " + std::string(kDiscoveryGroup) + ":" + std::to_string(options_.port) +
      " and listens there, on " + joined);
  thread_ = std::thread([this] { run(); });
}

Discovery::~Discovery() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void Discovery::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void Discovery::log_once(const std::string& sender, const std::string& line) {
  if (logged_senders_.size() >= kMaxLoggedSenders || !logged_senders_.insert(sender).second) return;
  log(line);
}

void Discovery::run() {
  auto next_announcement = Clock::now();
  while (!stopping_) {
    const auto now = Clock::now();
    if (now >= next_announcement) {
      announce();
      next_announcement = std::max(next_announcement + kAnnounceInterval, now);
    }
    const auto wait = std::min<Clock::duration>(kPollSlice, next_announcement - Clock::now());
    pollfd readable{listen_fd_.get(), POLLIN, 0};
    const int timeout_ms =
        static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()));
    if (poll(&readable, 1, timeout_ms) > 0 && (readable.revents & POLLIN) != 0) receive();
  }
}

void Discovery::announce() {
  sockaddr_in group{};
  group.sin_family = AF_INET;
  group.sin_port = htons(static_cast<uint16_t>(options_.port));
  group.sin_addr = ipv4(kDiscoveryGroup);
  for (const MulticastInterface& interface : interfaces_) {
    const in_addr from = ipv4(interface.address);
    Announcement self = options_.self;
    self.host = interface.address;
    try {
      const std::string datagram = encode_announcement(self, *options_.key, rpc::unix_time_ms(), rpc::fresh_nonce());
      // The source address of a datagram sent through an interface is that interface's address,
      // which receivers compare with the announced host.
      if (setsockopt(send_fd_.get(), IPPROTO_IP, IP_MULTICAST_IF, &from, sizeof from) != 0 ||
          sendto(send_fd_.get(), datagram.data(), datagram.size(), 0, reinterpret_cast<const sockaddr*>(&group),
                 sizeof group) < 0) {
        log_once("send " + interface.name, system_error("discovery cannot announce on " + interface.name));
      }
    } catch (const std::exception& e) {
      log_once("send " + interface.name, "discovery cannot announce on " + interface.name + ": " + e.what());
    }
  }
}

void Discovery::receive() {
  char buffer[kMaxAnnouncementBytes + 1];  // one byte more shows a datagram that is too big
  sockaddr_in source{};
  socklen_t source_size = sizeof source;
  const ssize_t size =
      recvfrom(listen_fd_.get(), buffer, sizeof buffer, 0, reinterpret_cast<sockaddr*>(&source), &source_size);
  if (size < 0 || source.sin_family != AF_INET) return;
  const std::string source_host = text_of(source.sin_addr);
  const Verdict verdict = judge_announcement(std::string_view(buffer, static_cast<size_t>(size)), source_host,
                                             options_.self, *options_.key, rpc::unix_time_ms());
  switch (verdict.kind) {
    case Verdict::Kind::Found:
      if (options_.on_found) options_.on_found(verdict.announcement.node_id, verdict.address);
      break;
    case Verdict::Kind::Own:
      break;
    case Verdict::Kind::Incompatible:
      log_once("node " + verdict.announcement.node_id,
               "discovery leaves out node " + verdict.announcement.node_id + " at " + source_host + ": it " +
                   verdict.why);
      break;
    case Verdict::Kind::Refused:
      log_once("address " + source_host, "discovery refused " + verdict.why + " from " + source_host);
      break;
  }
}

}  // namespace strata::cluster
