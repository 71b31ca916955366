#include "engine/local_stage.h"

#include <stdexcept>
#include <string>

namespace strata::engine {

LocalStage::LocalStage(std::shared_ptr<model::Model> model, tensor::ThreadPool& pool)
    : model_(std::move(model)), pool_(pool) {}

std::vector<float> LocalStage::forward(const StageBatch& batch) {
  std::lock_guard lock(mutex_);
  std::vector<model::SequenceSlice> slices;
  slices.reserve(batch.sequences.size());
  for (const SequenceWork& work : batch.sequences) {
    if (work.token_count <= 0) throw std::invalid_argument("a batch sequence has no inputs");
    auto found = sequences_.find(work.id);
    if (work.first_position == 0) {
      if (found != sequences_.end()) {
        throw std::invalid_argument("sequence " + std::to_string(work.id) + " is started twice");
      }
      if (work.capacity < work.token_count) {
        throw std::invalid_argument("sequence " + std::to_string(work.id) + " asks for a capacity of " +
                                    std::to_string(work.capacity) + " positions");
      }
      found = sequences_.emplace(work.id, model_->new_sequence(work.capacity)).first;
      sequence_count_ = sequences_.size();
    } else if (found == sequences_.end()) {
      throw std::invalid_argument("sequence " + std::to_string(work.id) + " is unknown to this stage");
    } else if (found->second->size() != work.first_position) {
      throw std::invalid_argument("sequence " + std::to_string(work.id) + " is at position " +
                                  std::to_string(found->second->size()) + ", but the batch continues at " +
                                  std::to_string(work.first_position));
    }
    slices.push_back({found->second.get(), work.token_count, false});
  }
  return model_->forward(slices, batch.tokens, batch.hidden, pool_);
}

LayerKv LocalStage::read_kv(SequenceId id, int layer) {
  std::lock_guard lock(mutex_);
  const auto found = sequences_.find(id);
  if (found == sequences_.end()) throw std::invalid_argument("sequence " + std::to_string(id) + " is unknown to this stage");
  LayerKv kv{id, layer, found->second->size(), found->second->capacity(), {}, {}};
  found->second->read(layer, kv.keys, kv.values);
  return kv;
}

void LocalStage::write_kv(const LayerKv& kv) {
  std::lock_guard lock(mutex_);
  auto found = sequences_.find(kv.id);
  if (found == sequences_.end()) {
    if (kv.capacity < kv.positions) {
      throw std::invalid_argument("sequence " + std::to_string(kv.id) + " asks for a capacity of " +
                                  std::to_string(kv.capacity) + " positions");
    }
    found = sequences_.emplace(kv.id, model_->new_sequence(kv.capacity)).first;
    sequence_count_ = sequences_.size();
  } else if (found->second->size() != kv.positions) {
    throw std::invalid_argument("sequence " + std::to_string(kv.id) + " holds " + std::to_string(found->second->size()) +
                                " positions, the state handed over " + std::to_string(kv.positions));
  }
  found->second->write(kv.layer, kv.positions, kv.keys, kv.values);
}

void LocalStage::release(std::span<const SequenceId> ids) {
  std::lock_guard lock(mutex_);
  for (SequenceId id : ids) sequences_.erase(id);
  sequence_count_ = sequences_.size();
}

}  // namespace strata::engine
