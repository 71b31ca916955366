// The forward pass of a contiguous range of layers of a Llama-family model, dense or with a
// Mixture-of-Experts FFN, with grouped-query or (DeepSeek's) latent attention.
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
#include <stdexcept>
#include <vector>

#include "gguf/gguf.h"
#include "model/config.h"
#include "model/exchange.h"
#include "model/kv_pool.h"
#include "model/kv_state.h"
#include "model/leaf_tree.h"
#include "model/tensor_share.h"
#include "tensor/matmul.h"
#include "tensor/thread_pool.h"

namespace strata::model {

// What the last range returns for a sequence's inputs.
enum class SliceOutput {
  LastLogits,     // the logits of its last input
  AllLogits,      // the logits of every input
  AllEmbeddings,  // every input's output-normed hidden row (embedding_dim), which pooling makes an embedding
  Nothing,        // no row: a chunk of a prompt whose logits nobody reads
};

// One sequence's share of a batch: its next `token_count` inputs continue at kv->size().
struct SequenceSlice {
  KvState* kv = nullptr;
  int token_count = 0;
  SliceOutput output = SliceOutput::LastLogits;  // of the last range only
};

// What the head of a tensor-parallel group's member returns: the rows gathered whole, or its
// share of each (vocab_share() of them), for a caller that needs less than the rows (a greedy
// choice needs each share's best; see Model::gather_from_members).
enum class HeadRows { Whole, Share };

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
  // A member of a tensor-parallel group (tensor_share.h): member exchange.member()'s share,
  // shares[member], of every layer of `range` and of its head. Each member loads its own with
  // the same `shares` and calls forward with the same batch at the same time, on a thread of
  // its own; the members gather each other's rows through `exchange` (which must outlive the
  // model), and each returns what one Model of the range would, bit for bit. Its KV memory
  // holds its KV heads only. Throws std::runtime_error for what `load` refuses, for shares that
  // do not cover the model in member order, and for latent attention, which it cannot split.
  static std::unique_ptr<Model> load_share(std::shared_ptr<const gguf::File> file, LayerRange range,
                                           std::span<const TensorShare> shares, Exchange& exchange);

  const Config& config() const { return config_; }
  // A member of a group whose step cannot finish (another member is lost): its gathers fail
  // from now on (Exchange::abort), a forward waiting in one included. A whole model: nothing.
  void leave_group() const {
    if (exchange_ != nullptr) exchange_->abort();
  }
  LayerRange range() const { return range_; }
  const gguf::File& file() const { return *file_; }
  // KV memory of `blocks` blocks for this range's layers.
  std::shared_ptr<KvMemory> new_kv_memory(KvBlockCounts blocks, KvType type) const;
  // A sequence with memory of its own, just large enough for `capacity` positions.
  std::unique_ptr<KvState> new_sequence(int capacity, KvType type = KvType::F32) const;
  // Bytes of weights read for one token through this range: of a Mixture-of-Experts FFN, only
  // the experts a token runs (as many as it chooses, each of the same size).
  uint64_t weight_bytes() const;

