// The socket exchange's all_gather on its own: members on threads, connected by Unix socket
// pairs or TCP over the loopback interface, with parts far larger than a socket's buffer and
// of widths that differ. (Groups of
// models over it: tests/model/tensor_parallel_test.cpp.)
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

#include "parallel/socket_exchange.h"
#include "gathers.h"

namespace strata::parallel {
namespace {

// Four members of widths 700, 1, 0 and 333 gather over `mesh`'s sockets: 3 calls of 500 rows:
// 1.4 MB from member 0, beyond what a socket holds while nobody reads; one of no rows.
void expect_gathers_in_member_order(const std::vector<std::vector<int>>& mesh) {
  std::vector<std::unique_ptr<SocketExchange>> exchanges;
  for (int m = 0; m < 4; ++m) exchanges.push_back(std::make_unique<SocketExchange>(m, mesh[m]));
  expect_gathers_in_member_order(exchanges, {700, 1, 0, 333}, {500, 0, 3});
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

// The calling thread's voluntary context switches so far: each sleep in poll is one (a yield
// of a thread that stays runnable is not).
long voluntary_switches() {
  rusage usage{};
  EXPECT_EQ(::getrusage(RUSAGE_THREAD, &usage), 0);
  return usage.ru_nvcsw;
}

// Member 1 sends its part 50 ms late: member 0 gathers it without sleeping when it may wait
// busily for that long, and sleeps when it may not.
TEST(SocketExchange, WaitsBusilyBeforeItSleeps) {
  for (const auto busy_wait : {std::chrono::microseconds(10'000'000), std::chrono::microseconds(0)}) {
    auto mesh = socket_pair_mesh(2);
    SocketExchange waiting(0, mesh[0], kDefaultSilenceLimit, busy_wait);
    SocketExchange late(1, mesh[1]);
    const std::vector<int> widths{1, 1};
    std::thread peer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const std::vector<float> mine{2.0f};
      std::vector<float> full(2);
      late.all_gather(mine, widths, 1, full);
    });
    const std::vector<float> mine{1.0f};
    std::vector<float> full(2);
    const long before = voluntary_switches();
    waiting.all_gather(mine, widths, 1, full);
    const long slept = voluntary_switches() - before;
    peer.join();
    EXPECT_EQ(full, (std::vector<float>{1.0f, 2.0f}));
    if (busy_wait.count() > 0) {
      EXPECT_EQ(slept, 0) << "slept while it could wait busily";
    } else {
      EXPECT_GE(slept, 1) << "waited 50 ms without sleeping";
    }
  }
}

// A waiting gather warms what its caller reads next front to back, region by region (an empty
// one skipped), in pieces of at most kPiece bytes, and stops once kMostWarmed bytes are; and
// not before the time it is given.
TEST(CacheWarming, WarmsTheRegionsInOrderInPiecesUntilItsLimit) {
  const std::vector<std::byte> small(40 << 10), tiny(5), large(10 << 20);
  const std::vector<std::span<const std::byte>> regions{small, {}, tiny, large};
  std::vector<std::span<const std::byte>> expected;
  size_t total = 0;
  for (const std::span<const std::byte> region : regions) {
    for (size_t at = 0; at < region.size() && total < CacheWarming::kMostWarmed;) {
      const size_t size = std::min(region.size() - at, CacheWarming::kPiece);
      expected.push_back(region.subspan(at, size));
      at += size;
      total += size;
    }
  }
  CacheWarming warming(regions, {});
  std::vector<std::span<const std::byte>> pieces;
  for (std::span<const std::byte> piece = warming.warm_next(); !piece.empty(); piece = warming.warm_next()) {
    ASSERT_LE(pieces.size(), expected.size());
    pieces.push_back(piece);
  }
  ASSERT_EQ(pieces.size(), expected.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].data(), expected[i].data()) << "piece " << i;
    EXPECT_EQ(pieces[i].size(), expected[i].size()) << "piece " << i;
  }
  EXPECT_GE(total, CacheWarming::kMostWarmed);
  EXPECT_LT(total - expected.back().size(), CacheWarming::kMostWarmed);
  EXPECT_LT(expected.back().data(), large.data() + large.size() - CacheWarming::kPiece) << "warmed all";
  EXPECT_TRUE(CacheWarming({}, {}).warm_next().empty());
  const auto later = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  CacheWarming waiting(regions, later);
  EXPECT_TRUE(waiting.warm_next().empty()) << "warmed before its time";
  while (std::chrono::steady_clock::now() < later) std::this_thread::yield();
  EXPECT_EQ(waiting.warm_next().data(), small.data());
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
    EXPECT_STREQ(e.what(), "tensor-parallel member 1: sent call 0 of 2 x 12 bytes, not call 0 of 1 x 12 bytes");
  }
  first.reset();
  other.join();
  // Closed with member 1's second row unread: a reset rather than an end, on Linux.
  EXPECT_EQ(second_error.rfind("tensor-parallel member 0: ", 0), 0u) << second_error;
}

// A member stays silent: the other's gather gives up on it once the limit has passed.
TEST(SocketExchange, NamesAMemberSilentForLongerThanTheLimit) {
  auto mesh = socket_pair_mesh(2);
  SocketExchange exchange(0, mesh[0], std::chrono::milliseconds(200));
  SocketExchange silent(1, mesh[1]);
  std::vector<float> full(2);
  const auto start = std::chrono::steady_clock::now();
  try {
    exchange.all_gather(std::vector<float>{1.0f}, std::vector<int>{1, 1}, 1, full);
    FAIL() << "gathered";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tensor-parallel member 1: moved no bytes for ", 0), 0u) << e.what();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_LT(waited, std::chrono::seconds(5));
}

// Members 0 and 1 gather while member 2 stays silent; abort() on member 1 from another thread
// ends its gather, and every later one at once, and member 0's, which names member 1.
TEST(SocketExchange, AbortEndsTheWaitingGathers) {
  auto mesh = socket_pair_mesh(3);
  std::vector<std::unique_ptr<SocketExchange>> exchanges;
  for (int m = 0; m < 3; ++m) exchanges.push_back(std::make_unique<SocketExchange>(m, mesh[m]));
  const std::vector<int> widths{1, 1, 1};
  std::string other_error;
  std::thread other([&] {
    std::vector<float> full(3);
    try {
      exchanges[0]->all_gather(std::vector<float>{1.0f}, widths, 1, full);
    } catch (const std::runtime_error& e) {
      other_error = e.what();
    }
  });
  std::thread aborting([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    exchanges[1]->abort();
  });
  std::vector<float> full(3);
  const auto start = std::chrono::steady_clock::now();
  try {
    exchanges[1]->all_gather(std::vector<float>{1.0f}, widths, 1, full);
    ADD_FAILURE() << "gathered";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "tensor-parallel member 1: aborted");
  }
  aborting.join();
  other.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(other_error.rfind("tensor-parallel member 1: ", 0), 0u) << other_error;
  EXPECT_THROW(exchanges[1]->all_gather(std::vector<float>{1.0f}, widths, 1, full), std::runtime_error);
}

}  // namespace
}  // namespace strata::parallel
