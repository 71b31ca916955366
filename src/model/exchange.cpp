#include "model/exchange.h"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::model {

// The members meet at a rendezvous that an abort breaks: a generation counts the calls all
// members have reached, and an aborted group lets every waiting, and every later, call go with
// an error.
struct LocalGroup::State {
  explicit State(int members) : size(members) {}
  void arrive_and_wait() {
    std::unique_lock lock(mutex);
    if (aborted) throw std::runtime_error("the tensor-parallel group was aborted");
    const uint64_t generation = generations;
    if (++arrived == size) {
      arrived = 0;
      ++generations;
      met.notify_all();
      return;
    }
    met.wait(lock, [&] { return generations != generation || aborted; });
    if (generations == generation) throw std::runtime_error("the tensor-parallel group was aborted");
  }
  void abort() {
    std::lock_guard lock(mutex);
    aborted = true;
    met.notify_all();
  }
  const int size;
  std::mutex mutex;
  std::condition_variable met;
  int arrived = 0;
  uint64_t generations = 0;
  bool aborted = false;
  std::vector<std::unique_ptr<Member>> members;
};

// A member copies its part into its own buffer of the call's parity, and waits at the barrier
// for the others' before reading theirs. Two parities, so that a member a call ahead writes
// the other buffer: it cannot get two calls ahead, the barrier of its next call holding it
// until every member has read this call's parts.
class LocalGroup::Member final : public Exchange {
 public:
  Member(State& group, int index) : group_(group), index_(index) {}
  int member() const override { return index_; }
  int size() const override { return static_cast<int>(group_.members.size()); }

  void all_gather_bytes(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                        std::span<std::byte> full) override {
    const size_t members = group_.members.size();
    const size_t row_width = checked_row_width(mine, widths, rows, full);
    posted_[parity_].assign(mine.begin(), mine.end());
    group_.arrive_and_wait();
    size_t column = 0;
    for (size_t m = 0; m < members; ++m) {
      const size_t width = widths[m];
      const std::byte* part = group_.members[m]->posted_[parity_].data();
      for (size_t r = 0; r < rows; ++r) {
        std::copy(part + r * width, part + (r + 1) * width, full.data() + r * row_width + column);
      }
      column += width;
    }
    parity_ ^= 1;
  }
  void abort() override { group_.abort(); }

 private:
  State& group_;
  const int index_;
  std::vector<std::byte> posted_[2];
  int parity_ = 0;
};

size_t Exchange::checked_row_width(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                                   std::span<const std::byte> full) const {
  if (widths.size() != static_cast<size_t>(size())) throw std::invalid_argument("all_gather needs one width per member");
  size_t row_width = 0;
  for (const size_t w : widths) row_width += w;
  if (mine.size() != rows * widths[static_cast<size_t>(member())] || full.size() != rows * row_width) {
    throw std::invalid_argument("all_gather's rows do not match the widths");
  }
  return row_width;
}

void Exchange::all_gather(std::span<const float> mine, std::span<const int> widths, size_t rows,
                          std::span<float> full) {
  std::vector<size_t> bytes;
  for (const int w : widths) bytes.push_back(static_cast<size_t>(w) * sizeof(float));
  all_gather_bytes(std::as_bytes(mine), bytes, rows, std::as_writable_bytes(full));
}

LocalGroup::LocalGroup(int members) {
  if (members < 1) throw std::invalid_argument("a group needs at least one member, not " + std::to_string(members));
  state_ = std::make_unique<State>(members);
  for (int m = 0; m < members; ++m) state_->members.push_back(std::make_unique<Member>(*state_, m));
}

LocalGroup::~LocalGroup() = default;

Exchange& LocalGroup::member(int index) { return *state_->members.at(static_cast<size_t>(index)); }

}  // namespace strata::model
