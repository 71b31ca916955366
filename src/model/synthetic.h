// Random-weight GGUF models of real shapes, for benchmarks, tests and the demo that needs no
// download. Their text is noise; the files say so (general.name and strata.synthetic).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::model {

struct SyntheticShape {
  const char* name;
  const char* description;
  const char* arch;  // general.architecture: "llama", "qwen2", "qwen3" or "qwen3moe"
  int vocab_size;
  int context_length;
  int embedding_dim;
  int layer_count;
  int head_count;
  int kv_head_count;
  int ffn_dim;
  float rope_freq_base;
  bool tied_output;
  int head_dim = 0;           // 0: embedding_dim / head_count
  int expert_count = 0;       // 0: a dense FFN
  int experts_per_token = 0;
  int expert_ffn_dim = 0;
};

std::span<const SyntheticShape> synthetic_shapes();
const SyntheticShape* find_synthetic_shape(std::string_view name);

// How the weight matrices are stored: one type for all, or a llama.cpp-style mix.
struct WeightTypes {
  std::string name;  // as given: "Q4_0", "Q4_K_M", ...
  tensor::DType base;
  tensor::DType important;  // output head, and attn_v / ffn_down in some layers for *_M mixes
  bool mixed = false;
  // The FFN's (experts') matrices when they differ from base: MXFP4's, as gpt-oss ships it,
  // with the rest Q8_0.
  std::optional<tensor::DType> ffn{};
};
// Accepts every computable type name and the mixes Q4_K_M and Q5_K_M; throws naming the choices.
WeightTypes parse_weight_types(std::string_view name);

// Writes the model to `path`. Same shape, types and seed give the same file. `progress` hears
// how many of its tensors' bytes are written (gguf::Writer::write). `layers`, when given, is
// how many of the shape's layers to write (a model of real dimensions that fits here).
void write_synthetic_model(const SyntheticShape& shape, const WeightTypes& types,
                           const std::string& path, uint64_t seed,
                           const gguf::Writer::Progress& progress = {}, int layers = 0);

}  // namespace strata::model
