// Groups joined through GroupLinks on the loopback interface, their members threads of the test
// (or a forked process), gathering over TLS; certificates from rpc::LinkSecurity, as nodes
// make them from the cluster secret.
#include "parallel/group_links.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gathers.h"
#include "parallel/tls_link.h"
#include "rpc/tls.h"

namespace strata::parallel {
namespace {

using std::chrono::milliseconds;
constexpr const char* kSecret = "group links test secret";

LinkCredentials credentials_of(const rpc::LinkSecurity& security) {
  return {security.authority_pem(), security.certificate_pem(), security.private_key_pem()};
}

// A node's links, its certificate its own, from `secret`.
std::unique_ptr<GroupLinks> node(const std::string& secret = kSecret, GroupLinkLimits limits = {}) {
  return std::make_unique<GroupLinks>("127.0.0.1", 0, credentials_of(rpc::LinkSecurity(secret)), limits);
}

std::vector<std::string> addresses_of(const std::vector<std::unique_ptr<GroupLinks>>& nodes) {
  std::vector<std::string> addresses;
  for (const auto& n : nodes) addresses.push_back("127.0.0.1:" + std::to_string(n->port()));
  return addresses;
}

// `links` joined as `member`, or null (and the test failed) when it could not be.
std::unique_ptr<SocketExchange> joined(GroupLinks& links, const std::string& group, int member,
                                       const std::vector<std::string>& addresses) {
  try {
    return links.join(group, member, addresses, milliseconds(10'000));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "member " << member << " of '" << group << "': " << e.what();
    return nullptr;
  }
}

// Every node joins `group` as the member of its index, on a thread of its own, member `late`
// (if any) 200 ms after the others, so that connections to it arrive before its join.
std::vector<std::unique_ptr<SocketExchange>> join_all(const std::vector<std::unique_ptr<GroupLinks>>& nodes,
                                                      const std::string& group, int late = -1) {
  const std::vector<std::string> addresses = addresses_of(nodes);
  std::vector<std::unique_ptr<SocketExchange>> exchanges(nodes.size());
  std::vector<std::thread> threads;
  for (int m = 0; m < static_cast<int>(nodes.size()); ++m) {
    threads.emplace_back([&, m] {
      if (m == late) std::this_thread::sleep_for(milliseconds(200));
      exchanges[m] = joined(*nodes[m], group, m, addresses);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& exchange : exchanges) {
    if (exchange == nullptr) throw std::runtime_error("the group was not joined");
  }
  return exchanges;
}

// 2000 rows of 1000 and 700 floats: 8 MB and 5.6 MB crossing at once, far more than the
// sockets hold while nobody reads; then a call of no rows and a small one.
TEST(GroupLinks, TwoMembersGatherLargePartsOverTls) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 2; ++m) nodes.push_back(node());
  const auto exchanges = join_all(nodes, "placement 1, layers 0-11");
  expect_gathers_in_member_order(exchanges, {1000, 700}, {2000, 0, 3});
}

TEST(GroupLinks, ThreeMembersGatherUnevenWidthsWithOneJoiningLate) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 3; ++m) nodes.push_back(node());
  const auto exchanges = join_all(nodes, "placement 2, layers 0-21", 0);
  expect_gathers_in_member_order(exchanges, {513, 1, 2048}, {700, 0, 1, 5});
}

// Two groups at once on the same nodes, with the members in other roles, each join on a thread
// of its own: each connection goes to its own group's join.
TEST(GroupLinks, KeepsTwoGroupsOnTheSameNodesApart) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 2; ++m) nodes.push_back(node());
  const std::vector<std::string> addresses = addresses_of(nodes);
  const std::vector<std::string> swapped{addresses[1], addresses[0]};
  std::vector<std::unique_ptr<SocketExchange>> first(2), second(2);
  std::vector<std::thread> joins;
  for (int n = 0; n < 2; ++n) {
    joins.emplace_back([&, n] { first[n] = joined(*nodes[n], "first", n, addresses); });
    joins.emplace_back([&, n] { second[1 - n] = joined(*nodes[n], "second", 1 - n, swapped); });
  }
  for (std::thread& t : joins) t.join();
  expect_gathers_in_member_order(first, {3, 4}, {10});
  expect_gathers_in_member_order(second, {5, 1}, {7});
}

