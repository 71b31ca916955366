// A tensor-parallel group as one pipeline stage. Its members each compute a share of every
// layer of the same range (model::Model::load_share) and gather each other's rows while they
// compute, so every member must get every call, at the same time and in the same order: the
// group gives each call to all of them at once and one call at a time. Every member then
// returns what one stage of the whole range would, bit for bit; the group returns the first
// member's. Members given the same calls keep the same sequences in pools of the same block
// counts, so they refuse or accept alike.
//
// A group whose members are all on other nodes is a link of a chain (Stage::chain_node): a
// batch sent to it goes to every member, and the first one passes its output on to the rest of
// the chain while the others only compute their shares with it.
//
// A forward sends its batch to the members after the first that are on other nodes (those
// with a chain_node) before any member here computes, and returns once the members here are
// done: the others' answers are awaited on a thread and taken at the group's next call, which
// throws their failure. Those answers arrive after the step has ended everywhere (the members
// finish together, at their last gather), so waiting for them would only hold back the next
// step's batch, which those members wait for.
//
// A sequence's state moves to and from the group as one stage's: each member holds its own KV
// heads, a contiguous run in member order, so a row of the whole model's keys (or values) is
// the members' parts of it side by side.
#pragma once

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "engine/stage.h"
#include "model/tensor_share.h"

namespace strata::engine {

class GroupStage final : public Stage {
 public:
  // `members` in member order. `shares`, the members' (tensor_share.h), tell how a handed-over
  // row splits among them: a row is per KV head, so a member's part is its KV heads' part on
  // every layer and in every KV type, which byte widths given here would have to say per layer
  // and type; and every caller that loads the members holds the shares already. Without shares
  // the group gives its state but takes none over. Throws std::invalid_argument for no
  // members, a missing one, members that say different layers, and shares that are not one
  // per member or whose KV heads are not contiguous from the first in member order.
  explicit GroupStage(std::vector<std::shared_ptr<Stage>> members, std::span<const model::TensorShare> shares = {});
  ~GroupStage() override;  // waits for the answers of the last forward's members on other nodes
  GroupStage(const GroupStage&) = delete;
  GroupStage& operator=(const GroupStage&) = delete;

  // Throws StageLost when a member is lost (the group cannot compute without it), else the
  // first member's failure; and so does the call after it, for the answers of members on
  // other nodes that came after it returned.
  StageOutput forward(const StageBatch& batch) override;
  void release(std::span<const SequenceId> ids) override;
  void cancel() override;
  void leave_group() override;
  // The first member's node, when every member passes batches on; else empty.
  std::string chain_node() const override;
  // Sends the batch to every member, `then` to the first only.
  void send(const StageBatch& batch) override;
  // The first member's output of the oldest batch sent; fails like forward.
  StageOutput receive() override;
  // The members' layers; empty when one of them does not say.
  StageLayers layers() const override { return layers_; }
  // Every member's part, each row's parts in member order. Throws std::runtime_error when the
  // members disagree on the sequence (positions, capacity, first position, tokens, KV type).
  LayerKv read_kv(SequenceId id, int layer) override;
  // Each member gets its part of every row. Throws StageLost without shares, and
  // std::invalid_argument for rows that do not split into the members' KV heads.
  void write_kv(const LayerKv& kv) override;
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
  // Runs `call` for each of `members` at once (the first of them on this thread), recording
  // what each throws in `failures`.
  void at_once(std::span<const size_t> members, const std::function<void(size_t member)>& call,
               std::vector<std::exception_ptr>& failures);
  // Waits for the answers of the last forward's members on other nodes; what each threw (empty
  // when there was no such forward).
  std::vector<std::exception_ptr> take_answers();
  // Takes mutex_, then the last forward's answers, throwing their failure (release throws it
  // after releasing).
  std::unique_lock<std::mutex> settled();
  // Runs `call` for `member`, recording what it throws in `failures`; a lost member makes the
  // others leave the group at once.
  void failing_alone(size_t member, const std::function<void()>& call, std::vector<std::exception_ptr>& failures);

  std::vector<std::shared_ptr<Stage>> members_;
  StageLayers layers_;
  std::vector<int> kv_heads_;  // per member, from the shares; empty without them
  // The first member and those on this node (no chain_node), and the others: a forward sends
  // these their batch and takes their answers later.
  std::vector<size_t> here_, elsewhere_;
  std::mutex mutex_;           // one call at a time, so that every member sees the calls in one order
  // Receiving the last forward's answers from members on other nodes, and what each threw.
  std::thread answering_;
  std::vector<std::exception_ptr> answer_failures_;
  std::mutex sent_mutex_;
  // Per batch sent and not yet received: what each member's send threw, or null.
  std::deque<std::vector<std::exception_ptr>> sent_;
};

}  // namespace strata::engine
