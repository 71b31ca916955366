#include "parallel/socket_exchange.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace strata::parallel {
namespace {

struct FrameHeader {
  uint64_t call;
  uint64_t rows;
  uint64_t width;
};

std::runtime_error member_error(size_t peer, const std::string& what) {
  return std::runtime_error("tensor-parallel member " + std::to_string(peer) + ": " + what);
}

}  // namespace

SocketExchange::SocketExchange(int member, std::vector<int> peers)
    : member_(member), peers_(std::move(peers)), received_(peers_.size()) {
  if (member < 0 || static_cast<size_t>(member) >= peers_.size()) {
    throw std::invalid_argument("member " + std::to_string(member) + " of a group of " +
                                std::to_string(peers_.size()));
  }
  // A gather's frame is small and the peer waits for it: TCP must send it at once rather than
  // hold it for more (Nagle's algorithm). Unix sockets have no such option, and refuse it.
  for (const int fd : peers_) {
    const int on = 1;
    if (fd >= 0) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  }
}

SocketExchange::~SocketExchange() {
  for (const int fd : peers_) {
    if (fd >= 0) ::close(fd);
  }
}

void SocketExchange::all_gather(std::span<const float> mine, std::span<const int> widths, size_t rows,
                                std::span<float> full) {
  const size_t members = peers_.size();
  if (widths.size() != members) throw std::invalid_argument("all_gather needs one width per member");
  size_t row_width = 0;
  for (const int w : widths) row_width += static_cast<size_t>(w);
  if (mine.size() != rows * static_cast<size_t>(widths[static_cast<size_t>(member_)]) ||
      full.size() != rows * row_width) {
    throw std::invalid_argument("all_gather's rows do not match the widths");
  }
  const FrameHeader header{calls_, rows, static_cast<uint64_t>(widths[static_cast<size_t>(member_)])};
  sent_.resize(sizeof header + mine.size_bytes());
  std::memcpy(sent_.data(), &header, sizeof header);
  std::memcpy(sent_.data() + sizeof header, mine.data(), mine.size_bytes());
  std::vector<size_t> sent_bytes(members, 0), received_bytes(members, 0);
  for (size_t m = 0; m < members; ++m) {
    received_[m].resize(m == static_cast<size_t>(member_)
                            ? 0
                            : sizeof(FrameHeader) + rows * static_cast<size_t>(widths[m]) * sizeof(float));
  }
  // Sends and receives as the sockets allow, until every frame is out and every peer's is in:
  // a peer a call ahead has its next frame wait in the socket, read by the next call.
  std::vector<pollfd> polled;
  std::vector<size_t> polled_member;
  for (;;) {
    polled.clear();
    polled_member.clear();
    for (size_t m = 0; m < members; ++m) {
      if (m == static_cast<size_t>(member_)) continue;
      const short events = static_cast<short>((sent_bytes[m] < sent_.size() ? POLLOUT : 0) |
                                              (received_bytes[m] < received_[m].size() ? POLLIN : 0));
      if (events == 0) continue;
      polled.push_back({peers_[m], events, 0});
      polled_member.push_back(m);
    }
    if (polled.empty()) break;
    if (::poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    }
    for (size_t i = 0; i < polled.size(); ++i) {
      const size_t m = polled_member[i];
      const short ready = polled[i].revents;
      if ((ready & (POLLOUT | POLLERR)) != 0 && sent_bytes[m] < sent_.size()) {
        const ssize_t n = ::send(peers_[m], sent_.data() + sent_bytes[m], sent_.size() - sent_bytes[m],
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          throw member_error(m, std::string("send: ") + std::strerror(errno));
        }
        if (n > 0) sent_bytes[m] += static_cast<size_t>(n);
      }
      if ((ready & (POLLIN | POLLHUP | POLLERR)) != 0 && received_bytes[m] < received_[m].size()) {
        const ssize_t n = ::recv(peers_[m], received_[m].data() + received_bytes[m],
                                 received_[m].size() - received_bytes[m], MSG_DONTWAIT);
        if (n == 0) throw member_error(m, "closed its connection");
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          throw member_error(m, std::string("recv: ") + std::strerror(errno));
        }
        if (n > 0) received_bytes[m] += static_cast<size_t>(n);
      }
    }
  }
  size_t column = 0;
  for (size_t m = 0; m < members; ++m) {
    const size_t width = static_cast<size_t>(widths[m]);
    const auto* part = reinterpret_cast<const std::byte*>(mine.data());
    if (m != static_cast<size_t>(member_)) {
      FrameHeader theirs;
      std::memcpy(&theirs, received_[m].data(), sizeof theirs);
      if (theirs.call != calls_ || theirs.rows != rows || theirs.width != width) {
        throw member_error(m, "sent call " + std::to_string(theirs.call) + " of " + std::to_string(theirs.rows) +
                                  " x " + std::to_string(theirs.width) + ", not call " + std::to_string(calls_) +
                                  " of " + std::to_string(rows) + " x " + std::to_string(width));
      }
      part = received_[m].data() + sizeof theirs;
    }
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(full.data() + r * row_width + column, part + r * width * sizeof(float), width * sizeof(float));
    }
    column += width;
  }
  ++calls_;
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
