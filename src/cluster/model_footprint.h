// What a model asks of the stages that hold it, read from its GGUF file: the bytes each layer,
// the embedding and the head hold and a token reads, and the KV a position keeps. Which part of
// the model a tensor is follows one rule, by its name, shared by placement, fetching and the
// weights a node reports.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace strata::cluster {

// What a model needs, per part that a stage may hold. Memory counts every byte a stage holds;
// speed, the bytes it reads per token.
struct ModelFootprint {
  int layer_count = 0;
  std::vector<uint64_t> layer_weight_bytes;  // one entry per layer: every byte of its tensors
  uint64_t embedding_bytes = 0;              // token embedding: first stage only (a token reads one row)
  uint64_t head_bytes = 0;                   // output norm and matrix: last stage only, read whole
  uint64_t kv_bytes_per_layer_per_token = 0;
  // Per layer, whether it has a sliding window (gpt-oss's even layers, 5 of Gemma 3's 6): such
  // a layer keeps at most window_kv_tokens positions (its sequences' windows and steps) where
  // the others keep the request's kv_tokens. Empty: none slides. 0: as many as the others.
  std::vector<bool> sliding_layers;
  uint64_t window_kv_tokens = 0;
  // Per layer, the bytes one token reads: of a Mixture-of-Experts layer only the experts it
  // runs (expert_used_count of expert_count), far less than it holds. Empty: every byte (a
  // dense model).
  std::vector<uint64_t> layer_read_bytes;
  // Per layer, the bytes of the rows a tensor-parallel group gathers for one token (its
  // members' sums of o's and of the FFN's down's leaves, two rows of the embedding each, and two
  // more for a shared expert's); and at the head, one logits row. Empty: not known, and groups
  // are not considered.
  std::vector<uint64_t> layer_gathered_bytes;
  uint64_t head_gathered_bytes = 0;
  // Per layer, how many gathers a group makes for a token, one after another (the head makes
  // one more): 2 (o's sums, then the FFN's: a dense down's, or the experts' and the shared
  // expert's together). Empty: not known.
  std::vector<uint64_t> layer_gathers;
};

// What part of the model a tensor is, by its name: the one rule that placement, fetching and
// the weights a node reports all follow.
struct TensorRole {
  enum Kind {
    Layer,         // blk.N.*: read by the stage that runs layer N
    Embedding,     // token_embd: the first stage (and the last, when the head is tied)
    OutputMatrix,  // output.weight: the last stage
    OutputNorm,    // output_norm: the last stage
    Shared,        // anything else (rope_freqs): every stage reads it
    Unused,        // blk.N.* of a block after the model's layers (GLM's NextN): no stage reads it
  };
  Kind kind = Shared;
  int layer = -1;  // for Layer
  // For Layer: a tensor of experts (blk.N.ffn_gate_exps, _up_exps, _down_exps, their biases),
  // the expert count its last dimension, of which a token reads only the experts it runs.
  bool experts = false;
};
// `skipped_layer_count` blocks follow the `layer_count` layers (Config::skipped_layer_count).
// Throws std::runtime_error for a blk. name that names no block of them.
TensorRole role_of_tensor(std::string_view name, int layer_count, int skipped_layer_count = 0);

// Sizes from the file's metadata and tensor table (blk.N.* per layer; a head tied to token_embd
// still costs its bytes on the last stage). A layer's tensors of experts are read at
// expert_used_count / expert_count of their bytes. Throws std::runtime_error for a file that is
// not a model, or whose tensors of experts do not match its expert count.
ModelFootprint footprint_of(const gguf::File& file);

}  // namespace strata::cluster