  // Runs the batch through this range. Throws KvPoolFull, having computed nothing, when a
  // sequence's pool cannot hold its new positions. Input is `tokens` for the first range and `hidden`
  // (one embedding_dim row per input) for the others; all slices' inputs are concatenated in
  // slice order. Returns hidden rows for a range without the head, otherwise per slice, in
  // slice order, the rows its output asks for: logits rows (vocab_size each) or embedding rows.
  // Not reentrant: one forward at a time per Model. With HeadRows::Share a group's member's
  // logits rows are its vocab_share() of each (a whole model's are whole either way).
  std::vector<float> forward(std::span<const SequenceSlice> slices, std::span<const Token> tokens,
                             std::span<const float> hidden, tensor::ThreadPool& pool,
                             HeadRows head = HeadRows::Whole);
  // The same rows into `out`, whose memory a caller that keeps it from step to step reuses: a
  // decode step then allocates no logits row (a fresh row of a large vocabulary can be fresh
  // pages each step, a page fault every 4 KB, where the process returns large blocks to the
  // system as the server does).
  void forward(std::span<const SequenceSlice> slices, std::span<const Token> tokens, std::span<const float> hidden,
               tensor::ThreadPool& pool, HeadRows head, std::vector<float>& out);
  // The tokens whose logits this model's head computes: a group member's share of the
  // vocabulary, or all of it.
  RowRange vocab_share() const { return vocab_share_; }
  // A group's members each call this in the same order with as many bytes: every member's
  // `mine`, in member order. A whole model: `mine`.
  std::vector<std::byte> gather_from_members(std::span<const std::byte> mine) const;

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    tensor::PreparedMatrix q, k, v;
    tensor::PreparedMatrix o;  // this member's columns (o_sums_)
    const float* q_bias = nullptr;
    const float* k_bias = nullptr;
    const float* v_bias = nullptr;
    const float* q_norm = nullptr;  // head_dim weights, with has_qk_norm
    const float* k_norm = nullptr;
    const float* o_bias = nullptr;
    const float* sinks = nullptr;  // head_count logits, with has_attention_sinks
    const float* ffn_norm = nullptr;
    const float* post_attention_norm = nullptr;  // with has_post_norms
    const float* post_ffn_norm = nullptr;
    tensor::PreparedMatrix gate, up;  // a dense FFN
    tensor::PreparedMatrix down;      // this member's columns (down_sums_)
    tensor::PreparedMatrix router;          // with experts: one score per expert
    const float* selection_bias = nullptr;  // with expert_selection_bias: one per expert
    // Of each expert, gate's and up's rows; down's leaves (this member's), expert after expert.
    std::vector<tensor::PreparedMatrix> expert_gate, expert_up, expert_down;
    // With has_expert_biases: the router's, then each expert's (expert after expert).
    const float* router_bias = nullptr;
    const float* expert_gate_bias = nullptr;
    const float* expert_up_bias = nullptr;
    const float* expert_down_bias = nullptr;
    tensor::PreparedMatrix shared_gate, shared_up;  // with a shared expert
    std::vector<tensor::PreparedMatrix> shared_down;  // its leaves (this member's)
    // Latent attention: queries through q_a, its norm and q_b (or q alone); kv_a gives the
    // latent (normalized by kv_a_norm) and the key's rotated part; per head, k_b takes the
    // query's part without RoPE into the latent's space and v_b the latent's to the value.
    tensor::PreparedMatrix q_a, q_b, kv_a;
    const float* q_a_norm = nullptr;
    const float* kv_a_norm = nullptr;
    std::vector<tensor::PreparedMatrix> k_b, v_b;
    // k_b and v_b as floats, for files that carry them as one attn_kv_b (converted before
    // llama.cpp split it): their matrices read these.
    std::vector<float> split_kv_b;
  };
  // One RoPE base's rotation: per pair its inverse frequency; per batch row and pair the
  // cos and sin of its angle, times `magnitude` (YaRN's; 1 otherwise).
  struct Rope {
    std::vector<float> inverse_freq;
    float magnitude = 1.0f;
    std::vector<float> cos, sin;
  };
  // `scaled`: with the model's RoPE scaling (linear or YaRN), else plain.
  static Rope rope_table(const Config& c, float base, const float* freq_factors, bool scaled);

  Model() = default;
  // load's and load_share's: binds `share` of the layers (a whole model's: all of them).
  static std::unique_ptr<Model> bind_weights(std::shared_ptr<const gguf::File> file, LayerRange range,
                                             const std::function<void(double)>& progress, const Model* reuse,
                                             std::span<const TensorShare> shares, Exchange* exchange);
  // `full` = every member's `mine` side by side in each of `rows` rows, `widths` the members'
  // parts of a row. A whole model has every part already: the vectors swap. `mine` is thus left
  // with no particular size.
  void gather(std::vector<float>& mine, std::span<const int> widths, size_t rows, std::vector<float>& full);
  // A projection whose input is added up in leaves (leaf_tree.h, tensor_share.h): o, down, the
  // experts' down and the shared expert's.
  struct LeafSums {
    int count = 1;                // leaves of the whole input
    int cols = 0;                 // of each (the last may have fewer)
    RowRange mine;                // this member's leaves
    std::vector<LeafNode> own;    // the sums this member adds up from them
    std::vector<tensor::LeafStep> steps;  // that add them up: o's and down's leaf programs
    std::vector<LeafNode> all;    // every member's own, in member order
    std::vector<int> widths;      // per member, its sums' floats in a row
    // The experts' downs and the shared expert's: this member's leaves' columns, and the
    // leaves as nodes of the tree.
    std::vector<RowRange> leaf_columns;
    std::vector<LeafNode> leaf_nodes;
  };
  // proj_ = the projection whose columns this member holds (`w`: its leaves of `sums`) times
  // `rows` rows of its part of the input, `in`.
  void add_up_leaves(const tensor::PreparedMatrix& w, const LeafSums& sums, const float* in, int rows,
                     tensor::ThreadPool& pool);
  void embed(std::span<const Token> tokens, float* out) const;
  // Each batch row attends over its own sequence's cache: rows 0..its position, or in a
  // sliding layer the last sliding_window of them.
  void attention(int layer_index, const Layer& layer, tensor::ThreadPool& pool);
  // Latent attention's queries into q_ (per head: the part without RoPE in the latent's space,
  // then the rotated part) and keys into k_ (the normalized latent, then the rotated part).
  void latent_queries_and_keys(const Layer& layer, const Rope& table, int rows, tensor::ThreadPool& pool);
  // head_values_ = each head's attention output (attn_out_, in the latent's space) through v_b.
  void latent_values(const Layer& layer, int rows, tensor::ThreadPool& pool);
  // Of each batch row, one part per head: head h of row r at data + r * row_stride + h * head_stride.
  struct HeadParts {
    float* data;
    size_t row_stride;
    size_t head_stride;
    int dim;
  };
  // Part h of out = heads[h] times part h of in, in every row (each head's own matrix).
  void per_head_products(const std::vector<tensor::PreparedMatrix>& heads, HeadParts in, HeadParts out, int rows,
                         tensor::ThreadPool& pool);
  // gate = the config's activation of gate and up, `rows` rows of `width`.
  void activate(float* gate, const float* up, size_t rows, size_t width, tensor::ThreadPool& pool) const;
  // proj_ = the experts' FFN of normed_, each row through the experts it chooses (and the
  // shared expert).
  void experts_ffn(const Layer& layer, int rows, tensor::ThreadPool& pool);
  // out = `rows` rows of `in` (each the columns of `leaves`, side by side) leaf after leaf:
  // leaf l's columns of every row, row after row, from l x rows x the first leaf's width.
  static void split_into_leaves(const std::vector<float>& in, size_t rows, std::span<const RowRange> leaves,
                                std::vector<float>& out, tensor::ThreadPool& pool);
  // proj_ = the layer's dense FFN of normed_: down(activation(gate x, up x)).
  void dense_ffn(const Layer& layer, int rows, tensor::ThreadPool& pool);
  // Tells a group's exchange the weights this member reads first after its next gather
  // (Exchange::read_next), so that a wait for the others may bring them into the caches.
  void read_next(std::span<const tensor::PreparedMatrix* const> matrices);
  // Rotation of each input row, computed once per batch for all layers and heads.
  void prepare_rope(std::span<const int> positions);
  // Rotates the rope_dim dimensions from `rows` of each of `heads` heads, head_stride apart,
  // in every row (heads * head_stride apart).
  void rope(const Rope& table, float* rows, int row_count, int heads, int head_stride) const;

  std::shared_ptr<const gguf::File> file_;
  Config config_;
  // config_ with this model's share of the heads and of the FFN's rows: what its weights, its
  // KV memory and its attention cover (config_ itself in a whole model).
  Config share_config_;
  // Per member of the group (a whole model is a group of one), its part of a row of the
  // logits, and of a layer with experts' sums (its experts' and shared expert's).
  std::vector<int> vocab_widths_, expert_layer_widths_;
  LeafSums o_sums_, down_sums_, expert_sums_, shared_sums_;
  Exchange* exchange_ = nullptr;  // nullptr: a whole model
  // The weights read after the current layer's FFN: the next layer's q, k and v, or the head.
  std::vector<const tensor::PreparedMatrix*> after_ffn_;
  std::vector<std::span<const std::byte>> next_reads_;
  RowRange vocab_share_;
  LayerRange range_;
  tensor::Matrix embedding_{};
  const float* output_norm_ = nullptr;
  std::shared_ptr<const tensor::PreparedMatrix> output_;
  std::vector<std::shared_ptr<const Layer>> layers_;
  // The full layers' RoPE, and the sliding ones' where their base differs; per layer of the
  // range, the index of its table.
  std::vector<Rope> ropes_;
  std::vector<size_t> layer_rope_;

  // Scratch rows for the current batch, reused between calls.
  std::vector<float> x_, normed_, q_, k_, v_, attn_out_, gate_, up_, proj_;
  // The sums of each row this member adds up (add_up_leaves', or a layer with experts'), then
  // every member's.
  std::vector<float> leaf_sums_, all_leaf_sums_;
  std::vector<float> head_share_;  // a group member's logits of its share, before they are gathered
  // Latent attention: q_a's rows, q_b's (or q's), one head's rows gathered and computed, and
  // every head's value.
  std::vector<float> q_compressed_, head_queries_, head_in_, head_out_, head_values_;
  // With experts: router scores (row x expert), each row's choices (row x slot: expert and
  // weight), the slots' rows in the experts' order and their gate and up products (this
  // member's rows: gate's become the activations).
  std::vector<float> router_scores_, selection_, expert_in_, expert_gate_, expert_up_;
  std::vector<int> chosen_experts_;
  std::vector<float> chosen_weights_;
  std::vector<int> expert_order_;                  // choose_experts' scratch
  std::vector<tensor::MatmulJob> expert_jobs_;
  // The experts' activations and the shared expert's split into this member's leaves
  // (split_into_leaves), and their down's products of each leaf (of the experts', the leaves
  // run at once): leaf after leaf, slot after slot (in the experts' order) or row after row.
  // Each row's leaves weighed.
  std::vector<float> expert_leaf_in_, shared_leaf_in_, expert_leaves_, shared_leaves_, weighed_leaves_;
  std::vector<size_t> expert_starts_, expert_fill_, expert_slots_;  // the slots of each expert, in order
  std::vector<size_t> slot_positions_;  // of each slot (row * k + j), its place in the experts' order
  std::vector<int> positions_;   // per batch row: its position in its sequence
  std::vector<KvState*> row_kv_;  // per batch row: its sequence's cache
};

}  // namespace strata::model