// Member 1 dials before member 0's node listens (on a port known beforehand): it tries again
// until member 0 is there.
TEST(GroupLinks, DialsAgainUntilTheMemberListens) {
  const int port = node()->port();  // free again once that node is gone
  auto late = node();
  const std::vector<std::string> addresses{"127.0.0.1:" + std::to_string(port),
                                           "127.0.0.1:" + std::to_string(late->port())};
  std::unique_ptr<SocketExchange> dialer;
  std::thread dialling([&] { dialer = joined(*late, "late listener", 1, addresses); });
  std::this_thread::sleep_for(milliseconds(300));
  GroupLinks first("127.0.0.1", port, credentials_of(rpc::LinkSecurity(kSecret)));
  std::vector<std::unique_ptr<SocketExchange>> exchanges;
  exchanges.push_back(joined(first, "late listener", 0, addresses));
  dialling.join();
  exchanges.push_back(std::move(dialer));
  ASSERT_TRUE(exchanges[0] != nullptr && exchanges[1] != nullptr);
  expect_gathers_in_member_order(exchanges, {6, 2}, {3});
}

// Member 0 in a child process, member 1 here; the child's verdict is its exit status.
TEST(GroupLinks, JoinsMembersInOtherProcesses) {
  int port_pipe[2];
  ASSERT_EQ(::pipe(port_pipe), 0);
  const std::vector<int> widths{300, 200};
  const std::vector<size_t> calls{1000, 1};
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 1;
    try {
      auto links = node();
      const int port = links->port();
      if (::write(port_pipe[1], &port, sizeof port) != sizeof port) ::_exit(2);
      auto exchange = links->join("across processes", 0, {"unused:0", "unused:0"}, milliseconds(10'000));
      bool same = true;
      for (const size_t rows : calls) {
        std::vector<float> full(rows * 500);
        exchange->all_gather(part_of(0, widths[0], rows), widths, rows, full);
        same = same && full == rows_whole(widths, rows);
      }
      status = same ? 0 : 3;
    } catch (...) {
      status = 4;
    }
    ::_exit(status);
  }
  ::close(port_pipe[1]);
  int port = 0;
  pollfd readable{port_pipe[0], POLLIN, 0};
  ASSERT_EQ(::poll(&readable, 1, 10'000), 1);
  ASSERT_EQ(::read(port_pipe[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  ::close(port_pipe[0]);
  auto links = node();
  auto exchange = links->join("across processes", 1, {"127.0.0.1:" + std::to_string(port), "unused:0"},
                              milliseconds(10'000));
  for (const size_t rows : calls) {
    std::vector<float> full(rows * 500);
    exchange->all_gather(part_of(1, widths[1], rows), widths, rows, full);
    EXPECT_EQ(full, rows_whole(widths, rows));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A node whose certificate another secret's authority signed is refused in the handshake, as
// dialer and as listener: neither join gets a connection.
TEST(GroupLinks, RefusesANodeOfAnotherSecret) {
  for (const int stranger : {0, 1}) {
    std::vector<std::unique_ptr<GroupLinks>> nodes;
    for (int m = 0; m < 2; ++m) nodes.push_back(m == stranger ? node("another secret") : node());
    const std::vector<std::string> addresses = addresses_of(nodes);
    std::string listener_error, dialer_error;
    std::thread listening([&] {
      try {
        nodes[0]->join("refused", 0, addresses, milliseconds(1500));
      } catch (const std::runtime_error& e) {
        listener_error = e.what();
      }
    });
    try {
      nodes[1]->join("refused", 1, addresses, milliseconds(1500));
    } catch (const std::runtime_error& e) {
      dialer_error = e.what();
    }
    listening.join();
    EXPECT_EQ(listener_error.rfind("tensor-parallel group 'refused': member 1 did not connect to member 0 within "
                                   "1500 ms (the last connection refused: 127.0.0.1:",
                                   0),
              0u)
        << listener_error;
    EXPECT_EQ(dialer_error.rfind("tensor-parallel group 'refused': member 0 at " + addresses[0] +
                                     " could not be reached within 1500 ms: ",
                                 0),
              0u)
        << dialer_error;
    // Each end checks the other's certificate: the dialer's check fails first.
    EXPECT_NE(dialer_error.find("certificate verify failed"), std::string::npos)
        << dialer_error;
  }
}

TEST(GroupLinks, NamesAMemberThatClosesItsConnectionMidGather) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 2; ++m) nodes.push_back(node());
  auto exchanges = join_all(nodes, "closing");
  std::thread closing([&] {
    std::this_thread::sleep_for(milliseconds(100));
    exchanges[1].reset();
  });
  const std::vector<int> widths{1000, 1000};
  const size_t rows = 2000;  // 8 MB: member 0 is still sending when member 1 goes
  std::vector<float> full(rows * 2000);
  try {
    exchanges[0]->all_gather(part_of(0, 1000, rows), widths, rows, full);
    ADD_FAILURE() << "gathered";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tensor-parallel member 1: ", 0), 0u) << e.what();
  }
  closing.join();
}

TEST(GroupLinks, NamesASilentMember) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 2; ++m) nodes.push_back(node(kSecret, {.silence = milliseconds(300)}));
  const auto exchanges = join_all(nodes, "silent");
  std::vector<float> full(2);
  const auto start = std::chrono::steady_clock::now();
  try {
    exchanges[0]->all_gather(std::vector<float>{1.0f}, std::vector<int>{1, 1}, 1, full);
    FAIL() << "gathered";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tensor-parallel member 1: moved no bytes for ", 0), 0u) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Members 0 and 1 gather while member 2 stays silent; abort() on member 0 ends its gather and,
// its connections shut down, member 1's, which names member 0.
TEST(GroupLinks, AbortEndsTheWaitingGathers) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 3; ++m) nodes.push_back(node());
  const auto exchanges = join_all(nodes, "aborted");
  const std::vector<int> widths{1, 1, 1};
  std::string other_error;
  std::thread other([&] {
    std::vector<float> full(3);
    try {
      exchanges[1]->all_gather(std::vector<float>{1.0f}, widths, 1, full);
    } catch (const std::runtime_error& e) {
      other_error = e.what();
    }
  });
  std::thread aborting([&] {
    std::this_thread::sleep_for(milliseconds(100));
    exchanges[0]->abort();
  });
  std::vector<float> full(3);
  const auto start = std::chrono::steady_clock::now();
  try {
    exchanges[0]->all_gather(std::vector<float>{1.0f}, widths, 1, full);
    ADD_FAILURE() << "gathered";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "tensor-parallel member 0: aborted");
  }
  aborting.join();
  other.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(other_error, "tensor-parallel member 0: closed its connection");
}

TEST(GroupLinks, SaysWhyItCannotListen) {
  const auto taken = node();
  try {
    GroupLinks("127.0.0.1", taken->port(), credentials_of(rpc::LinkSecurity(kSecret)));
    FAIL() << "listened";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "group links cannot listen on 127.0.0.1:" + std::to_string(taken->port()) + ": Address already in use");
  }
}

TEST(GroupLinks, SaysWhichCredentialsItCannotRead) {
  const rpc::LinkSecurity security(kSecret);
  LinkCredentials credentials = credentials_of(security);
  credentials.private_key_pem = "not a key";
  try {
    GroupLinks("127.0.0.1", 0, credentials);
    FAIL() << "listened";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("group links: reading the node's private key (PEM): ", 0), 0u) << e.what();
  }
}

// A connection no join claims is dropped once its wait is over: the dialer, answered by the
// connection's end, tries again until its own time is up.
TEST(GroupLinks, DropsAConnectionNoJoinClaims) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  nodes.push_back(node(kSecret, {.unclaimed = milliseconds(200)}));
  nodes.push_back(node());
  try {
    nodes[1]->join("unclaimed", 1, addresses_of(nodes), milliseconds(1000));
    FAIL() << "joined";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("closed its connection"), std::string::npos) << e.what();
  }
}

// Strangers who connect and stay, one saying something that is not TLS, one saying nothing: the
// members' joins go on.
TEST(GroupLinks, StrangersDoNotHoldUpTheGroup) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 2; ++m) nodes.push_back(node());
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(nodes[0]->port()));
  int strangers[2];
  for (int& stranger : strangers) {
    stranger = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(stranger, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  }
  ASSERT_EQ(::send(strangers[0], "GET / HTTP/1.0\r\n", 16, MSG_NOSIGNAL), 16);
  const auto exchanges = join_all(nodes, "with strangers about");
  expect_gathers_in_member_order(exchanges, {2, 3}, {4});
  for (const int stranger : strangers) ::close(stranger);
}

