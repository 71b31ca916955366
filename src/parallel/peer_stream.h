// A member's connection to another member of its tensor-parallel group, as SocketExchange
// drives it: plain sockets, or TLS over them (parallel/group_links.h).
#pragma once

#include <poll.h>

#include <cstddef>
#include <span>

namespace strata::parallel {

// Every call returns at once, having moved what it could: SocketExchange polls all of a
// member's streams together, so that no send can wait on a peer that is itself sending.
class PeerStream {
 public:
  // What the stream waits for before it can move more (TLS may need to read to write).
  enum class Waits { Nothing, Readable, Writable };
  // `bytes` moved, or, with none, what to poll the socket for.
  struct Moved {
    size_t bytes = 0;
    Waits waits = Waits::Nothing;
  };

  virtual ~PeerStream() = default;
  virtual int socket() const = 0;
  // Both throw std::runtime_error saying why the connection is lost ("closed its connection").
  virtual Moved send(std::span<const std::byte> bytes) = 0;
  virtual Moved receive(std::span<std::byte> bytes) = 0;
};

// What to poll a stream's socket for while it `waits`.
inline short poll_events(PeerStream::Waits waits) {
  switch (waits) {
    case PeerStream::Waits::Readable:
      return POLLIN;
    case PeerStream::Waits::Writable:
      return POLLOUT;
    case PeerStream::Waits::Nothing:
      break;
  }
  return 0;
}

}  // namespace strata::parallel
