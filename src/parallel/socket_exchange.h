// A tensor-parallel group's exchange (model/exchange.h) over stream sockets, between processes
// or machines: each member connected to every other one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "model/exchange.h"
#include "parallel/peer_stream.h"

namespace strata::parallel {

// How long all_gather waits on a peer that moves no bytes before giving up on it: long enough
// for a member that is still computing its part on a slow machine.
inline constexpr std::chrono::milliseconds kDefaultSilenceLimit{60'000};

// How long all_gather keeps asking its streams for bytes, yielding the core between tries,
// before it sleeps in poll. A member that sleeps is woken by the kernel when its peer's frame
// arrives, which costs tens of microseconds on a virtual machine whose idle cores halt, and may
// wake it on its peer's core: on a 2-core VM two members so placed shared one core for whole
// streams. A decode step's members reach each gather within tens of microseconds of each other
// (docs/PERFORMANCE.md), so most of its gathers wait less than this.
inline constexpr std::chrono::microseconds kDefaultBusyWait{400};

// What a gather's caller reads next, prefetched into the caches a piece at a time, each piece
// between two polls of a wait, so that a frame that arrives is taken at once. Only from
// `from` (a gather's start and kWarmAfter): a shorter wait is mostly for a peer still
// computing its part, which warming would slow where the two share a machine's memory (as in
// one process or in namespaces; docs/PERFORMANCE.md); a longer one is mostly the link's. No
// more than kMostWarmed in all: a larger part would push its own first bytes out of the
// caches before the caller reads them.
class CacheWarming {
 public:
  static constexpr size_t kPiece = 16 << 10;
  static constexpr size_t kMostWarmed = 8 << 20;
  static constexpr std::chrono::microseconds kWarmAfter{50};
  CacheWarming(std::span<const std::span<const std::byte>> regions, std::chrono::steady_clock::time_point from)
      : regions_(regions), from_(from) {}
  // Prefetches the next piece, of kPiece bytes or a region's rest, and returns it; nothing
  // before `from`, and once every region or kMostWarmed bytes are.
  std::span<const std::byte> warm_next();

 private:
  static constexpr size_t kCacheLine = 64;
  const std::span<const std::span<const std::byte>> regions_;
  const std::chrono::steady_clock::time_point from_;
  size_t region_ = 0;
  size_t offset_ = 0;
  size_t warmed_ = 0;
};

// Member `member` of a group whose members are connected pairwise: peers[j] is its stream to
// member j, null at its own index.
// all_gather_bytes sends this member's part to every other member as one frame (the call's
// number, the rows and the width in bytes, then the bytes, whose floats are in the host's byte
// order: a group's machines share an architecture) and reads theirs, polling all streams at
// once so that large parts cannot block each other's sends. Throws std::runtime_error naming the member for a lost connection, a
// frame that is not the call's, or a peer silent for longer than `silence_limit`; and, once
// abort() was called, at once on every call.
class SocketExchange final : public model::Exchange {
 public:
  // `test_send_delay`, for benchmarks only: each frame is sent this much later, as over links of
  // that one-way delay (where the network cannot be made to delay packets).
  SocketExchange(int member, std::vector<std::unique_ptr<PeerStream>> peers,
                 std::chrono::milliseconds silence_limit = kDefaultSilenceLimit,
                 std::chrono::microseconds test_send_delay = {},
                 std::chrono::microseconds busy_wait = kDefaultBusyWait);
  // Plain stream sockets (TCP or Unix), -1 at its own index; it owns and closes them.
  SocketExchange(int member, const std::vector<int>& peers,
                 std::chrono::milliseconds silence_limit = kDefaultSilenceLimit,
                 std::chrono::microseconds busy_wait = kDefaultBusyWait);
  ~SocketExchange() override;
  SocketExchange(const SocketExchange&) = delete;
  SocketExchange& operator=(const SocketExchange&) = delete;

  int member() const override { return member_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  void all_gather_bytes(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                        std::span<std::byte> full) override;
  // Prefetches the regions into the caches while a gather waits for its peers' frames (or holds
  // back its own, test_send_delay), up to a few MiB.
  void read_next(std::span<const std::span<const std::byte>> regions) override;
  // From any thread: breaks the group, for a member whose step failed elsewhere. A gather
  // waiting now throws promptly, and so does every later one; its connections are shut down,
  // so the other members' gathers end too, naming this member.
  void abort() override;

 private:
  std::runtime_error aborted_error() const;
  // Moves bytes on every stream until this call's frames are all out and in, warming what
  // the caller reads next while it waits.
  void transfer(CacheWarming& warming);

  const int member_;
  std::vector<std::unique_ptr<PeerStream>> peers_;
  const std::chrono::milliseconds silence_limit_;
  const std::chrono::microseconds test_send_delay_;
  const std::chrono::microseconds busy_wait_;
  const int abort_signal_;  // an eventfd, readable once abort() was called
  std::atomic<bool> aborted_ = false;
  uint64_t calls_ = 0;  // all_gather calls so far: the number the next frame carries
  std::vector<std::byte> sent_;
  std::vector<std::vector<std::byte>> received_;  // per member, its frame of the current call
  std::vector<std::span<const std::byte>> read_next_;  // for the next call
  std::vector<std::span<const std::byte>> warmed_;     // the current call's
};

// `members` members' sockets, connected pairwise by Unix socket pairs (tests, benchmarks): the
// peers of each member, for SocketExchange.
std::vector<std::vector<int>> socket_pair_mesh(int members);

}  // namespace strata::parallel
