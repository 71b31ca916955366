// A pipeline stage computed on this node: a Model over its layer range, and each sequence's
// KvState for those layers, keyed by sequence id.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "engine/stage.h"
#include "model/model.h"
#include "tensor/thread_pool.h"

namespace strata::engine {

class LocalStage final : public Stage {
 public:
  // `pool` runs the forward passes; it must outlive the stage and is used by nobody else
  // while a forward runs.
  LocalStage(std::shared_ptr<model::Model> model, tensor::ThreadPool& pool);

  std::vector<float> forward(const StageBatch& batch) override;
  void release(std::span<const SequenceId> ids) override;
  StageLayers layers() const override { return {model_->range().first, model_->range().last}; }
  LayerKv read_kv(SequenceId id, int layer) override;
  void write_kv(const LayerKv& kv) override;

  const model::Model& model() const { return *model_; }
  // Sequences whose state this stage holds: zero once every request has ended. Does not wait
  // for a forward that is running.
  size_t sequence_count() const { return sequence_count_; }

 private:
  std::shared_ptr<model::Model> model_;
  tensor::ThreadPool& pool_;
  mutable std::mutex mutex_;  // one forward or release at a time
  std::map<SequenceId, std::unique_ptr<model::KvState>> sequences_;
  std::atomic<size_t> sequence_count_{0};
};

}  // namespace strata::engine
