#include "parallel/group_links.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "parallel/tls_link.h"

namespace strata::parallel {
namespace {

// What a dialer says once the handshake is done, followed by the group's name.
struct Introduction {
  uint32_t magic;
  uint32_t group_bytes;
  uint32_t from;  // the dialer's member
  uint32_t to;    // the member it means to reach
};
constexpr uint32_t kIntroductionMagic = 0x31475453;  // "STG1"
// A dialer that measures the link (GroupLinks::measure) says this instead, and no group.
constexpr uint32_t kProbeMagic = 0x31505453;  // "STP1"
// A probe's messages: a 4-byte length, that many bytes, answered by the length once they are
// all in; length 0 ends it. The small ones time the round trip, the bulk one the bandwidth.
constexpr uint32_t kPingBytes = 8;
constexpr int kPings = 16;
constexpr uint32_t kBulkBytes = 4 << 20;
constexpr int kBulkTransfers = 3;
constexpr uint32_t kLongestProbeMessage = 16 << 20;
constexpr size_t kMostProbing = 16;
constexpr size_t kLongestGroupName = 4096;
// The listener's answer once its join took the connection: the dialer's join may return.
constexpr std::byte kClaimed{1};
// Beyond these, arrivals wait in the listen backlog, and the oldest unclaimed connection goes.
constexpr size_t kMostIntroducing = 64;
constexpr size_t kMostUnclaimed = 256;

class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

std::string errno_text() { return std::strerror(errno); }

int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

struct HostPort {
  std::string host;
  std::string port;
};

HostPort split_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw std::invalid_argument("'" + address + "' is not host:port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, address.substr(colon + 1)};
}

struct AddressesDeleter {
  void operator()(addrinfo* list) const { ::freeaddrinfo(list); }
};
using Addresses = std::unique_ptr<addrinfo, AddressesDeleter>;

Addresses resolve(const std::string& host, const std::string& port, bool to_listen) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = to_listen ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const int error = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (error != 0) throw std::runtime_error("cannot resolve '" + host + "': " + ::gai_strerror(error));
  return Addresses(found);
}

// A gather's frame is small and the peer waits for it: TCP must send it at once rather than
// hold it for more (Nagle's algorithm).
void send_at_once(int fd) {
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

// A non-blocking socket connected to `address`.
int connect_before(const std::string& address, Clock::time_point deadline) {
  const HostPort where = split_address(address);
  const Addresses addresses = resolve(where.host, where.port, false);
  std::string failure = "no address";
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    Descriptor fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      failure = "socket: " + errno_text();
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
      send_at_once(fd.get());
      return fd.release();
    }
    if (errno != EINPROGRESS) {
      failure = "connect: " + errno_text();
      continue;
    }
    pollfd polled{fd.get(), POLLOUT, 0};
    int ready;
    do {
      ready = ::poll(&polled, 1, milliseconds_until(deadline));
    } while (ready < 0 && errno == EINTR);
    if (ready == 0) throw DeadlinePassed("timed out connecting");
    int error = 0;
    socklen_t length = sizeof error;
    if (ready < 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error == 0) {
      send_at_once(fd.get());
      return fd.release();
    }
    failure = std::string("connect: ") + std::strerror(error);
  }
  throw std::runtime_error(failure);
}

std::string address_of(const sockaddr_storage& address) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), sizeof address, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return std::string(host) + ":" + port;
}

// An arriving connection until it has said which group and member it is for.
struct Introducing {
  std::unique_ptr<TlsStream> stream;
  Clock::time_point deadline;
  std::string from;  // the peer's address, for the reason it was refused
  bool handshaken = false;
  std::vector<std::byte> said = std::vector<std::byte>(sizeof(Introduction));
  size_t got = 0;
  PeerStream::Waits waits = PeerStream::Waits::Readable;
  bool poked = true;  // its socket is ready: worth advancing

  Introduction introduction() const {
    Introduction header;
    std::memcpy(&header, said.data(), sizeof header);
    return header;
  }
  std::string group() const {
    return std::string(reinterpret_cast<const char*>(said.data()) + sizeof(Introduction), said.size() - sizeof(Introduction));
  }

