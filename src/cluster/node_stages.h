// This node's pipeline stages across placement switches: the current placement's, and the one
// before it, which goes on serving its placement's batches until the leader has switched, then
// hands over its sequences' state and is dropped. Not thread-safe: the node's lock guards it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "engine/local_stage.h"
#include "model/model.h"
#include "cluster_types/node_info.h"

namespace strata::cluster {

class NodeStages {
 public:
  // The stage of placement `epoch`, the previous one's or the current one's; null when neither.
  std::shared_ptr<engine::Stage> of(uint64_t epoch) const;
  // The current stage, or null.
  std::shared_ptr<engine::Stage> current() const;
  // The current stage is of placement `epoch`.
  bool ready_for(uint64_t epoch) const { return current_ && current_epoch_ == epoch; }
  // The current stage's placement, 0 without one.
  uint64_t ready_epoch() const { return current_ ? current_epoch_ : 0; }
  bool has_current() const { return current_ != nullptr; }
  bool has_any() const { return current_ || previous_; }
  // Either stage holds a sequence's state.
  bool holds_sequences() const;

  // A new current stage over `model` for placement `epoch`, with `threads` of its own: a forward
  // of an older placement that is still running never shares threads with the new one. The
  // stage it replaces becomes the previous one.
  void start(std::shared_ptr<model::Model> model, int threads, engine::KvOptions kv, uint64_t epoch);
  // The current stage becomes the previous one.
  void retire();
  // The previous stage is dropped once the leader serves a placement newer than its own
  // (`leader_serves`, `placement_epoch`) and it holds no sequence (they moved, ended, or were
  // released as the leader's old pipeline ended), or `hand_over_limit` after, should a release
  // have been lost on the way.
  void drop_previous(bool leader_serves, uint64_t placement_epoch, std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::duration hand_over_limit);

  // What the current stage tells peers: the sequences it holds, its KV pool (of `kv_type`) and
  // the inputs it computed.
  void describe(cluster_types::NodeInfo& info, model::KvType kv_type) const;

 private:
  struct Runtime {
    Runtime(std::shared_ptr<model::Model> model, int threads, engine::KvOptions kv)
        : pool(threads), stage(std::make_shared<engine::LocalStage>(std::move(model), pool, kv)) {}
    tensor::ThreadPool pool;
    std::shared_ptr<engine::LocalStage> stage;
  };
  static std::shared_ptr<engine::Stage> stage_of(const std::shared_ptr<Runtime>& runtime);

  std::shared_ptr<Runtime> current_;
  uint64_t current_epoch_ = 0;
  std::shared_ptr<Runtime> previous_;  // of the placement before current_'s
  uint64_t previous_epoch_ = 0;
  std::optional<std::chrono::steady_clock::time_point> previous_served_since_;  // the leader serves a newer placement
};

}  // namespace strata::cluster
