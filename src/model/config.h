// Hyper-parameters of a Llama-family model (Llama, Mixtral, Qwen2, Qwen3, Qwen3-MoE, gpt-oss,
// Gemma 3, Phi-3, GLM-4.5, DeepSeek V2/V3 and Kimi K2), read and validated from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/pooling.h"

namespace strata::model {

// Which dimensions RoPE rotates together: Llama GGUFs are converted for adjacent pairs
// (x[2i], x[2i+1]); Qwen2 keeps the NeoX halves (x[i], x[i + d/2]).
enum class RopeStyle { AdjacentPairs, Halves };

// YaRN context extension (gpt-oss): pair i's frequency blends the interpolated frequency
// (divided by `factor`) and the original one by a ramp over the pairs between the correction
// dimensions of beta_fast and beta_slow rotations within original_context positions, and
// both cos and sin are scaled by 1 + 0.1 ln(factor), as llama.cpp's ggml_rope_ext does.
struct Yarn {
  float factor = 0.0f;  // 0: no YaRN
  int original_context = 0;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  // DeepSeek's mscale_all_dim m (GGUF's rope.scaling.yarn_log_multiplier / 0.1); 0: none. With
  // it cos and sin keep their size, and the attention scale takes (1 + 0.1 m ln(factor))^2, as
  // DeepSeek defines it. (Without it llama.cpp would also square 1 + 0.1 ln(factor) into the
  // scale of a deepseek2 file; Strata keeps the definition's plain YaRN.)
  float log_multiplier = 0.0f;
};

// Multi-head latent attention (DeepSeek V2/V3): every head's key and value are linear in one
// latent vector per position, RMS-normalized, kv_rank wide, beside a key part of rope_dim that
// RoPE rotates and all heads share. Each head's query is nope_dim + rope_dim wide (the part
// without RoPE first), from the input itself or through a normalized bottleneck of q_rank.
// Strata caches only the latent and the rotated part: a head's query part without RoPE is
// taken into the latent's space (attn_k_b), the heads attend over the cache as one KV head of
// kv_rank + rope_dim, and each head's output in the latent's space is taken to its value of
// value_dim (attn_v_b).
struct LatentAttention {
  int q_rank = 0;  // 0: the queries are a projection of the input (attn_q)
  int kv_rank = 0;
  int nope_dim = 0;
  int value_dim = 0;
};

// What a layer's FFN computes from its gate g and up u projections.
enum class Activation {
  Silu,         // silu(g) * u
  ClampedSwiglu, // gpt-oss: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)
  Gelu           // Gemma: gelu(g) * u, GELU's tanh form
};
// How a Mixture-of-Experts router's scores become probabilities: a softmax over the experts
// (Mixtral, Qwen3-MoE), or each expert's own sigmoid (GLM-4.5).
enum class ExpertGating { Softmax, Sigmoid };

struct Config {
  std::string arch_name;
  int vocab_size = 0;
  int context_length = 0;  // what the model was trained for
  int embedding_dim = 0;
  int layer_count = 0;
  int ffn_dim = 0;
  int head_count = 0;
  int kv_head_count = 0;
  int head_dim = 0;  // of a query and a KV head's key, as the attention scores them
  int rope_dim = 0;  // leading dimensions of each head that RoPE rotates (with MLA: its own part)
  float rms_epsilon = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_linear_scale = 1.0f;  // positions are divided by this ("linear" rope scaling)
  // cos and sin are multiplied by this (rope.scaling.attn_factor: LongRoPE's sqrt(1 + ln s / ln n)).
  float rope_attention_factor = 1.0f;
  // LongRoPE (Phi-3-mini-128k, Phi-3.5, Phi-4-mini) divides each pair's frequency by a factor of
  // the file's: rope_factors_long for a context beyond the original one, as llama.cpp chooses
  // them, else rope_factors_short. Strata chooses by the model's trained context, not the
  // served one, so that every node of a cluster makes the same choice.
  enum class RopeFactors { None, Freqs, Long, Short };  // Freqs: Llama 3.1's rope_freqs
  RopeFactors rope_factors = RopeFactors::None;
  RopeStyle rope_style = RopeStyle::AdjacentPairs;
  Yarn yarn;
  // Layers with sliding-window attention see only the last `sliding_window` positions (their
  // own included); sliding_layers[l] says which layers. 0: every layer sees every position.
  int sliding_window = 0;
  std::vector<bool> sliding_layers;
  float rope_freq_base_sliding = 10000.0f;  // the sliding layers' RoPE base
  bool sliding_rope_scaled = true;  // whether the sliding layers' RoPE takes the scaling too
  float attention_scale = 0.0f;     // of the query-key products; 0: 1 / sqrt(head_dim)
  // Gemma: the embeddings are multiplied by sqrt(embedding_dim), the attention and FFN outputs
  // RMS-normalized (post_attention_norm, post_ffw_norm) before they join the residual, and
  // the logits softly capped to (-cap, cap) by cap * tanh(logit / cap) when cap > 0.
  bool scales_embeddings = false;
  bool has_post_norms = false;
  float logit_softcap = 0.0f;
  bool has_qkv_bias = false;
  bool has_output_bias = false;      // attn_output.bias
  bool has_attention_sinks = false;  // a learned logit per head that joins every softmax (gpt-oss)
  bool has_expert_biases = false;    // router and experts' gate, up and down biases (gpt-oss)
  Activation activation = Activation::Silu;
  bool has_qk_norm = false;  // each head of Q and K is RMS-normalized before RoPE (Qwen3)
  // The FFN's gate and up are one matrix (ffn_up) of 2 ffn_dim rows, gate first (Phi-3).
  bool fused_gate_up = false;
  // The name of the RMS norm before the FFN, "blk.N.<name>.weight": GLM's converter keeps
  // Hugging Face's post_attention_layernorm as post_attention_norm.
  std::string ffn_norm_name = "ffn_norm";
  // A Mixture-of-Experts FFN: each token runs `experts_per_token` of `expert_count` experts
  // (FFNs of `expert_ffn_dim`) and sums their outputs weighted by their router probabilities
  // (expert_gating of the router's scores), divided by their sum when expert_weights_norm,
  // then times expert_weights_scale. The choice is the k largest probabilities, each plus its
  // expert's bias (blk.N.exp_probs_b) when expert_selection_bias. 0: one dense FFN of ffn_dim.
  int expert_count = 0;
  int experts_per_token = 0;
  int expert_ffn_dim = 0;
  ExpertGating expert_gating = ExpertGating::Softmax;
  bool expert_selection_bias = false;
  bool expert_weights_norm = true;
  float expert_weights_scale = 1.0f;
  // Group-limited routing (DeepSeek V3): the experts fall into expert_group_count equal groups
  // in index order, each group scores the sum of its two best ranked scores, and a token's k
  // experts come from the expert_groups_used best groups only (ties to the lower index).
  // 0: one group.
  int expert_group_count = 0;
  int expert_groups_used = 0;
  // Beside the chosen experts every token runs a shared one (ffn_*_shexp) of this width; 0: none.
  int shared_expert_ffn_dim = 0;
  // The first layers of a model with experts have a dense FFN of ffn_dim instead (GLM-4.5,
  // DeepSeek).
  int leading_dense_layers = 0;
  // Blocks of the file after the model's layer_count that inference skips: GLM's NextN layers,
  // for multi-token prediction, whose tensors no forward pass reads.
  int skipped_layer_count = 0;
  // With latent attention, one KV head whose keys (head_dim) are the latent and the rotated
  // part, and whose values are the keys' latent.
  LatentAttention mla;
  // An embedding model's pooling (`pooling_type`); None for a model that generates text.
  Pooling pooling = Pooling::None;
  // The largest unit of columns (tensor::leaf_unit) of any layer's attn_output and ffn_down
  // weights: the leaves their inputs are cut into (projection_leaves) are whole units of each.
  int projection_block = 1;
  // The largest block of any layer's experts' and shared expert's down weights: the leaves
  // their inputs are cut into are whole blocks of each (each leaf a matrix of its own).
  int expert_down_block = 1;

