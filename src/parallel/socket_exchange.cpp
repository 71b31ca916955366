#include "parallel/socket_exchange.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

struct FrameHeader {
  uint64_t call;
  uint64_t rows;
  uint64_t width;
};

std::runtime_error member_error(size_t peer, const std::string& what) {
  return std::runtime_error("tensor-parallel member " + std::to_string(peer) + ": " + what);
}

class SocketStream final : public PeerStream {
 public:
  explicit SocketStream(int fd) : fd_(fd) {
    // A gather's frame is small and the peer waits for it: TCP must send it at once rather
    // than hold it for more (Nagle's algorithm). Unix sockets have no such option, and refuse it.
    const int on = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  }
  ~SocketStream() override { ::close(fd_); }
  SocketStream(const SocketStream&) = delete;
  SocketStream& operator=(const SocketStream&) = delete;

  int socket() const override { return fd_; }

  Moved send(std::span<const std::byte> bytes) override {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return {static_cast<size_t>(n), Waits::Nothing};
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return {0, Waits::Writable};
    throw std::runtime_error(std::string("send: ") + std::strerror(errno));
  }

  Moved receive(std::span<std::byte> bytes) override {
    const ssize_t n = ::recv(fd_, bytes.data(), bytes.size(), MSG_DONTWAIT);
    if (n > 0) return {static_cast<size_t>(n), Waits::Nothing};
    if (n == 0) throw std::runtime_error("closed its connection");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return {0, Waits::Readable};
    throw std::runtime_error(std::string("recv: ") + std::strerror(errno));
  }

 private:
  const int fd_;
};

std::vector<std::unique_ptr<PeerStream>> socket_streams(const std::vector<int>& peers) {
  std::vector<std::unique_ptr<PeerStream>> streams;
  for (const int fd : peers) streams.push_back(fd >= 0 ? std::make_unique<SocketStream>(fd) : nullptr);
  return streams;
}

std::vector<std::unique_ptr<PeerStream>> checked_streams(int member, std::vector<std::unique_ptr<PeerStream>> peers,
                                                         std::chrono::milliseconds silence_limit) {
  const auto members = static_cast<int>(peers.size());
  if (member < 0 || member >= members) {
    throw std::invalid_argument("member " + std::to_string(member) + " of a group of " + std::to_string(members));
  }
  for (int m = 0; m < members; ++m) {
    if ((peers[static_cast<size_t>(m)] == nullptr) != (m == member)) {
      throw std::invalid_argument("member " + std::to_string(member) + " needs a stream to every other member");
    }
  }
  if (silence_limit <= std::chrono::milliseconds(0)) {
    throw std::invalid_argument("a silence limit of " + std::to_string(silence_limit.count()) + " ms");
  }
  return peers;
}

int new_abort_signal() {
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  return fd;
}

// One direction of one peer's transfer in the current call.
struct Direction {
  size_t done = 0;
  bool ready = true;  // worth trying without polling: it has not yet said it must wait
  PeerStream::Waits waits = PeerStream::Waits::Nothing;

  short poll_events() const { return ready ? 0 : parallel::poll_events(waits); }
  void update(PeerStream::Moved moved) {
    done += moved.bytes;
    ready = moved.bytes > 0;
    waits = moved.waits;
  }
  void wake(short revents) {
    if ((revents & (poll_events() | POLLERR | POLLHUP | POLLNVAL)) != 0) ready = true;
  }
};

}  // namespace

std::span<const std::byte> CacheWarming::warm_next() {
  while (region_ < regions_.size() && offset_ >= regions_[region_].size()) {
    ++region_;
    offset_ = 0;
  }
  if (region_ == regions_.size() || warmed_ >= kMostWarmed || Clock::now() < from_) return {};
  const std::span<const std::byte> region = regions_[region_];
  const std::span<const std::byte> piece = region.subspan(offset_, std::min(kPiece, region.size() - offset_));
  for (size_t at = 0; at < piece.size(); at += kCacheLine) __builtin_prefetch(piece.data() + at, 0, 2);
  warmed_ += piece.size();
  offset_ += piece.size();
  return piece;
}

