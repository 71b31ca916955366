#include "engine/group_stage.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <thread>

namespace strata::engine {

GroupStage::GroupStage(std::vector<std::shared_ptr<Stage>> members) : members_(std::move(members)) {
  if (members_.empty()) throw std::invalid_argument("a tensor-parallel group needs at least one member");
  for (const auto& member : members_) {
    if (member == nullptr) throw std::invalid_argument("a tensor-parallel group's member is missing");
  }
}

void GroupStage::on_every_member(const std::function<void(size_t member)>& call) {
  std::vector<std::exception_ptr> failures(members_.size());
  const auto run = [&](size_t m) {
    try {
      call(m);
    } catch (const StageLost&) {
      failures[m] = std::current_exception();
      leave_group();
    } catch (...) {
      failures[m] = std::current_exception();
    }
  };
  std::vector<std::thread> others;
  others.reserve(members_.size() - 1);
  for (size_t m = 1; m < members_.size(); ++m) others.emplace_back(run, m);
  run(0);
  for (std::thread& other : others) other.join();
  for (const std::exception_ptr& failure : failures) {
    if (failure == nullptr) continue;
    try {
      std::rethrow_exception(failure);
    } catch (const StageLost&) {
      throw;
    } catch (...) {
    }
  }
  for (const std::exception_ptr& failure : failures) {
    if (failure != nullptr) std::rethrow_exception(failure);
  }
}

StageOutput GroupStage::forward(const StageBatch& batch) {
  std::lock_guard lock(mutex_);
  StageOutput first;
  on_every_member([&](size_t m) {
    StageOutput out = members_[m]->forward(batch);
    if (m == 0) first = std::move(out);
  });
  return first;
}

void GroupStage::release(std::span<const SequenceId> ids) {
  std::lock_guard lock(mutex_);
  on_every_member([&](size_t m) { members_[m]->release(ids); });
}

void GroupStage::cancel() {
  for (const auto& member : members_) member->cancel();
}

void GroupStage::leave_group() {
  for (const auto& member : members_) member->leave_group();
}

int GroupStage::hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) {
  std::lock_guard lock(mutex_);
  std::vector<int> held(members_.size());
  std::span<const Token> asked = tokens;
  while (true) {
    on_every_member([&](size_t m) { held[m] = members_[m]->hold_prefix(id, capacity, asked); });
    const auto [least, most] = std::minmax_element(held.begin(), held.end());
    if (*least == *most) return *least;
    asked = tokens.first(static_cast<size_t>(*least));
  }
}

model::KvBlockCounts GroupStage::kv_blocks() {
  std::vector<model::KvBlockCounts> counts(members_.size());
  on_every_member([&](size_t m) { counts[m] = members_[m]->kv_blocks(); });
  model::KvBlockCounts fewest = counts.front();
  for (const model::KvBlockCounts& c : counts) {
    fewest.full = std::min(fewest.full, c.full);
    fewest.window = std::min(fewest.window, c.window);
  }
  return fewest;
}

}  // namespace strata::engine
