#include "api/client_watch.h"

#include <sys/socket.h>

#include <cerrno>

namespace strata::api {

bool ClientWatch::gone() const {
  if (socket_ < 0) return false;
  char byte;
  const ssize_t peeked = ::recv(socket_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (peeked > 0) return false;  // a pipelined request waits there
  return peeked == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace strata::api
