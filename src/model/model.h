// The forward pass of a contiguous range of layers of a Llama-family model.
//
// A node holds layers [first, last): the first range also embeds tokens, the last also
// produces logits, and the hidden states between ranges are plain float rows. Every row's
// arithmetic is independent of the other rows in the batch, the thread count and how the
// work is split, so a sequence's outputs are bit-identical alone, batched, chunked or split
// across ranges.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "gguf/gguf.h"
#include "model/config.h"
#include "tensor/matmul.h"
#include "tensor/thread_pool.h"

namespace strata::model {

using Token = int32_t;

// Keys and values of one sequence for the layers of one range. Created for a sequence and
// dropped with it: nothing in it outlives the sequence unless its owner keeps it.
class KvState {
 public:
  KvState(const Config& config, LayerRange range, int capacity);
  int size() const { return size_; }
  int capacity() const { return capacity_; }
  LayerRange range() const { return range_; }

  // Positions [0, size()) of global layer `layer` as rows of kv_dim floats, keys then values:
  // the form in which a sequence's state moves to another node.
  void read(int layer, std::vector<float>& keys, std::vector<float>& values) const;
  // Writes positions [0, positions) of global layer `layer` from such rows. The state then
  // holds `positions` positions: every one of its layers must be written before it is used.
  void write(int layer, int positions, std::span<const float> keys, std::span<const float> values);

 private:
  friend class Model;
  // Positions come in blocks of tensor::kKeyBlock. In each layer's block, per KV head: its
  // keys dimension-major (the layout tensor::key_scores reads), its values position-major.
  int64_t block_floats() const;
  int64_t head_offset(int block, int kv_head) const;  // of a KV head's part of a block
  const float* key_block(int layer, int block, int kv_head) const;
  const float* value_block(int layer, int block, int kv_head) const;
  // Grows every layer to hold `positions` positions.
  void reserve(int positions);
  // Writes position `position` of `layer`: k and v are kv_dim floats each.
  void store(int layer, int position, const float* k, const float* v);

  LayerRange range_;
  int layer_count_;
  int head_dim_;
  int kv_dim_;
  int capacity_;
  int size_ = 0;
  std::vector<std::vector<float>> keys_;  // per layer, whole blocks
  std::vector<std::vector<float>> values_;
};

// One sequence's share of a batch: its next `token_count` inputs continue at kv->size().
struct SequenceSlice {
  KvState* kv = nullptr;
  int token_count = 0;
  bool logits_for_all = false;  // last range only: logits for every input, not just the last
};

class Model {
 public:
  // Binds the tensors of `range` from `file` (kept alive by the model). Throws
  // std::runtime_error naming a missing tensor, a wrong shape or an unsupported type.
  // `progress`, when given, is called from loading threads with the share of the range's
  // layers (and head) bound so far, 0..1. The layers (and head) that `reuse`, a model of the
  // same file, already holds are shared with it rather than prepared again.
  static std::unique_ptr<Model> load(std::shared_ptr<const gguf::File> file, LayerRange range,
                                     const std::function<void(double)>& progress = {},
                                     const Model* reuse = nullptr);
  static std::unique_ptr<Model> load(std::shared_ptr<const gguf::File> file);  // all layers

  const Config& config() const { return config_; }
  LayerRange range() const { return range_; }
  const gguf::File& file() const { return *file_; }
  std::unique_ptr<KvState> new_sequence(int capacity) const;
  // Bytes of weights read for one token through this range.
  uint64_t weight_bytes() const;

  // Runs the batch through this range. Input is `tokens` for the first range and `hidden`
  // (one embedding_dim row per input) for the others; all slices' inputs are concatenated in
  // slice order. Returns hidden rows for a range without the head, otherwise logits rows
  // (vocab_size each): per slice, every input's row if logits_for_all, else the last one's.
  // Not reentrant: one forward at a time per Model.
  std::vector<float> forward(std::span<const SequenceSlice> slices, std::span<const Token> tokens,
                             std::span<const float> hidden, tensor::ThreadPool& pool);

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    tensor::PreparedMatrix q, k, v, o;
    const float* q_bias = nullptr;
    const float* k_bias = nullptr;
    const float* v_bias = nullptr;
    const float* ffn_norm = nullptr;
    tensor::PreparedMatrix gate, up, down;
  };

  Model() = default;
  void embed(std::span<const Token> tokens, float* out) const;
  // Each batch row attends over its own sequence's cache, rows 0..its position.
  void attention(int layer_index, tensor::ThreadPool& pool);
  // Rotation of each input row, computed once per batch for all layers and heads.
  void prepare_rope(std::span<const int> positions);
  void rope(float* rows, int row_count, int heads) const;

  std::shared_ptr<const gguf::File> file_;
  Config config_;
  LayerRange range_;
  tensor::Matrix embedding_{};
  const float* output_norm_ = nullptr;
  std::shared_ptr<const tensor::PreparedMatrix> output_;
  std::vector<std::shared_ptr<const Layer>> layers_;
  std::vector<float> rope_inverse_freq_;  // per rotated pair

  // Scratch rows for the current batch, reused between calls.
  std::vector<float> x_, normed_, q_, k_, v_, attn_out_, gate_, up_, proj_;
  std::vector<int> positions_;   // per batch row: its position in its sequence
  std::vector<KvState*> row_kv_;  // per batch row: its sequence's cache
  std::vector<float> rope_cos_, rope_sin_;  // row x rotated pair
};

}  // namespace strata::model
