// A stage around another for tests of pipeline switches and admission: its `hold_at`-th batch
// (0: none) waits until open(), so that a test can switch pipelines (or admit requests) while a
// batch is in flight; it counts the sequences it starts (batches from position 0) and the
// layers' state read from it, which tell a hand-over from a computation again, and tells when a
// sequence first holds a prefix on it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "engine/stage.h"

namespace strata::engine {

class GatedStage final : public Stage {
 public:
  explicit GatedStage(std::shared_ptr<Stage> inner, int hold_at = 0) : inner_(std::move(inner)), hold_at_(hold_at) {}
  StageOutput forward(const StageBatch& batch) override {
    for (const SequenceWork& w : batch.sequences) {
      if (w.first_position == 0) ++started_;
    }
    if (++calls_ == hold_at_) {
      std::unique_lock lock(mutex_);
      held_ = true;
      changed_.notify_all();
      changed_.wait(lock, [&] { return open_; });
    }
    return inner_->forward(batch);
  }
  void release(std::span<const SequenceId> ids) override { inner_->release(ids); }
  StageLayers layers() const override { return inner_->layers(); }
  LayerKv read_kv(SequenceId id, int layer) override {
    ++reads_;
    return inner_->read_kv(id, layer);
  }
  void write_kv(const LayerKv& kv) override { inner_->write_kv(kv); }
  int hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) override {
    const int held = inner_->hold_prefix(id, capacity, tokens);
    std::lock_guard lock(mutex_);
    prefix_held_ = true;
    changed_.notify_all();
    return held;
  }
  model::KvBlockCounts kv_blocks() override { return inner_->kv_blocks(); }

  void wait_until_held() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return held_; });
  }
  bool prefix_held_within(std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, wait, [&] { return prefix_held_; });
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  int started() const { return started_; }
  int reads() const { return reads_; }

 private:
  std::shared_ptr<Stage> inner_;
  int hold_at_;
  std::atomic<int> calls_{0};
  std::atomic<int> started_{0};
  std::atomic<int> reads_{0};
  std::mutex mutex_;
  std::condition_variable changed_;
  bool held_ = false;
  bool open_ = false;
  bool prefix_held_ = false;
};

}  // namespace strata::engine