// Each node measures its link to the other (the answers come from the other's service thread),
// and the group they then join gathers as before.
TEST(GroupLinks, MeasuresTheLinkToAnotherNode) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 2; ++m) nodes.push_back(node());
  const std::vector<std::string> addresses = addresses_of(nodes);
  for (int m = 0; m < 2; ++m) {
    const LinkMeasurement link = nodes[m]->measure(addresses[1 - m], milliseconds(10'000));
    // Loopback through TLS: tens of microseconds one way, hundreds of MB/s at the least.
    EXPECT_GT(link.latency_seconds, 0.0);
    EXPECT_LT(link.latency_seconds, 0.01);
    EXPECT_GT(link.bytes_per_second, 50e6);
  }
  const auto exchanges = join_all(nodes, "measured");
  expect_gathers_in_member_order(exchanges, {2, 3}, {4});
}

// Links given a test delay (as a network of that one-way delay would be) gather the same rows,
// each gather at least the delay later.
TEST(GroupLinks, ATestDelayHoldsEveryGatherBack) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  for (int m = 0; m < 2; ++m) nodes.push_back(node(kSecret, {.test_send_delay = std::chrono::microseconds(3000)}));
  const auto exchanges = join_all(nodes, "delayed");
  const auto start = std::chrono::steady_clock::now();
  expect_gathers_in_member_order(exchanges, {2, 3}, {1, 4, 2});
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(9));
}

