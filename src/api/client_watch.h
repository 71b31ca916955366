// Tells whether the client of an HTTP request is still connected, for a handler that waits
// before it writes anything (a non-streaming completion). cpp-httplib 0.11 shows a handler
// neither its socket nor a closed connection, so the socket is found among this process's
// open files by the request's two addresses, and a peek at it tells: reading 0 bytes means
// the client closed its end. Linux only (/proc/self/fd); elsewhere the client never seems gone.
#pragma once

#include <string>

namespace strata::api {

class ClientWatch {
 public:
  ClientWatch(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port);

  // True once the client has closed the connection or it failed; false while it is open,
  // and always when its socket was not found.
  bool gone() const;

 private:
  int socket_ = -1;
};

}  // namespace strata::api
