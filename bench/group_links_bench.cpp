// The latency of one small all_gather between 2 members on threads of one process: over TLS on
// the loopback interface through GroupLinks, over plain TCP on it, and over a Unix socket pair
// (parallel::SocketExchange's plaintext). Each call of member 0 timed; prints the median and
// the 90th percentile of `calls` calls after 200 unmeasured ones, each member's part `floats`
// floats (one row).
//   group_links_bench [calls] [floats]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel/group_links.h"
#include "parallel/socket_exchange.h"
#include "rpc/tls.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;
using Pair = std::vector<std::unique_ptr<parallel::SocketExchange>>;

Pair unix_pair() {
  Pair pair;
  for (const std::vector<int>& peers : parallel::socket_pair_mesh(2)) {
    pair.push_back(std::make_unique<parallel::SocketExchange>(static_cast<int>(pair.size()), peers));
  }
  return pair;
}

Pair tcp_pair() {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const int dialer = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      ::connect(dialer, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    throw std::runtime_error("a TCP connection on the loopback interface");
  }
  const int accepted = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  Pair pair;
  pair.push_back(std::make_unique<parallel::SocketExchange>(0, std::vector<int>{-1, accepted}));
  pair.push_back(std::make_unique<parallel::SocketExchange>(1, std::vector<int>{dialer, -1}));
  return pair;
}

struct TlsNodes {
  std::unique_ptr<parallel::GroupLinks> nodes[2];
  Pair pair;
};

parallel::LinkCredentials credentials_of(const rpc::LinkSecurity& security) {
  return {security.authority_pem(), security.certificate_pem(), security.private_key_pem()};
}

std::unique_ptr<TlsNodes> tls_pair() {
  auto tls = std::make_unique<TlsNodes>();
  for (auto& node : tls->nodes) {
    node = std::make_unique<parallel::GroupLinks>("127.0.0.1", 0, credentials_of(rpc::LinkSecurity("bench secret")));
  }
  const std::vector<std::string> addresses{"127.0.0.1:" + std::to_string(tls->nodes[0]->port()),
                                           "127.0.0.1:" + std::to_string(tls->nodes[1]->port())};
  tls->pair.resize(2);
  std::thread other([&] { tls->pair[1] = tls->nodes[1]->join("bench", 1, addresses, std::chrono::seconds(10)); });
  tls->pair[0] = tls->nodes[0]->join("bench", 0, addresses, std::chrono::seconds(10));
  other.join();
  return tls;
}

// Member 0's time of each of `calls` gathers, in microseconds, sorted.
std::vector<double> gather_times(const Pair& pair, int calls, int floats) {
  constexpr int kWarmUp = 200;
  const std::vector<int> widths{floats, floats};
  std::thread other([&] {
    const std::vector<float> mine(static_cast<size_t>(floats), 1.0f);
    std::vector<float> full(2 * static_cast<size_t>(floats));
    for (int call = 0; call < kWarmUp + calls; ++call) pair[1]->all_gather(mine, widths, 1, full);
  });
  const std::vector<float> mine(static_cast<size_t>(floats), 0.0f);
  std::vector<float> full(2 * static_cast<size_t>(floats));
  std::vector<double> times;
  for (int call = 0; call < kWarmUp + calls; ++call) {
    const Clock::time_point start = Clock::now();
    pair[0]->all_gather(mine, widths, 1, full);
    if (call >= kWarmUp) times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  other.join();
  std::sort(times.begin(), times.end());
  return times;
}

void report(const char* transport, const std::vector<double>& times) {
  std::printf("%-22s median %7.1f us, p90 %7.1f us\n", transport, times[times.size() / 2], times[times.size() * 9 / 10]);
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int floats = argc > 2 ? std::atoi(argv[2]) : 2048;
  std::printf("2 members, %d floats each, %d calls\n", floats, calls);
  report("Unix socket pair", gather_times(unix_pair(), calls, floats));
  report("TCP loopback", gather_times(tcp_pair(), calls, floats));
  const auto tls = tls_pair();
  report("TLS 1.3 loopback", gather_times(tls->pair, calls, floats));
  return 0;
}