TEST(GroupLinks, SaysWhyItCannotMeasureALink) {
  const auto links = node();
  const auto stranger = node("another secret");
  const std::string stranger_address = "127.0.0.1:" + std::to_string(stranger->port());
  int free_port;
  {
    const auto gone = node();
    free_port = gone->port();
  }
  const std::string nobody = "127.0.0.1:" + std::to_string(free_port);
  const auto error_of = [&](const std::string& address) {
    try {
      links->measure(address, milliseconds(2000));
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("measured");
  };
  std::string error = error_of(stranger_address);
  EXPECT_EQ(error.rfind("measuring the link to " + stranger_address + ": ", 0), 0u) << error;
  EXPECT_NE(error.find("certificate verify failed"), std::string::npos) << error;
  error = error_of(nobody);
  EXPECT_EQ(error, "measuring the link to " + nobody + ": connect: Connection refused");
  EXPECT_THROW(links->measure("no port", milliseconds(100)), std::invalid_argument);
}

// A prober that says more than a probe does is cut off, and one that stops answering is
// dropped when its time is up; the node's groups go on.
TEST(GroupLinks, DropsAProbeThatIsNotOne) {
  std::vector<std::unique_ptr<GroupLinks>> nodes;
  nodes.push_back(node(kSecret, {.introduction = milliseconds(300)}));
  nodes.push_back(node());
  rpc::LinkSecurity security(kSecret);
  TlsContext context(security.authority_pem(), security.certificate_pem(), security.private_key_pem());
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(nodes[0]->port()));
  const auto probe = [&](uint32_t length) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
    pollfd connected{fd, POLLOUT, 0};
    ::poll(&connected, 1, 2000);
    auto stream = std::make_unique<TlsStream>(context, fd, TlsRole::Dialer);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    finish_handshake(*stream, deadline);
    const uint32_t said[5] = {0x31505453, 0, 0, 0, length};
    send_all(*stream, std::as_bytes(std::span(said)), deadline);
    return stream;
  };
  const auto too_long = probe(64 << 20);
  const auto silent = probe(1000);  // and never the 1000 bytes
  std::byte answer{};
  const auto start = Clock::now();
  EXPECT_THROW(receive_all(*too_long, std::span(&answer, 1), start + std::chrono::seconds(5)), std::runtime_error);
  EXPECT_THROW(receive_all(*silent, std::span(&answer, 1), start + std::chrono::seconds(5)), std::runtime_error);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  const auto exchanges = join_all(nodes, "after bad probes");
  expect_gathers_in_member_order(exchanges, {2, 3}, {4});
}

}  // namespace
}  // namespace strata::parallel
