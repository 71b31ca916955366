// What a stage of a model needs, whichever layers it runs and on whichever node: the weights it
// holds and reads per token, the KV it keeps, and the sum the memory rule counts. The search
// for a placement (placement.cpp) and the checks of a fixed one (placement_checks.cpp) count
// by these alone, so that both apply the same rule. Internal to the placement.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cluster/placement.h"

namespace strata::cluster {

inline constexpr uint64_t kMaxBytes = std::numeric_limits<uint64_t>::max();

// Sums of memory saturate: a stage whose need overflows simply does not fit anywhere.
inline uint64_t saturating_add(uint64_t a, uint64_t b) { return a > kMaxBytes - b ? kMaxBytes : a + b; }
inline uint64_t saturating_mul(uint64_t a, uint64_t b) { return b != 0 && a > kMaxBytes / b ? kMaxBytes : a * b; }

// prefix[i]: the sum of values [0, i), saturating.
std::vector<uint64_t> prefix_sums(const std::vector<uint64_t>& values);

// The footprint with prefix sums, so that any stage's needs cost O(1).
class StageNeeds {
 public:
  // Throws std::invalid_argument for a footprint without layers, with sizes missing, or with a
  // layer that reads more bytes than it holds.
  StageNeeds(const ModelFootprint& model, uint64_t kv_tokens);

  int count() const { return model_.layer_count; }

  // Weights a stage holds apart from the embedding: every byte of its layers, and the head on
  // the last stage.
  uint64_t held_bytes(int first, int last) const { return with_head(held_prefix_, first, last); }

  // Weights a stage reads for every token: its layers' (of experts only those a token runs), and
  // the head on the last stage. The embedding is not read whole: a token reads one row of it.
  uint64_t read_bytes(int first, int last) const { return with_head(read_prefix_, first, last); }

  // Bytes of rows a tensor-parallel group running the stage gathers for every token.
  uint64_t gathered_bytes(int first, int last) const {
    const uint64_t layers = gathered_prefix_[static_cast<size_t>(last)] - gathered_prefix_[static_cast<size_t>(first)];
    return last == count() ? saturating_add(layers, model_.head_gathered_bytes) : layers;
  }
  // And the gathers it makes for them, one after another: one more at the head.
  uint64_t gathers(int first, int last) const {
    const uint64_t layers = gathers_prefix_[static_cast<size_t>(last)] - gathers_prefix_[static_cast<size_t>(first)];
    return last == count() ? layers + 1 : layers;
  }

  // Every weight the model's stages hold together.
  uint64_t weight_bytes() const { return saturating_add(held_bytes(0, count()), model_.embedding_bytes); }

  // The KV `node` keeps per layer it runs, when it has no pool of a fixed size: per layer that
  // attends over every position, and per sliding-window layer.
  uint64_t kv_per_layer(const NodeCapacity& node) const {
    return node.kv_bytes_per_layer > 0 ? node.kv_bytes_per_layer : kv_per_layer_;
  }
  uint64_t kv_per_window_layer(const NodeCapacity& node) const {
    return node.kv_bytes_per_window_layer > 0 ? node.kv_bytes_per_window_layer : kv_per_window_layer_;
  }
  // The request's shares, for a node that does not say its own.
  uint64_t default_kv_per_layer() const { return kv_per_layer_; }
  uint64_t default_kv_per_window_layer() const { return kv_per_window_layer_; }
  bool has_window_layers() const { return window_prefix_.back() > 0; }

  // The KV that layers [first, last) keep on `node` when it sizes its pool per layer.
  uint64_t kv_of_layers(const NodeCapacity& node, int first, int last) const {
    const uint64_t window = window_prefix_[static_cast<size_t>(last)] - window_prefix_[static_cast<size_t>(first)];
    const uint64_t full = static_cast<uint64_t>(last - first) - window;
    return saturating_add(saturating_mul(kv_per_layer(node), full), saturating_mul(kv_per_window_layer(node), window));
  }
  // The KV a stage of layers [first, last) on `node` keeps.
  uint64_t kv_bytes(const NodeCapacity& node, int first, int last) const {
    return node.kv_pool_bytes > 0 ? node.kv_pool_bytes : kv_of_layers(node, first, last);
  }

  // What the memory rule counts for a stage on `node`.
  uint64_t memory_bytes(const NodeCapacity& node, int first, int last) const {
    uint64_t need = saturating_add(held_bytes(first, last), kv_bytes(node, first, last));
    if (first == 0) need = saturating_add(need, model_.embedding_bytes);
    return need;
  }

  // The least `node` must hold to take part at all: one layer and its KV, of the layers the
  // one that needs the least.
  uint64_t smallest_stage_bytes(const NodeCapacity& node) const {
    const auto with_kv = [&](uint64_t layer, uint64_t kv) {
      return layer == kMaxBytes ? kMaxBytes : saturating_add(layer, node.kv_pool_bytes > 0 ? node.kv_pool_bytes : kv);
    };
    return std::min(with_kv(smallest_full_layer_, kv_per_layer(node)),
                    with_kv(smallest_window_layer_, kv_per_window_layer(node)));
  }

 private:
  uint64_t with_head(const std::vector<uint64_t>& prefix, int first, int last) const {
    const uint64_t layers = prefix[static_cast<size_t>(last)] - prefix[static_cast<size_t>(first)];
    return last == count() ? saturating_add(layers, model_.head_bytes) : layers;
  }

  const ModelFootprint& model_;
  uint64_t kv_per_layer_;
  uint64_t kv_per_window_layer_;
  uint64_t smallest_full_layer_ = kMaxBytes;    // of the layers that attend over every position
  uint64_t smallest_window_layer_ = kMaxBytes;  // of the sliding-window layers
  std::vector<uint64_t> window_prefix_;         // window_prefix_[i]: sliding-window layers of [0, i)
  std::vector<uint64_t> held_prefix_;  // held_prefix_[i]: bytes of layers [0, i)
  std::vector<uint64_t> read_prefix_;  // read_prefix_[i]: bytes of layers [0, i) a token reads
  std::vector<uint64_t> gathered_prefix_;  // gathered_prefix_[i]: bytes a group gathers in layers [0, i)
  std::vector<uint64_t> gathers_prefix_;   // gathers_prefix_[i]: the gathers it makes in layers [0, i)
};

}  // namespace strata::cluster