SocketExchange::SocketExchange(int member, std::vector<std::unique_ptr<PeerStream>> peers,
                               std::chrono::milliseconds silence_limit, std::chrono::microseconds test_send_delay,
                               std::chrono::microseconds busy_wait)
    : member_(member),
      peers_(checked_streams(member, std::move(peers), silence_limit)),
      silence_limit_(silence_limit),
      test_send_delay_(test_send_delay),
      busy_wait_(std::max(busy_wait, std::chrono::microseconds(0))),
      abort_signal_(new_abort_signal()),
      received_(peers_.size()) {}

SocketExchange::SocketExchange(int member, const std::vector<int>& peers, std::chrono::milliseconds silence_limit,
                               std::chrono::microseconds busy_wait)
    : SocketExchange(member, socket_streams(peers), silence_limit, {}, busy_wait) {}

SocketExchange::~SocketExchange() { ::close(abort_signal_); }

void SocketExchange::abort() {
  aborted_ = true;
  const uint64_t one = 1;
  // Can fail only when the counter would overflow: it is readable already.
  [[maybe_unused]] const ssize_t written = ::write(abort_signal_, &one, sizeof one);
  // The other members, waiting in their gathers for this one, see its connections end at once
  // rather than after their silence limit. The sockets stay open until the streams close them,
  // so a gather on another thread never meets a descriptor reused.
  for (const auto& peer : peers_) {
    if (peer != nullptr) ::shutdown(peer->socket(), SHUT_RDWR);
  }
}

void SocketExchange::read_next(std::span<const std::span<const std::byte>> regions) {
  read_next_.assign(regions.begin(), regions.end());
}

std::runtime_error SocketExchange::aborted_error() const {
  return std::runtime_error("tensor-parallel member " + std::to_string(member_) + ": aborted");
}

void SocketExchange::all_gather_bytes(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                                      std::span<std::byte> full) {
  const size_t members = peers_.size();
  const size_t row_width = checked_row_width(mine, widths, rows, full);
  warmed_.swap(read_next_);
  read_next_.clear();
  CacheWarming warming(warmed_, Clock::now() + CacheWarming::kWarmAfter);
  if (aborted_) throw aborted_error();
  const FrameHeader header{calls_, rows, widths[static_cast<size_t>(member_)]};
  sent_.resize(sizeof header + mine.size());
  std::memcpy(sent_.data(), &header, sizeof header);
  // copy_n rather than memcpy: a part of no rows may have no storage (a null pointer).
  std::copy_n(mine.data(), mine.size(), sent_.data() + sizeof header);
  for (size_t m = 0; m < members; ++m) {
    received_[m].resize(m == static_cast<size_t>(member_) ? 0 : sizeof(FrameHeader) + rows * widths[m]);
  }
  if (test_send_delay_.count() > 0) {
    // Yielding rather than sleeping: a sleep of 200 us overshoots by some 80 us on a VM (its
    // timer's slack and wake-up), which a link's delay does not; and a member waiting for its
    // peers' frames waits busily (kDefaultBusyWait) anyway.
    const Clock::time_point send_at = Clock::now() + test_send_delay_;
    while (Clock::now() < send_at) {
      if (warming.warm_next().empty()) ::sched_yield();
    }
  }
  transfer(warming);
  size_t column = 0;
  for (size_t m = 0; m < members; ++m) {
    const size_t width = widths[m];
    const std::byte* part = mine.data();
    if (m != static_cast<size_t>(member_)) {
      FrameHeader theirs;
      std::memcpy(&theirs, received_[m].data(), sizeof theirs);
      if (theirs.call != calls_ || theirs.rows != rows || theirs.width != width) {
        throw member_error(m, "sent call " + std::to_string(theirs.call) + " of " + std::to_string(theirs.rows) +
                                  " x " + std::to_string(theirs.width) + " bytes, not call " +
                                  std::to_string(calls_) + " of " + std::to_string(rows) + " x " +
                                  std::to_string(width) + " bytes");
      }
      part = received_[m].data() + sizeof theirs;
    }
    for (size_t r = 0; r < rows; ++r) std::copy_n(part + r * width, width, full.data() + r * row_width + column);
    column += width;
  }
  ++calls_;
}

