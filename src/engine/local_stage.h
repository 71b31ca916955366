// A pipeline stage computed on this node: a Model over its layer range, a KV pool for those
// layers, and each sequence's block table, keyed by sequence id.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "metrics/metrics.h"
#include "engine/stage.h"
#include "model/model.h"
#include "tensor/thread_pool.h"

namespace strata::engine {

struct KvOptions {
  model::KvType type = model::KvType::F16;
  model::KvBlockCounts blocks;  // of model::kKvBlock positions
};

class LocalStage final : public Stage {
 public:
  // `pool` runs the forward passes; it must outlive the stage and is used by nobody else
  // while a forward runs.
  LocalStage(std::shared_ptr<model::Model> model, tensor::ThreadPool& pool, KvOptions kv);

  // At the stage that holds the head, a sequence with a sampling step gets its token there.
  StageOutput forward(const StageBatch& batch) override;
  void release(std::span<const SequenceId> ids) override;
  void leave_group() override { model_->leave_group(); }
  StageLayers layers() const override { return {model_->range().first, model_->range().last}; }
  LayerKv read_kv(SequenceId id, int layer) override;
  void write_kv(const LayerKv& kv) override;
  int hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) override;
  model::KvBlockCounts kv_blocks() override { return kv_blocks_; }

  const model::Model& model() const { return *model_; }
  // Sequences whose state this stage holds: zero once every request has ended. Does not wait
  // for a forward that is running.
  size_t sequence_count() const { return sequence_count_; }
  // As of the last call that changed the pools, of the full-attention layers' pool and of the
  // sliding-window layers' (none without such layers); does not wait for a forward that is
  // running.
  model::KvPoolStats kv_stats() const;
  std::optional<model::KvPoolStats> window_kv_stats() const;
  // Inputs (prompt and generated tokens) computed by stages of these layers in this process.
  uint64_t computed_inputs() const { return static_cast<uint64_t>(step_inputs_.snapshot().sum); }

 private:
  struct Sequence {
    std::unique_ptr<model::KvState> kv;
    bool started = false;  // has had a batch: a prefix it held is settled
  };
  void publish_stats();  // mutex_ held
  // The head's rows of `sequences` (as the model returned them) without those that sample here,
  // and their tokens.
  // `tokens`: the batch's inputs, whose drafts the steps with drafts check.
  StageOutput sample(const std::vector<SequenceWork>& sequences, std::span<const Token> tokens,
                     std::span<const float> rows);
  // A group's member with the head, when every sequence with a row chooses greedily without
  // logprobs (sampling::chooses_from_bests): the members exchange each share's best token at
  // each row rather than the rows, and every member chooses what one stage would.
  bool chooses_from_bests(const std::vector<SequenceWork>& sequences) const;
  // `rows`: this member's share of each such sequence's logits rows; `tokens` as sample's.
  StageOutput choose_from_bests(const std::vector<SequenceWork>& sequences, std::span<const Token> tokens,
                                std::span<const float> rows);

  std::shared_ptr<model::Model> model_;
  tensor::ThreadPool& pool_;
  // In the process's metrics, under this stage's layers.
  metrics::Histogram& step_seconds_;
  metrics::Histogram& step_inputs_;
  metrics::Histogram& step_sequences_;
  const model::KvBlockCounts kv_blocks_;
  mutable std::mutex mutex_;  // one forward, hold or release at a time
  std::shared_ptr<model::KvMemory> kv_memory_;
  std::map<SequenceId, Sequence> sequences_;
  // The head's rows of the last batch, in memory kept from step to step (Model::forward).
  std::vector<float> head_rows_;
  std::atomic<size_t> sequence_count_{0};
  mutable std::mutex stats_mutex_;
  model::KvPoolStats stats_;
  std::optional<model::KvPoolStats> window_stats_;
};

// Blocks for the pools of `range`'s layers of `config`'s model, stored as `type`, in `bytes`
// (0: enough for `sequences` sequences of `context` positions). Of a budget, the pool of
// sliding-window layers takes what `sequences` sequences' windows and steps of `step_inputs`
// need, but never more than its layers' share of the budget; the full-attention layers' pool
// the rest.
model::KvBlockCounts kv_pool_blocks(const model::Config& config, model::LayerRange range, model::KvType type, uint64_t bytes,
                                    int context, int sequences, int step_inputs);

}  // namespace strata::engine
