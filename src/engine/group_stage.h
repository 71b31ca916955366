// A tensor-parallel group as one pipeline stage. Its members each compute a share of every
// layer of the same range (model::Model::load_share) and gather each other's rows while they
// compute, so every member must get every call, at the same time and in the same order: the
// group gives each call to all of them at once and one call at a time. Every member then
// returns what one stage of the whole range would, bit for bit; the group returns the first
// member's. Members given the same calls keep the same sequences in pools of the same block
// counts, so they refuse or accept alike.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/stage.h"

namespace strata::engine {

class GroupStage final : public Stage {
 public:
  // `members` in member order (the shares' order). Throws std::invalid_argument for none.
  explicit GroupStage(std::vector<std::shared_ptr<Stage>> members);

  // Throws StageLost when a member is lost (the group cannot compute without it), else the
  // first member's failure.
  StageOutput forward(const StageBatch& batch) override;
  void release(std::span<const SequenceId> ids) override;
  void cancel() override;
  void leave_group() override;
  // The longest prefix every member holds: members asked again with the shortest one's
  // tokens until they agree.
  int hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) override;
  // Per pool, the fewest any member has.
  model::KvBlockCounts kv_blocks() override;

 private:
  // Runs `call` for every member at once (the first on this thread) and waits for all; then
  // rethrows a member's StageLost, else the first member's failure. A member lost makes the
  // others leave the group at once, rather than wait for its rows.
  void on_every_member(const std::function<void(size_t member)>& call);

  std::vector<std::shared_ptr<Stage>> members_;
  std::mutex mutex_;  // one call at a time, so that every member sees the calls in one order
};

}  // namespace strata::engine
