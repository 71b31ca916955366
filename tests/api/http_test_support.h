// Helpers shared by the HTTP tests.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <string_view>

namespace strata::api::testing {

// POSTs a streaming `body` to `path`, reads `chunks` pieces of the reply and then closes the
// connection, as a client that goes away mid-stream does. Returns how many pieces arrived.
inline int post_and_hang_up(httplib::Client& client, const std::string& path, const std::string& body,
                            int chunks) {
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body;
  request.set_header("Content-Type", "application/json");
  int received = 0;
  request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++received < chunks; };
  client.send(request);
  return received;
}

}  // namespace strata::api::testing

namespace strata::api::testing {

// A client that writes raw bytes to 127.0.0.1, for what an HTTP library would not send: half a
// header, bytes one at a time, floods, pipelined requests.
class RawConnection {
 public:
  explicit RawConnection(int port) : socket_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
#if defined(__APPLE__)  // no MSG_NOSIGNAL there: the socket itself is told not to raise SIGPIPE
    const int on = 1;
    if (socket_ >= 0) ::setsockopt(socket_, SOL_SOCKET, SO_NOSIGPIPE, &on, sizeof on);
#endif
    connected_ = socket_ >= 0 &&
                 ::connect(socket_, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  }
  ~RawConnection() {
    if (socket_ >= 0) ::close(socket_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }

  // False once the server has closed the connection.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
#if defined(MSG_NOSIGNAL)
      const ssize_t sent = ::send(socket_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
#else
      const ssize_t sent = ::send(socket_, bytes.data(), bytes.size(), 0);
#endif
      if (sent <= 0) return false;
      bytes.remove_prefix(size_t(sent));
    }
    return true;
  }

  // Everything the server sends until it closes the connection or `timeout` passes.
  std::string read_until_closed(std::chrono::milliseconds timeout) {
    std::string received;
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!closed_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      pollfd poll_socket{socket_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&poll_socket, 1, int(left.count())) <= 0) break;
      char buffer[4096];
      const ssize_t got = ::recv(socket_, buffer, sizeof buffer, 0);
      if (got <= 0) closed_ = true;
      else received.append(buffer, size_t(got));
    }
    return received;
  }

  // Whether the server closed the connection (reading and dropping what it sent) within `timeout`.
  bool closed_within(std::chrono::milliseconds timeout) {
    read_until_closed(timeout);
    return closed_;
  }

 private:
  int socket_;
  bool connected_ = false;
  bool closed_ = false;
};

// The status code of a raw HTTP response, or 0.
inline int raw_status(const std::string& response) {
  return response.starts_with("HTTP/1.1 ") && response.size() >= 12 ? std::stoi(response.substr(9, 3))
                                                                     : 0;
}

}  // namespace strata::api::testing
