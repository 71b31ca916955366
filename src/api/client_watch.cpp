#include "api/client_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace strata::api {
namespace {

struct Endpoint {
  std::string addr;
  int port = -1;
  bool operator==(const Endpoint&) const = default;
};

Endpoint endpoint_of(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
    return {text, ntohs(in.sin_port)};
  }
  if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
    return {text, ntohs(in6.sin6_port)};
  }
  return {};
}

bool has_endpoints(int fd, const Endpoint& local, const Endpoint& remote) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 || !(endpoint_of(address) == remote)) {
    return false;
  }
  length = sizeof address;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0 && endpoint_of(address) == local;
}

}  // namespace

ClientWatch::ClientWatch(const std::string& local_addr, int local_port, const std::string& remote_addr,
                         int remote_port) {
  const Endpoint local{local_addr, local_port}, remote{remote_addr, remote_port};
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    char* end = nullptr;
    const std::string name = entry.path().filename().string();
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end != name.c_str() && *end == '\0' && has_endpoints(static_cast<int>(fd), local, remote)) {
      socket_ = static_cast<int>(fd);
      return;
    }
  }
}

bool ClientWatch::gone() const {
  if (socket_ < 0) return false;
  char byte;
  const ssize_t read = recv(socket_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (read > 0) return false;  // more from the client, e.g. its next request
  if (read == 0) return true;
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace strata::api
