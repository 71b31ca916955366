// How the members of a tensor-parallel group (tensor_share.h) put together the rows each
// computed a share of.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

namespace strata::model {

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int member() const = 0;  // this member's index, 0..size() - 1
  virtual int size() const = 0;
  // Every member calls this with the same `widths` (each member's part of a row, in bytes) and
  // `rows`, in the same sequence of calls. `mine` is this member's parts of the rows, rows x
  // widths[member()]; `full` receives the rows whole, rows x (sum of widths), each row the
  // members' parts in member order.
  virtual void all_gather_bytes(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                                std::span<std::byte> full) = 0;
  // all_gather_bytes of float rows, widths in floats.
  void all_gather(std::span<const float> mine, std::span<const int> widths, size_t rows, std::span<float> full);
  // What this member reads first once its next gather returns (the next matmuls' weights), in
  // the order it reads them; the regions must stay valid until then. An exchange that waits in
  // that gather for the others may bring them into the caches meanwhile, so that the wait
  // shortens the work after it. A hint for the next gather only; this one ignores it.
  virtual void read_next(std::span<const std::span<const std::byte>> /*regions*/) {}
  // From any thread: a gather of this member that waits, and every later one, throws at once,
  // and so do the others' (they cannot finish without it). For a member whose group cannot
  // finish its step because another member is lost.
  virtual void abort() = 0;

 protected:
  // The bytes of a whole row, once `mine` and `full` are checked to be the rows x widths of this
  // member and of all (std::invalid_argument otherwise): every all_gather_bytes' first step.
  size_t checked_row_width(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                           std::span<const std::byte> full) const;
};

// The members of a group as threads of one process (tests, benchmarks): member(i) is the
// Exchange of the thread that runs member i. A member blocks in all_gather until every member
// has called it, so each must run on a thread of its own; a member's abort() ends every
// member's waiting, and every later, gather with an error.
class LocalGroup {
 public:
  explicit LocalGroup(int members);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  Exchange& member(int index);

 private:
  class Member;
  struct State;  // the members and the barrier they meet at
  std::unique_ptr<State> state_;
};

}  // namespace strata::model
