#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "tensor/dtype.h"
#include "tensor/matmul.h"

namespace strata::model {
namespace {

int required_int(const gguf::File& file, const std::string& key, int min_value, int max_value) {
  const auto v = file.get_uint(key);
  if (!v) throw std::runtime_error("model metadata lacks '" + key + "'");
  if (*v < static_cast<uint64_t>(min_value) || *v > static_cast<uint64_t>(max_value)) {
    throw std::runtime_error("model metadata '" + key + "' = " + std::to_string(*v) +
                             " is out of range");
  }
  return static_cast<int>(*v);
}

// Which layers slide: the metadata's per-layer flags, or a period n (the metadata's, else the
// architecture's) in which all but the last layer of each n slide, as llama.cpp reads them.
std::vector<bool> layer_slides(const gguf::File& file, const std::string& key, int layer_count,
                                int default_period) {
  std::vector<bool> sliding(static_cast<size_t>(layer_count));
  if (const gguf::Array* flags = file.get_array(key)) {
    if (flags->items.size() != sliding.size()) {
      throw std::runtime_error("model metadata '" + key + "' has " + std::to_string(flags->items.size()) +
                               " entries for " + std::to_string(layer_count) + " layers");
    }
    for (size_t l = 0; l < sliding.size(); ++l) {
      const auto flag = flags->items[l].as_bool();
      if (!flag) throw std::runtime_error("model metadata '" + key + "' holds a value that is not a bool");
      sliding[l] = *flag;
    }
    return sliding;
  }
  const int period = file.find(key) ? required_int(file, key, 1, 4096) : default_period;
  for (int l = 0; l < layer_count; ++l) sliding[static_cast<size_t>(l)] = l % period < period - 1;
  return sliding;
}

// DeepSeek's multi-head latent attention. Files converted for MLA's absorption give
// key_length and value_length the cache's widths and name the heads' own (key_length_mla,
// value_length_mla); older ones give the heads' in key_length and value_length.
void read_latent_attention(const gguf::File& file, const std::string& p, Config& c) {
  constexpr int kMaxRank = 1 << 16;
  LatentAttention& mla = c.mla;
  mla.kv_rank = required_int(file, p + "attention.kv_lora_rank", 1, kMaxRank);
  mla.q_rank = file.find(p + "attention.q_lora_rank") ? required_int(file, p + "attention.q_lora_rank", 1, kMaxRank) : 0;
  c.rope_dim = required_int(file, p + "rope.dimension_count", 2, 4096);
  if (c.rope_dim % 2 != 0) throw std::runtime_error("rope.dimension_count must be even");
  const bool split_sizes = file.find(p + "attention.key_length_mla") != nullptr;
  const int key_dim = required_int(file, p + (split_sizes ? "attention.key_length_mla" : "attention.key_length"),
                                   c.rope_dim + 1, 4096);
  mla.nope_dim = key_dim - c.rope_dim;
  mla.value_dim = required_int(file, p + (split_sizes ? "attention.value_length_mla" : "attention.value_length"), 1, 4096);
  c.kv_head_count = 1;
  c.head_dim = mla.kv_rank + c.rope_dim;
  // The heads score over their own key size; with DeepSeek's YaRN the scores take mscale
  // twice (once for the query's, once for the key's), as llama.cpp reads these files.
  float mscale = 1.0f;
  if (c.yarn.factor > 0.0f) mscale = 1.0f + 0.1f * c.yarn.log_multiplier * std::log(c.yarn.factor);
  c.attention_scale = mscale * mscale / std::sqrt(static_cast<float>(key_dim));
}

}  // namespace

Config Config::from_gguf(const gguf::File& file) {
  Config c;
  const auto arch = file.get_string("general.architecture");
  if (!arch) throw std::runtime_error("model metadata lacks 'general.architecture'");
  c.arch_name = *arch;
  // Architectures with sliding-window layers: all but the last of each period slide, unless
  // the metadata says otherwise. 0: no sliding window.
  int sliding_period = 0;
  if (*arch == "llama") {
    c.rope_style = RopeStyle::AdjacentPairs;
  } else if (*arch == "qwen2") {
    c.rope_style = RopeStyle::Halves;
    c.has_qkv_bias = true;
  } else if (*arch == "qwen3" || *arch == "qwen3moe") {
    c.rope_style = RopeStyle::Halves;
    c.has_qk_norm = true;
  } else if (*arch == "gpt-oss") {
    c.rope_style = RopeStyle::Halves;
    c.has_qkv_bias = true;
    c.has_output_bias = true;
    c.has_attention_sinks = true;
    c.has_expert_biases = true;
    c.activation = Activation::ClampedSwiglu;
    // gpt-oss names its pre-FFN norm after the attention it follows.
    c.ffn_norm_name = "post_attention_norm";
    sliding_period = 2;
  } else if (*arch == "gemma3") {
    c.rope_style = RopeStyle::Halves;
    c.has_qk_norm = true;
    c.activation = Activation::Gelu;
    c.scales_embeddings = true;
    c.has_post_norms = true;
    c.sliding_rope_scaled = false;
    sliding_period = 6;
  } else if (*arch == "phi3") {
    c.rope_style = RopeStyle::Halves;
    c.fused_gate_up = true;
  } else if (*arch == "glm4moe") {
    c.rope_style = RopeStyle::Halves;
    c.has_qkv_bias = true;
    // GLM-4.5 (355B) normalizes each head of Q and K; GLM-4.5-Air does not.
    c.has_qk_norm = file.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
    c.ffn_norm_name = "post_attention_norm";
  } else if (*arch == "deepseek2") {
    c.rope_style = RopeStyle::AdjacentPairs;
  } else {
    throw std::runtime_error("unsupported model architecture '" + *arch +
                             "' (supported: llama, qwen2, qwen3, qwen3moe, gpt-oss, gemma3, phi3, glm4moe, deepseek2)");
  }
  const std::string p = *arch + ".";
  constexpr int kMaxDim = 1 << 20;
  c.embedding_dim = required_int(file, p + "embedding_length", 1, kMaxDim);
  const int block_count = required_int(file, p + "block_count", 1, 4096);
  c.skipped_layer_count =
      file.find(p + "nextn_predict_layers") ? required_int(file, p + "nextn_predict_layers", 0, block_count - 1) : 0;
  c.layer_count = block_count - c.skipped_layer_count;
  c.ffn_dim = required_int(file, p + "feed_forward_length", 1, kMaxDim);
  // Mixtral is a Llama with experts; Qwen3-MoE, gpt-oss and GLM-4.5 always have them.
  if (file.find(p + "expert_count") || *arch == "qwen3moe" || *arch == "gpt-oss" || *arch == "glm4moe") {
    c.expert_count = required_int(file, p + "expert_count", 1, 4096);
    c.experts_per_token = required_int(file, p + "expert_used_count", 1, c.expert_count);
    c.expert_ffn_dim = file.find(p + "expert_feed_forward_length")
                           ? required_int(file, p + "expert_feed_forward_length", 1, kMaxDim)
                           : c.ffn_dim;
  }
  const bool deepseek = *arch == "deepseek2";
  if (*arch == "glm4moe" || (deepseek && c.has_experts())) {
    // As llama.cpp reads them: GLM's gating sigmoid and DeepSeek's softmax (V2's, whose files
    // predate the key) unless the file says otherwise (llama.cpp's numbers: 0 unset, 1
    // softmax, 2 sigmoid), and weights neither normalized nor scaled unless it says so.
    // DeepSeek V3's selection bias is a tensor that V2's files lack.
    const int gating = file.find(p + "expert_gating_func") ? required_int(file, p + "expert_gating_func", 0, 2) : 0;
    c.expert_gating = gating == 2 || (gating == 0 && !deepseek) ? ExpertGating::Sigmoid : ExpertGating::Softmax;
    c.expert_weights_norm = file.get_bool(p + "expert_weights_norm").value_or(false);
    const double scale = file.get_float(p + "expert_weights_scale").value_or(1.0);
    if (!(scale > 0)) throw std::runtime_error("model metadata '" + p + "expert_weights_scale' must be positive");
    c.expert_weights_scale = static_cast<float>(scale);
    const int shared = file.find(p + "expert_shared_count") ? required_int(file, p + "expert_shared_count", 0, 64) : 0;
    c.shared_expert_ffn_dim = shared * c.expert_ffn_dim;
    // More leading dense layers than layers (a file of a model's first layers) make them all
    // dense, as llama.cpp reads it.
    c.leading_dense_layers = file.find(p + "leading_dense_block_count")
                                 ? required_int(file, p + "leading_dense_block_count", 0, 1 << 16)
                                 : 0;
    c.expert_selection_bias =
        !deepseek || file.find_tensor("blk." + std::to_string(c.leading_dense_layers) + ".exp_probs_b.bias");
    if (const gguf::Array* sections = file.get_array(p + "rope.dimension_sections")) {
      for (const gguf::Value& v : sections->items) {
        if (v.as_uint().value_or(0) != 0) {
          throw std::runtime_error("multimodal RoPE (" + p + "rope.dimension_sections, GLM-4.5V) is not supported");
        }
      }
    }
  }
  if (c.has_experts() && file.find(p + "expert_group_count")) {
    c.expert_group_count = required_int(file, p + "expert_group_count", 1, c.expert_count);
    if (c.expert_count % c.expert_group_count != 0) {
      throw std::runtime_error("model metadata '" + p + "expert_group_count' does not divide the experts");
    }
    c.expert_groups_used = required_int(file, p + "expert_group_used_count", 1, c.expert_group_count);
    if (c.expert_group_count > 1 &&
        (c.expert_count / c.expert_group_count < 2 ||
         c.experts_per_token > c.expert_groups_used * (c.expert_count / c.expert_group_count))) {
      throw std::runtime_error("model metadata '" + p + "expert_group_count' leaves groups of fewer than 2 experts, "
                               "or too few experts in the groups used");
    }
  }
  c.head_count = required_int(file, p + "attention.head_count", 1, 4096);
  c.kv_head_count = file.find(p + "attention.head_count_kv")
                        ? required_int(file, p + "attention.head_count_kv", 1, c.head_count)
                        : c.head_count;
  if (c.head_count % c.kv_head_count != 0) {
    throw std::runtime_error("attention.head_count is not a multiple of head_count_kv");
  }
  c.context_length = required_int(file, p + "context_length", 1, 1 << 24);
  c.head_dim = file.find(p + "attention.key_length")
                   ? required_int(file, p + "attention.key_length", 2, 4096)
                   : c.embedding_dim / c.head_count;
  if (c.head_dim % 2 != 0 || c.head_dim == 0) throw std::runtime_error("odd attention head size");
  c.rope_dim = file.find(p + "rope.dimension_count")
                   ? required_int(file, p + "rope.dimension_count", 2, c.head_dim)
                   : c.head_dim;
  if (c.rope_dim % 2 != 0) throw std::runtime_error("rope.dimension_count must be even");
  if (auto eps = file.get_float(p + "attention.layer_norm_rms_epsilon")) {
    c.rms_epsilon = static_cast<float>(*eps);
  }
  if (auto base = file.get_float(p + "rope.freq_base")) c.rope_freq_base = static_cast<float>(*base);
  if (!(c.rope_freq_base > 0)) throw std::runtime_error("rope.freq_base must be positive");
  // Gemma 3's local layers keep the base of 10000 unless the metadata names theirs.
  c.rope_freq_base_sliding = *arch == "gemma3" ? 10000.0f : c.rope_freq_base;
  if (auto base = file.get_float(p + "rope.freq_base_swa")) c.rope_freq_base_sliding = static_cast<float>(*base);
  if (!(c.rope_freq_base_sliding > 0)) throw std::runtime_error("rope.freq_base_swa must be positive");
  const auto scaling = file.get_string(p + "rope.scaling.type");
  if (scaling && (*scaling == "linear" || *scaling == "yarn")) {
    const auto factor = file.get_float(p + "rope.scaling.factor");
    if (!factor || !(*factor >= 1.0) || !(*factor <= 1e6)) {
      throw std::runtime_error(*scaling + " rope scaling needs rope.scaling.factor in [1, 1e6]");
    }
    if (*scaling == "linear") {
      c.rope_linear_scale = static_cast<float>(*factor);
    } else {
      c.yarn.factor = static_cast<float>(*factor);
      c.yarn.original_context = file.find(p + "rope.scaling.original_context_length")
                                    ? required_int(file, p + "rope.scaling.original_context_length", 1, 1 << 24)
                                    : c.context_length;
      for (auto [key, value] : {std::pair{"rope.scaling.yarn_beta_fast", &c.yarn.beta_fast},
                                std::pair{"rope.scaling.yarn_beta_slow", &c.yarn.beta_slow}}) {
        if (auto v = file.get_float(p + key)) *value = static_cast<float>(*v);
        if (!(*value > 0 && *value < 1e6)) throw std::runtime_error(p + key + " must be positive");
      }
      for (const char* key : {"rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor",
                              "rope.scaling.yarn_log_multiplier"}) {
        if (file.find(p + key) && !(deepseek && std::string_view(key) == "rope.scaling.yarn_log_multiplier")) {
          throw std::runtime_error("unsupported YaRN parameter '" + p + key + "'");
        }
      }
      // DeepSeek's converter writes 0.1 mscale_all_dim, as llama.cpp reads it back.
      if (auto v = deepseek ? file.get_float(p + "rope.scaling.yarn_log_multiplier") : std::nullopt) {
        if (!(*v >= 0.0 && *v < 100.0)) throw std::runtime_error(p + "rope.scaling.yarn_log_multiplier is out of range");
        c.yarn.log_multiplier = static_cast<float>(*v) / 0.1f;
      }
    }
  } else if (scaling && *scaling != "none") {
    throw std::runtime_error("unsupported rope scaling type '" + *scaling + "'");
  }
  if (auto factor = file.get_float(p + "rope.scaling.attn_factor")) {
    if (!(*factor > 0.0 && *factor < 100.0)) throw std::runtime_error(p + "rope.scaling.attn_factor is out of range");
    c.rope_attention_factor = static_cast<float>(*factor);
  }
  const bool long_factors = file.find_tensor("rope_factors_long.weight") != nullptr;
  if (long_factors != (file.find_tensor("rope_factors_short.weight") != nullptr)) {
    throw std::runtime_error("LongRoPE needs both rope_factors_long and rope_factors_short");
  }
  if (long_factors) {
    const int original = file.find(p + "rope.scaling.original_context_length")
                             ? required_int(file, p + "rope.scaling.original_context_length", 1, 1 << 24)
                             : c.context_length;
    c.rope_factors = c.context_length > original ? Config::RopeFactors::Long : Config::RopeFactors::Short;
  } else if (file.find_tensor("rope_freqs.weight")) {
    c.rope_factors = Config::RopeFactors::Freqs;
  }
  // A Gemma 3 without a window (its sliding_window_pattern of 1) has only global layers.
  if (sliding_period > 0 && (*arch != "gemma3" || file.find(p + "attention.sliding_window"))) {
    c.sliding_window = required_int(file, p + "attention.sliding_window", 1, 1 << 24);
    c.sliding_layers = layer_slides(file, p + "attention.sliding_window_pattern", c.layer_count, sliding_period);
  }
  if (deepseek) read_latent_attention(file, p, c);
  if (*arch == "gemma3") {
    // Gemma 3 scales queries by its query_pre_attn_scalar, which GGUF does not carry: the
    // head size, but width / heads for the 27B (62 layers), as llama.cpp reads these files.
    c.attention_scale = 1.0f / std::sqrt(static_cast<float>(
                                   c.layer_count == 62 ? c.embedding_dim / c.head_count : c.head_dim));
  }
  if (auto cap = *arch == "gemma3" ? file.get_float(p + "final_logit_softcapping") : std::nullopt) {
    if (!(*cap >= 0.0 && *cap < 1e6)) throw std::runtime_error(p + "final_logit_softcapping is out of range");
    c.logit_softcap = static_cast<float>(*cap);
  }
  if (file.find(p + "pooling_type")) {
    c.pooling = static_cast<Pooling>(required_int(file, p + "pooling_type", 0, static_cast<int>(Pooling::Rank)));
  }
  if (const gguf::Array* tokens = file.get_array("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int>(tokens->items.size());
  }
  if (auto v = file.get_uint(p + "vocab_size")) c.vocab_size = static_cast<int>(*v);
  if (c.vocab_size <= 0) throw std::runtime_error("model has no vocabulary size");
  for (const gguf::TensorInfo& t : file.tensors()) {
    const bool dense = t.name.ends_with(".attn_output.weight") || t.name.ends_with(".ffn_down.weight");
    const bool experts = t.name.ends_with(".ffn_down_exps.weight") || t.name.ends_with(".ffn_down_shexp.weight");
    if (!dense && !experts) continue;
    if (const auto info = tensor::dtype_info(t.type); !info || !info->computable) {
      continue;
    } else if (dense) {
      c.projection_block =
          std::max(c.projection_block, static_cast<int>(tensor::leaf_unit(static_cast<tensor::DType>(t.type))));
    } else {
      c.expert_down_block = std::max(c.expert_down_block, static_cast<int>(info->block_elements));
    }
  }
  return c;
}

}  // namespace strata::model
