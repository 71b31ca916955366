// Tells whether the client of an HTTP request is still connected, for a handler that waits
// before it writes anything (a non-streaming completion): a peek at its socket that reads 0
// bytes means the client closed its end.
#pragma once

namespace strata::api {

class ClientWatch {
 public:
  explicit ClientWatch(int socket) : socket_(socket) {}

  // True once the client has closed the connection or it failed; false while it is open.
  bool gone() const;

 private:
  int socket_;
};

}  // namespace strata::api