  bool has_latent_attention() const { return mla.kv_rank > 0; }
  // The width of a KV head's values in the cache (its keys' is head_dim): none with latent
  // attention, whose values are its keys' leading kv_rank, the latent.
  int cached_value_dim() const { return has_latent_attention() ? 0 : head_dim; }

  int kv_dim() const { return kv_head_count * head_dim; }
  bool is_sliding(int layer) const {
    return sliding_window > 0 && sliding_layers[static_cast<size_t>(layer)];
  }
  bool has_experts() const { return expert_count > 0; }
  bool layer_has_experts(int layer) const { return has_experts() && layer >= leading_dense_layers; }
  // The rows of a dense FFN the model runs: 0 where every layer has experts.
  int dense_ffn_dim() const { return has_experts() && leading_dense_layers == 0 ? 0 : ffn_dim; }
  // Of a tensor (or tensors) holding all the experts of a layer, the bytes one token reads:
  // its experts_per_token experts', each of the same size.
  uint64_t expert_bytes_read(uint64_t all_experts_bytes) const {
    return all_experts_bytes / static_cast<uint64_t>(expert_count) * static_cast<uint64_t>(experts_per_token);
  }
  int q_dim() const { return head_count * head_dim; }

  // Throws std::runtime_error naming the missing or inconsistent key.
  static Config from_gguf(const gguf::File& file);
};

// The layers one node holds: [first, last). The first range also holds the token embedding,
// the last one the output norm and head.
struct LayerRange {
  int first = 0;
  int last = 0;
  bool has_embedding() const { return first == 0; }
  bool has_head(const Config& c) const { return last == c.layer_count; }
  int size() const { return last - first; }
  bool operator==(const LayerRange&) const = default;
};

}  // namespace strata::model
