// Random-weight GGUF models of real shapes, for benchmarks, tests and the demo that needs no
// download. Their text is noise (or, with copying weights, a copy); the files say so
// (general.name and strata.synthetic).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::model {

struct SyntheticShape {
  const char* name;
  const char* description;
  const char* arch;  // general.architecture: "llama", "qwen2", "qwen3", "qwen3moe", "gpt-oss", "gemma3",
                     // "phi3", "glm4moe" or "deepseek2"
  int vocab_size;
  int context_length;
  int embedding_dim;
  int layer_count;
  int head_count;
  int kv_head_count;
  int ffn_dim;
  float rope_freq_base;
  bool tied_output;
  int head_dim = 0;           // 0: embedding_dim / head_count (deepseek2: a head's query and key)
  int expert_count = 0;       // 0: a dense FFN
  int experts_per_token = 0;
  int expert_ffn_dim = 0;
  // GLM-4.5's and DeepSeek's kind of Mixture of Experts, and GLM's attention (glm4moe only, but qk_norm):
  int shared_expert_count = 0;     // experts every token runs, of expert_ffn_dim each
  int leading_dense_layers = 0;    // the first layers' FFN is dense, of ffn_dim
  int nextn_layers = 0;            // NextN layers written after the layers (`--layers` counts the others)
  int rope_dim = 0;                // 0: all of head_dim
  float expert_weights_scale = 1.0f;
  bool qk_norm = false;            // Q and K normalized per head (Qwen3 always)
  int sliding_window = 0;          // gpt-oss: the even layers' window; gemma3: 5 of every 6 layers'
  float rope_linear_factor = 0.0f; // > 0: linear RoPE scaling (Gemma 3: its global layers only)
  // deepseek2: latent attention (q_lora_rank 0: queries straight from the input), DeepSeek's
  // routing (V2's softmax or V3's sigmoid with a selection bias; groups of experts), YaRN.
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int value_head_dim = 0;
  bool sigmoid_gating = false;
  bool expert_weights_norm = false;
  int expert_groups = 0;
  int expert_groups_used = 0;
  float yarn_factor = 0.0f;
  int yarn_original_context = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_mscale_all_dim = 0.0f;
  // An embedding model's (GGUF's pooling_type, as model::Pooling numbers it); its texts end with
  // eos (tokenizer.ggml.add_eos_token). 0: a model that generates text.
  int pooling_type = 0;
  // > 0: LongRoPE (phi3) over this original context: rope_factors_long and _short, and the
  // attention factor llama.cpp's converter computes from the two contexts.
  int long_rope_original_context = 0;
};

std::span<const SyntheticShape> synthetic_shapes();
const SyntheticShape* find_synthetic_shape(std::string_view name);

// The matrices whose type llama.cpp's mixes, or synth's MXFP4, choose apart from the rest.
// FfnGateUp and FfnDown: a dense FFN's, the experts' or the shared experts'.
enum class MatrixRole { AttnV, AttnOutput, FfnGateUp, FfnDown, Output, Other };

// How the weight matrices are stored: one type for all, or a llama.cpp-style mix.
struct WeightTypes {
  enum class Mix {
    None,
    MoreBits,  // Q4_K_M, Q5_K_M: Q6_K for the output head, and attn_v / ffn_down in some layers
    Q3_K_M,    // Q4_K for attn_output, Q4_K or (first layers) Q5_K for attn_v / ffn_down, Q6_K head
    Mxfp4,     // MXFP4 for the FFN's (experts') matrices, as gpt-oss ships it; the rest base, Q8_0
  };
  std::string name;  // as given: "Q4_0", "Q4_K_M", ...
  tensor::DType base;
  Mix mix = Mix::None;
  tensor::DType type_of(MatrixRole role, int layer, int layer_count) const;
};
// Accepts every computable type name but MXFP4's, the mixes Q3_K_M, Q4_K_M and Q5_K_M, and
// MXFP4 for Mix::Mxfp4; throws naming the choices.
WeightTypes parse_weight_types(std::string_view name);

// Random weights, or hand-set ones that copy (model/copying_weights.h): a Llama shape that
// repeats what it has read, for measuring speculative decoding where drafts can be right.
enum class SyntheticWeights { Random, Copying };

// Writes the model to `path`. Same shape, types and seed give the same file. `progress` hears
// how many of its tensors' bytes are written (gguf::Writer::write). `layers`, when given, is
// how many of the shape's layers to write (a model of real dimensions that fits here).
void write_synthetic_model(const SyntheticShape& shape, const WeightTypes& types,
                           const std::string& path, uint64_t seed,
                           const gguf::Writer::Progress& progress = {}, int layers = 0,
                           SyntheticWeights weights = SyntheticWeights::Random);

}  // namespace strata::model
