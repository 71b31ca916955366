// A tensor-parallel group's exchange (model/exchange.h) over stream sockets, between processes
// or machines: each member connected to every other one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/exchange.h"

namespace strata::parallel {

// Member `member` of a group whose members are connected pairwise by stream sockets (TCP or
// Unix): peers[j] is its socket to member j, -1 at its own index; it owns and closes them.
// all_gather sends this member's part to every other member as one frame (the call's number,
// the rows and the width, then the floats in the host's byte order: a group's machines share an
// architecture) and reads theirs, polling all sockets at once so that large parts cannot block
// each other's sends. Throws std::runtime_error naming the member for a lost connection or a
// frame that is not the call's.
class SocketExchange final : public model::Exchange {
 public:
  SocketExchange(int member, std::vector<int> peers);
  ~SocketExchange() override;
  SocketExchange(const SocketExchange&) = delete;
  SocketExchange& operator=(const SocketExchange&) = delete;

  int member() const override { return member_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  void all_gather(std::span<const float> mine, std::span<const int> widths, size_t rows,
                  std::span<float> full) override;

 private:
  const int member_;
  std::vector<int> peers_;
  uint64_t calls_ = 0;  // all_gather calls so far: the number the next frame carries
  std::vector<std::byte> sent_;
  std::vector<std::vector<std::byte>> received_;  // per member, its frame of the current call
};

// `members` members' sockets, connected pairwise by Unix socket pairs (tests, benchmarks): the
// peers of each member, for SocketExchange.
std::vector<std::vector<int>> socket_pair_mesh(int members);

}  // namespace strata::parallel