  // Moves it on as far as its socket allows; true once it has said all. Throws for a failed
  // handshake or an introduction that is not one.
  bool advance() {
    if (!handshaken) {
      waits = stream->handshake();
      if (waits != PeerStream::Waits::Nothing) return false;
      handshaken = true;
    }
    while (got < said.size()) {
      const PeerStream::Moved moved = stream->receive(std::span(said).subspan(got));
      if (moved.bytes == 0) {
        waits = moved.waits;
        return false;
      }
      got += moved.bytes;
      if (got == sizeof(Introduction)) {
        const Introduction header = introduction();
        if (header.magic == kProbeMagic && header.group_bytes == 0) return true;
        if (header.magic != kIntroductionMagic || header.group_bytes == 0 || header.group_bytes > kLongestGroupName) {
          throw std::runtime_error("not an introduction");
        }
        said.resize(sizeof header + header.group_bytes);
      }
    }
    return true;
  }
};

// A probe arrived (GroupLinks::measure): each message taken in whole, then its length sent back.
struct Answering {
  std::unique_ptr<TlsStream> stream;
  Clock::time_point deadline;
  PeerStream::Waits waits = PeerStream::Waits::Readable;
  bool poked = true;
  std::array<std::byte, sizeof(uint32_t)> length{};
  size_t length_got = 0;
  size_t body_left = 0;
  size_t answered = sizeof(uint32_t);  // of `length`, sent back: all, while none is owed

  // Moves it on as far as its socket allows; true once the prober said it is done. Throws for
  // a lost connection or a message longer than a probe sends.
  bool advance() {
    static std::array<std::byte, 64 << 10> discarded;
    for (;;) {
      PeerStream::Moved moved;
      if (answered < length.size()) {
        moved = stream->send(std::span(length).subspan(answered));
        answered += moved.bytes;
      } else if (length_got < length.size()) {
        moved = stream->receive(std::span(length).subspan(length_got));
        length_got += moved.bytes;
        if (length_got == length.size()) {
          uint32_t bytes;
          std::memcpy(&bytes, length.data(), sizeof bytes);
          if (bytes == 0) return true;
          if (bytes > kLongestProbeMessage) throw std::runtime_error("not a probe");
          body_left = bytes;
        }
      } else if (body_left > 0) {
        moved = stream->receive(std::span(discarded).first(std::min(body_left, discarded.size())));
        body_left -= moved.bytes;
      } else {
        answered = 0;
        length_got = 0;
        continue;
      }
      if (moved.bytes == 0) {
        waits = moved.waits;
        return false;
      }
    }
  }
};

}  // namespace

struct GroupLinks::State {
  // An introduced connection, waiting for the join of its group and member.
  struct Unclaimed {
    uint64_t id;
    std::string group;
    uint32_t from;
    uint32_t to;
    std::unique_ptr<TlsStream> stream;
    Clock::time_point expires;
  };

  State(const LinkCredentials& credentials, GroupLinkLimits limits)
      : tls(credentials.authority_pem, credentials.certificate_pem, credentials.private_key_pem), limits(limits) {}

  void listen(const std::string& host, int port);
  // The service thread: handshakes and introductions of arriving connections, and the
  // unclaimed ones' expiry. Returns once `stop` is signalled.
  void serve();
  void hold(Introducing& arrived);
  LinkMeasurement measure(const std::string& address, std::chrono::milliseconds timeout);
  void drop_unclaimed(const std::vector<uint64_t>& watched, std::span<const pollfd> polled);
  std::unique_ptr<PeerStream> dial(const std::string& group, int member, int to, const std::string& address,
                                   std::chrono::milliseconds timeout, Clock::time_point deadline);
  void claim(const std::string& group, int member, std::vector<std::unique_ptr<PeerStream>>& peers,
             std::chrono::milliseconds timeout, Clock::time_point deadline);

