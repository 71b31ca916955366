#include "cluster/node_stages.h"

namespace strata::cluster {

// Shares the runtime's ownership: the pool lives as long as the stage is used.
std::shared_ptr<engine::Stage> NodeStages::stage_of(const std::shared_ptr<Runtime>& runtime) {
  return std::shared_ptr<engine::Stage>(runtime, runtime->stage.get());
}

std::shared_ptr<engine::Stage> NodeStages::of(uint64_t epoch) const {
  if (previous_ && previous_epoch_ == epoch) return stage_of(previous_);
  if (ready_for(epoch)) return stage_of(current_);
  return nullptr;
}

std::shared_ptr<engine::Stage> NodeStages::current() const { return current_ ? stage_of(current_) : nullptr; }

bool NodeStages::holds_sequences() const {
  for (const auto* runtime : {&current_, &previous_}) {
    if (*runtime && (*runtime)->stage->sequence_count() > 0) return true;
  }
  return false;
}

void NodeStages::start(std::shared_ptr<model::Model> model, int threads, engine::KvOptions kv, uint64_t epoch) {
  retire();
  current_ = std::make_shared<Runtime>(std::move(model), threads, kv);
  current_epoch_ = epoch;
}

void NodeStages::retire() {
  if (!current_) return;
  previous_ = std::move(current_);
  previous_epoch_ = current_epoch_;
}

void NodeStages::drop_previous(bool leader_serves, uint64_t placement_epoch, std::chrono::steady_clock::time_point now,
                               std::chrono::steady_clock::duration hand_over_limit) {
  if (!previous_) return;
  if (!leader_serves || placement_epoch <= previous_epoch_) {
    previous_served_since_.reset();
    return;
  }
  if (!previous_served_since_) previous_served_since_ = now;
  if (previous_->stage->sequence_count() == 0 || now - *previous_served_since_ > hand_over_limit) {
    previous_.reset();
    previous_served_since_.reset();
  }
}

void NodeStages::describe(cluster_types::NodeInfo& info, model::KvType kv_type) const {
  info.held_sequences = current_ ? current_->stage->sequence_count() : 0;
  if (!current_) return;
  const auto describe_pool = [&](const model::KvPoolStats& kv) {
    return cluster_types::KvPoolStats{model::kv_type_name(kv_type), kv.block_bytes, kv.blocks, kv.used_blocks,
                                      kv.pinned_blocks,              kv.hits,        kv.misses, kv.evictions};
  };
  info.kv_cache.emplace(cluster_types::KvCacheStats{describe_pool(current_->stage->kv_stats())});
  if (const auto window = current_->stage->window_kv_stats()) info.kv_cache->window = describe_pool(*window);
  info.stage_inputs = current_->stage->computed_inputs();
}

}  // namespace strata::cluster