// Sends and receives as the streams allow, trying a direction again without polling for as
// long as it moves bytes (TLS holds decrypted bytes the socket no longer shows), until every
// frame is out and every peer's is in: a peer a call ahead has its next frame wait in the
// stream, read by the next call.
void SocketExchange::transfer(CacheWarming& warming) {
  const size_t members = peers_.size();
  const auto me = static_cast<size_t>(member_);
  std::vector<Direction> sending(members), receiving(members);
  std::vector<Clock::time_point> last_moved(members, Clock::now());
  std::vector<pollfd> polled;
  std::vector<size_t> polled_member;
  const Clock::time_point busy_until = Clock::now() + busy_wait_;
  for (;;) {
    bool pending = false;
    bool any_ready = false;
    for (size_t m = 0; m < members; ++m) {
      if (m == me) continue;
      PeerStream& peer = *peers_[m];
      try {
        if (sending[m].ready && sending[m].done < sent_.size()) {
          sending[m].update(peer.send(std::span(sent_).subspan(sending[m].done)));
          if (sending[m].ready) last_moved[m] = Clock::now();
        }
        if (receiving[m].ready && receiving[m].done < received_[m].size()) {
          receiving[m].update(peer.receive(std::span(received_[m]).subspan(receiving[m].done)));
          if (receiving[m].ready) last_moved[m] = Clock::now();
        }
      } catch (const std::runtime_error& e) {
        // A connection abort() shut down fails as lost, but the cause is here.
        if (aborted_) throw aborted_error();
        throw member_error(m, e.what());
      }
      const bool sends = sending[m].done < sent_.size();
      const bool receives = receiving[m].done < received_[m].size();
      pending = pending || sends || receives;
      any_ready = any_ready || (sends && sending[m].ready) || (receives && receiving[m].ready);
    }
    if (!pending) return;
    // A direction that moved bytes goes on before anything is polled: a stream's part of a
    // call is finite, and a poll per TLS record would cost more than the record.
    if (any_ready) continue;
    polled.assign(1, {abort_signal_, POLLIN, 0});
    polled_member.assign(1, me);
    std::chrono::milliseconds timeout = silence_limit_;
    const Clock::time_point now = Clock::now();
    for (size_t m = 0; m < members; ++m) {
      if (m == me) continue;
      const short events = static_cast<short>((sending[m].done < sent_.size() ? sending[m].poll_events() : 0) |
                                              (receiving[m].done < received_[m].size() ? receiving[m].poll_events() : 0));
      if (events == 0) {
        // Done with this call (none is ready, or there would be no poll): watched only for its
        // end, so that a member gone (or aborted) while others keep this one waiting breaks the
        // gather now. Its next frame, arriving early, is no event.
        polled.push_back({peers_[m]->socket(), POLLRDHUP, 0});
        polled_member.push_back(m);
        continue;
      }
      polled.push_back({peers_[m]->socket(), events, 0});
      polled_member.push_back(m);
      const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_moved[m]);
      if (silent >= silence_limit_) {
        throw member_error(m, "moved no bytes for " + std::to_string(silent.count()) + " ms (the limit is " +
                                  std::to_string(silence_limit_.count()) + " ms)");
      }
      timeout = std::min(timeout, silence_limit_ - silent);
    }
    // Busy: polls that return at once, between them a piece warmed or the core left to any
    // other thread.
    // Then a millisecond over the silence's time left, so that it is past the limit when poll
    // returns.
    const bool busy = Clock::now() < busy_until;
    if (busy && warming.warm_next().empty()) ::sched_yield();
    const int wait_ms = busy ? 0 : static_cast<int>(std::min<int64_t>(timeout.count(), 1 << 30) + 1);
    if (::poll(polled.data(), polled.size(), wait_ms) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    }
    if (polled[0].revents != 0) {
      throw aborted_error();
    }
    for (size_t i = 1; i < polled.size(); ++i) {
      const size_t m = polled_member[i];
      if (polled[i].events == POLLRDHUP && (polled[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
        throw member_error(m, "closed its connection");
      }
      sending[m].wake(polled[i].revents);
      receiving[m].wake(polled[i].revents);
    }
  }
}

std::vector<std::vector<int>> socket_pair_mesh(int members) {
  std::vector<std::vector<int>> peers(static_cast<size_t>(members), std::vector<int>(static_cast<size_t>(members), -1));
  for (size_t a = 0; a < peers.size(); ++a) {
    for (size_t b = a + 1; b < peers.size(); ++b) {
      int pair[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
      }
      peers[a][b] = pair[0];
      peers[b][a] = pair[1];
    }
  }
  return peers;
}

}  // namespace strata::parallel