  const TlsContext tls;
  const GroupLinkLimits limits;
  Descriptor listener{-1};
  int port = 0;
  Descriptor stop{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::mutex mutex;
  std::condition_variable arrived;  // a connection joined `unclaimed`
  std::list<Unclaimed> unclaimed;   // guarded by mutex
  uint64_t next_id = 0;             // guarded by mutex
  struct Refusal {
    Clock::time_point when;
    std::string why;
  } last_refusal;  // guarded by mutex
  std::thread service;
};

void GroupLinks::State::listen(const std::string& host, int wanted_port) {
  const std::string where = host + ":" + std::to_string(wanted_port);
  if (stop.get() < 0) throw std::runtime_error("group links: eventfd: " + errno_text());
  Addresses addresses;
  try {
    addresses = resolve(host, std::to_string(wanted_port), true);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("group links cannot listen on " + where + ": " + e.what());
  }
  std::string failure = "no address";
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    Descriptor fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    const int on = 1;
    if (fd.get() < 0 || ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        ::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 64) != 0) {
      failure = errno_text();
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      failure = errno_text();
      continue;
    }
    port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    listener.reset(fd.release());
    return;
  }
  throw std::runtime_error("group links cannot listen on " + where + ": " + failure);
}

void GroupLinks::State::serve() {
  std::list<Introducing> introducing;
  std::list<Answering> answering;
  std::vector<pollfd> polled;
  std::vector<uint64_t> watched;  // the unclaimed connections polled, in order after the introducing ones
  for (;;) {
    Clock::time_point next = Clock::now() + std::chrono::hours(1);
    const auto accepting = static_cast<short>(introducing.size() < kMostIntroducing ? POLLIN : 0);
    polled.assign({{stop.get(), POLLIN, 0}, {listener.get(), accepting, 0}});
    for (const Introducing& c : introducing) {
      polled.push_back({c.stream->socket(), poll_events(c.waits), 0});
      next = std::min(next, c.deadline);
    }
    for (const Answering& a : answering) {
      polled.push_back({a.stream->socket(), poll_events(a.waits), 0});
      next = std::min(next, a.deadline);
    }
    watched.clear();
    {
      const std::lock_guard lock(mutex);
      // A connection waiting for its claim says nothing: that its socket is readable means its
      // dialer closed it (gave up, or tried again) or broke the protocol.
      for (const Unclaimed& u : unclaimed) {
        polled.push_back({u.stream->socket(), POLLIN, 0});
        watched.push_back(u.id);
        next = std::min(next, u.expires);
      }
    }
    if (::poll(polled.data(), polled.size(), milliseconds_until(next)) < 0) continue;  // EINTR
    if (polled[0].revents != 0) return;
    auto stream_polled = polled.begin() + 2;
    for (Introducing& c : introducing) c.poked = (stream_polled++)->revents != 0;
    for (Answering& a : answering) a.poked = (stream_polled++)->revents != 0;
    drop_unclaimed(watched, std::span(polled).subspan(2 + introducing.size() + answering.size()));
    const Clock::time_point now = Clock::now();
    sockaddr_storage peer{};
    socklen_t peer_length = sizeof peer;
    for (int fd; (polled[1].revents & POLLIN) != 0 && introducing.size() < kMostIntroducing &&
                 (fd = ::accept4(listener.get(), reinterpret_cast<sockaddr*>(&peer), &peer_length,
                                 SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;
         peer_length = sizeof peer) {
      send_at_once(fd);
      try {
        introducing.push_back(
            {std::make_unique<TlsStream>(tls, fd, TlsRole::Listener), now + limits.introduction, address_of(peer)});
      } catch (const std::runtime_error&) {
        // OpenSSL could not make the connection: the dialer sees it closed and tries again.
      }
    }
    for (auto c = introducing.begin(); c != introducing.end();) {
      bool done = false;
      bool failed = false;
      try {
        done = c->poked && c->advance();
      } catch (const std::runtime_error& e) {
        // A handshake refused (no certificate of the authority) or a stranger's bytes: a join
        // waiting in vain says so.
        failed = true;
        const std::lock_guard lock(mutex);
        last_refusal = {Clock::now(), c->from + ": " + e.what()};
      }
      if (done && c->introduction().magic == kProbeMagic) {
        if (answering.size() >= kMostProbing) answering.pop_front();
        answering.push_back({std::move(c->stream), now + limits.introduction});
      } else if (done) {
        hold(*c);
      }
      c = done || failed || now >= c->deadline ? introducing.erase(c) : std::next(c);
    }
    for (auto a = answering.begin(); a != answering.end();) {
      bool ended = now >= a->deadline;
      try {
        ended = ended || (a->poked && a->advance());
      } catch (const std::runtime_error&) {
        ended = true;  // the prober sees its connection end
      }
      a = ended ? answering.erase(a) : std::next(a);
    }
  }
}

void GroupLinks::State::hold(Introducing& introduced) {
  const Introduction header = introduced.introduction();
  std::string group = introduced.group();
  const std::lock_guard lock(mutex);
  // A dialer that tried again has given up on its earlier connection.
  std::erase_if(unclaimed, [&](const Unclaimed& u) { return u.group == group && u.from == header.from && u.to == header.to; });
  if (unclaimed.size() >= kMostUnclaimed) unclaimed.pop_front();
  unclaimed.push_back(
      {next_id++, std::move(group), header.from, header.to, std::move(introduced.stream), Clock::now() + limits.unclaimed});
  arrived.notify_all();
}

void GroupLinks::State::drop_unclaimed(const std::vector<uint64_t>& watched, std::span<const pollfd> polled) {
  const Clock::time_point now = Clock::now();
  const std::lock_guard lock(mutex);
  for (size_t i = 0; i < watched.size(); ++i) {
    if (polled[i].revents != 0) std::erase_if(unclaimed, [&](const Unclaimed& u) { return u.id == watched[i]; });
  }
  std::erase_if(unclaimed, [&](const Unclaimed& u) { return u.expires <= now; });
}

std::unique_ptr<PeerStream> GroupLinks::State::dial(const std::string& group, int member, int to,
                                                    const std::string& address, std::chrono::milliseconds timeout,
                                                    Clock::time_point deadline) {
  std::vector<std::byte> introduction(sizeof(Introduction) + group.size());
  const Introduction header{kIntroductionMagic, static_cast<uint32_t>(group.size()), static_cast<uint32_t>(member),
                            static_cast<uint32_t>(to)};
  std::memcpy(introduction.data(), &header, sizeof header);
  std::memcpy(introduction.data() + sizeof header, group.data(), group.size());
  std::string failure;
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    try {
      auto stream = std::make_unique<TlsStream>(tls, connect_before(address, deadline), TlsRole::Dialer);
      finish_handshake(*stream, deadline);
      send_all(*stream, introduction, deadline);
      std::byte answer{};
      receive_all(*stream, std::span(&answer, 1), deadline);
      if (answer != kClaimed) throw std::runtime_error("answered something else than its claim");
      return stream;
    } catch (const DeadlinePassed& e) {
      failure = e.what() + (failure.empty() ? "" : " (before: " + failure + ")");
    } catch (const std::runtime_error& e) {
      failure = e.what();
    }
    if (Clock::now() >= deadline) {
      throw std::runtime_error("tensor-parallel group '" + group + "': member " + std::to_string(to) + " at " + address +
                               " could not be reached within " + std::to_string(timeout.count()) + " ms: " + failure);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

void GroupLinks::State::claim(const std::string& group, int member, std::vector<std::unique_ptr<PeerStream>>& peers,
                              std::chrono::milliseconds timeout, Clock::time_point deadline) {
  const auto members = static_cast<uint32_t>(peers.size());
  const auto me = static_cast<uint32_t>(member);
  const auto claimable = [&](const Unclaimed& u) {
    return u.group == group && u.to == me && u.from > me && u.from < members && peers[u.from] == nullptr;
  };
  const Clock::time_point start = Clock::now();
  for (;;) {
    std::vector<uint32_t> missing;
    for (uint32_t m = me + 1; m < members; ++m) {
      if (peers[m] == nullptr) missing.push_back(m);
    }
    if (missing.empty()) return;
    std::vector<Unclaimed> taken;
    {
      std::unique_lock lock(mutex);
      if (!arrived.wait_until(lock, deadline, [&] { return std::ranges::any_of(unclaimed, claimable); })) {
        std::string who = missing.size() == 1 ? "member " : "members ";
        for (size_t i = 0; i < missing.size(); ++i) who += (i == 0 ? "" : ", ") + std::to_string(missing[i]);
        const std::string refused =
            last_refusal.when >= start ? " (the last connection refused: " + last_refusal.why + ")" : "";
        throw std::runtime_error("tensor-parallel group '" + group + "': " + who + " did not connect to member " +
                                 std::to_string(member) + " within " + std::to_string(timeout.count()) + " ms" +
                                 refused);
      }
      for (auto u = unclaimed.begin(); u != unclaimed.end();) {
        if (claimable(*u)) {
          taken.push_back(std::move(*u));
          u = unclaimed.erase(u);
        } else {
          ++u;
        }
      }
    }
    for (Unclaimed& u : taken) {
      try {
        send_all(*u.stream, std::span(&kClaimed, 1), deadline);
        peers[u.from] = std::move(u.stream);
      } catch (const std::runtime_error&) {
        // Gone since it arrived: its dialer tries again.
      }
    }
  }
}

LinkMeasurement GroupLinks::State::measure(const std::string& address, std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  try {
    TlsStream stream(tls, connect_before(address, deadline), TlsRole::Dialer);
    finish_handshake(stream, deadline);
    const Introduction header{kProbeMagic, 0, 0, 0};
    send_all(stream, std::as_bytes(std::span(&header, 1)), deadline);
    std::vector<std::byte> payload(kBulkBytes);
    const auto round_trip = [&](uint32_t bytes) {
      const Clock::time_point start = Clock::now();
      send_all(stream, std::as_bytes(std::span(&bytes, 1)), deadline);
      send_all(stream, std::span(payload).first(bytes), deadline);
      uint32_t answer = 0;
      receive_all(stream, std::as_writable_bytes(std::span(&answer, 1)), deadline);
      if (answer != bytes) throw std::runtime_error("answered something else than a probe's length");
      return std::chrono::duration<double>(Clock::now() - start).count();
    };
    std::vector<double> pings;
    for (int i = 0; i < kPings; ++i) pings.push_back(round_trip(kPingBytes));
    std::nth_element(pings.begin(), pings.begin() + kPings / 2, pings.end());
    const double round = pings[kPings / 2];
    // The fastest of a few: a link's capacity, not a moment when either end was busy.
    double bulk = round_trip(kBulkBytes);
    for (int i = 1; i < kBulkTransfers; ++i) bulk = std::min(bulk, round_trip(kBulkBytes));
    const uint32_t done = 0;
    send_all(stream, std::as_bytes(std::span(&done, 1)), deadline);
    return {round / 2.0, kBulkBytes / std::max(bulk - round, 1e-9)};
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("measuring the link to " + address + ": " + e.what());
  }
}

GroupLinks::GroupLinks(const std::string& host, int port, LinkCredentials credentials, GroupLinkLimits limits)
    : state_(std::make_unique<State>(credentials, limits)) {
  const std::chrono::milliseconds zero(0);
  if (limits.introduction <= zero || limits.unclaimed <= zero || limits.silence <= zero) {
    throw std::invalid_argument("group links' limits must be positive");
  }
  state_->listen(host, port);
  state_->service = std::thread([state = state_.get()] { state->serve(); });
}

GroupLinks::~GroupLinks() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = ::write(state_->stop.get(), &one, sizeof one);
  state_->service.join();
}

int GroupLinks::port() const { return state_->port; }

LinkMeasurement GroupLinks::measure(const std::string& address, std::chrono::milliseconds timeout) {
  split_address(address);
  return state_->measure(address, timeout);
}

std::unique_ptr<SocketExchange> GroupLinks::join(const std::string& group, int member,
                                                 const std::vector<std::string>& addresses,
                                                 std::chrono::milliseconds timeout) {
  const auto members = static_cast<int>(addresses.size());
  if (group.empty() || group.size() > kLongestGroupName) {
    throw std::invalid_argument("a group's name has 1 to " + std::to_string(kLongestGroupName) + " bytes");
  }
  if (member < 0 || member >= members) {
    throw std::invalid_argument("member " + std::to_string(member) + " of a group of " + std::to_string(members));
  }
  for (int j = 0; j < member; ++j) split_address(addresses[static_cast<size_t>(j)]);
  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<std::unique_ptr<PeerStream>> peers(static_cast<size_t>(members));
  for (int j = 0; j < member; ++j) {
    peers[static_cast<size_t>(j)] = state_->dial(group, member, j, addresses[static_cast<size_t>(j)], timeout, deadline);
  }
  state_->claim(group, member, peers, timeout, deadline);
  return std::make_unique<SocketExchange>(member, std::move(peers), state_->limits.silence,
                                          state_->limits.test_send_delay, state_->limits.busy_wait);
}

}  // namespace strata::parallel
