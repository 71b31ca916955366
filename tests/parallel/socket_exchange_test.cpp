// The socket exchange's all_gather on its own: members on threads, connected by Unix socket
// pairs or TCP over the loopback interface, with parts far larger than a socket's buffer and
// of widths that differ. (Groups of
// models over it: tests/model/tensor_parallel_test.cpp.)
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel/socket_exchange.h"

namespace strata::parallel {
namespace {

// Member m's value for row r, column c of its part.
float value(int m, size_t r, size_t c) { return static_cast<float>(m * 1000000 + r * 1000 + c) + 0.5f; }

// Four members of widths 700, 1, 0 and 333 gather over `mesh`'s sockets: every member has
// every row whole, in member order.
void expect_gathers_in_member_order(const std::vector<std::vector<int>>& mesh) {
  const std::vector<int> widths{700, 1, 0, 333};
  const int members = static_cast<int>(widths.size());
  std::vector<std::unique_ptr<SocketExchange>> exchanges;
  for (int m = 0; m < members; ++m) exchanges.push_back(std::make_unique<SocketExchange>(m, mesh[m]));
  size_t row_width = 0;
  for (const int w : widths) row_width += static_cast<size_t>(w);
  // 3 calls of 500 rows: 1.4 MB from member 0, beyond what a socket holds while nobody reads;
  // one of no rows.
  const std::vector<size_t> calls{500, 0, 3};
  std::vector<std::vector<std::vector<float>>> gathered(static_cast<size_t>(members));
  std::vector<std::thread> threads;
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] {
      for (const size_t rows : calls) {
        std::vector<float> mine;
        for (size_t r = 0; r < rows; ++r) {
          for (size_t c = 0; c < static_cast<size_t>(widths[m]); ++c) mine.push_back(value(m, r, c));
        }
        std::vector<float> full(rows * row_width);
        exchanges[m]->all_gather(mine, widths, rows, full);
        gathered[m].push_back(std::move(full));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t call = 0; call < calls.size(); ++call) {
    std::vector<float> expected;
    for (size_t r = 0; r < calls[call]; ++r) {
      for (int m = 0; m < members; ++m) {
        for (size_t c = 0; c < static_cast<size_t>(widths[m]); ++c) expected.push_back(value(m, r, c));
      }
    }
    for (int m = 0; m < members; ++m) EXPECT_EQ(gathered[m][call], expected) << "call " << call << ", member " << m;
  }
}

// `members` members' sockets connected pairwise over TCP on the loopback interface.
std::vector<std::vector<int>> tcp_loopback_mesh(int members) {
  std::vector<std::vector<int>> peers(static_cast<size_t>(members), std::vector<int>(static_cast<size_t>(members), -1));
  for (size_t a = 0; a < peers.size(); ++a) {
    for (size_t b = a + 1; b < peers.size(); ++b) {
      const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t length = sizeof address;
      EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
      EXPECT_EQ(::listen(listener, 1), 0);
      EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
      peers[b][a] = ::socket(AF_INET, SOCK_STREAM, 0);
      EXPECT_EQ(::connect(peers[b][a], reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
      peers[a][b] = ::accept(listener, nullptr, nullptr);
      ::close(listener);
    }
  }
  return peers;
}

TEST(SocketExchange, GathersEveryMembersRowsInMemberOrderOverUnixSockets) {
  expect_gathers_in_member_order(socket_pair_mesh(4));
}

TEST(SocketExchange, GathersEveryMembersRowsInMemberOrderOverTcp) { expect_gathers_in_member_order(tcp_loopback_mesh(4)); }

TEST(SocketExchange, NamesAMemberThatClosedItsConnection) {
  auto mesh = socket_pair_mesh(2);
  SocketExchange exchange(0, mesh[0]);
  ::close(mesh[1][0]);
  const std::vector<int> widths{1, 1};
  const std::vector<float> mine{1.0f};
  std::vector<float> full(2);
  try {
    exchange.all_gather(mine, widths, 1, full);
    FAIL() << "gathered";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    // The send may fail first (a broken pipe), or the read see the end.
    EXPECT_EQ(what.rfind("tensor-parallel member 1: ", 0), 0u) << what;
  }
}

// Member 1 sends two rows where member 0 gathers one: member 0 names it; member 1, left
// waiting for the rest of member 0's frame, hears of it when member 0 is gone.
TEST(SocketExchange, RefusesAFrameOfAnotherShape) {
  auto mesh = socket_pair_mesh(2);
  auto first = std::make_unique<SocketExchange>(0, mesh[0]);
  SocketExchange second(1, mesh[1]);
  const std::vector<int> widths{1, 3};
  std::string second_error;
  std::thread other([&] {
    std::vector<float> full(8);
    try {
      second.all_gather(std::vector<float>(6, 1.0f), widths, 2, full);
    } catch (const std::runtime_error& e) {
      second_error = e.what();
    }
  });
  std::vector<float> full(4);
  try {
    first->all_gather(std::vector<float>{1.0f}, widths, 1, full);
    ADD_FAILURE() << "gathered";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "tensor-parallel member 1: sent call 0 of 2 x 3, not call 0 of 1 x 3");
  }
  first.reset();
  other.join();
  // Closed with member 1's second row unread: a reset rather than an end, on Linux.
  EXPECT_EQ(second_error.rfind("tensor-parallel member 0: ", 0), 0u) << second_error;
}

}  // namespace
}  // namespace strata::parallel
