#include "model/synthetic.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include "gguf/gguf.h"
#include "model/copying_weights.h"
#include "tensor/quant.h"
#include "tensor/thread_pool.h"

namespace strata::model {
namespace {

constexpr std::array<SyntheticShape, 31> kShapes{{
    {"tinyllama-1.1b", "TinyLlama-1.1B (Llama 2 architecture, GQA 32/4)", "llama", 32000, 2048,
     2048, 22, 32, 4, 5632, 10000.0f, false},
    {"llama-3.2-1b", "Llama-3.2-1B (GQA 32/8, 128k vocabulary, tied head)", "llama", 128256,
     131072, 2048, 16, 32, 8, 8192, 500000.0f, true},
    {"llama-110m", "a ~110M Llama (the stories110M shape)", "llama", 32000, 1024, 768, 12, 12,
     12, 2048, 10000.0f, false},
    {"qwen2-tiny", "a small Qwen2 (q/k/v biases, NeoX RoPE)", "qwen2", 1024, 512, 256, 2, 4, 2,
     512, 1000000.0f, true},
    {"demo", "a small Llama for trying Strata without a download", "llama", 4096, 512, 256, 4,
     4, 2, 768, 10000.0f, false},
    {"qwen3-0.6b", "Qwen3-0.6B (QK-norm, head size 128 beside a width of 1024, tied head)", "qwen3", 151936,
     40960, 1024, 28, 16, 8, 3072, 1000000.0f, true, 128},
    {"qwen3-30b-a3b", "Qwen3-30B-A3B (Mixture of Experts: 8 of 128 experts of 768, QK-norm)", "qwen3moe",
     151936, 40960, 2048, 48, 32, 4, 6144, 1000000.0f, false, 128, 128, 8, 768},
    {"mixtral-8x7b", "Mixtral-8x7B (a Llama with 2 of 8 experts of 14336)", "llama", 32000, 32768, 4096, 32,
     32, 8, 14336, 1000000.0f, false, 0, 8, 2, 14336},
    {"qwen3-tiny", "a small Qwen3 (QK-norm, heads of 64 beside a width of 128), for tests", "qwen3", 2048, 512,
     128, 4, 4, 2, 256, 1000000.0f, true, 64},
    {.name = "qwen3-embedding-0.6b",
     .description = "Qwen3-Embedding-0.6B (Qwen3-0.6B's shape; the last token's row, eos-terminated, is the embedding)",
     .arch = "qwen3", .vocab_size = 151669, .context_length = 32768, .embedding_dim = 1024, .layer_count = 28,
     .head_count = 16, .kv_head_count = 8, .ffn_dim = 3072, .rope_freq_base = 1000000.0f, .tied_output = true,
     .head_dim = 128, .pooling_type = 3},
    {.name = "qwen3-embedding-tiny",
     .description = "a small Qwen3 embedding model (qwen3-tiny's shape, last-token pooling), for tests",
     .arch = "qwen3", .vocab_size = 2048, .context_length = 512, .embedding_dim = 128, .layer_count = 4,
     .head_count = 4, .kv_head_count = 2, .ffn_dim = 256, .rope_freq_base = 1000000.0f, .tied_output = true,
     .head_dim = 64, .pooling_type = 3},
    {"qwen3moe-tiny", "a small Qwen3-MoE (2 of 8 experts of 64), for tests", "qwen3moe", 2048, 512, 128, 4, 4, 2,
     256, 1000000.0f, false, 32, 8, 2, 64},
    {"gpt-oss-20b", "gpt-oss-20b (4 of 32 experts of 2880, attention sinks, every other layer a window of 128)",
     "gpt-oss", 201088, 131072, 2880, 24, 64, 8, 2880, 150000.0f, false, 64, 32, 4, 2880, 0, 0, 0, 0, 1.0f, false, 128},
    {"gpt-oss-120b", "gpt-oss-120b (4 of 128 experts of 2880, attention sinks, every other layer a window of 128)",
     "gpt-oss", 201088, 131072, 2880, 36, 64, 8, 2880, 150000.0f, false, 64, 128, 4, 2880, 0, 0, 0, 0, 1.0f, false, 128},
    {"gpt-oss-tiny", "a small gpt-oss (4 of 32 experts of 64, sinks, YaRN, a window of 12 in the even layers), for tests",
     "gpt-oss", 2048, 512, 128, 4, 4, 2, 64, 150000.0f, false, 32, 32, 4, 64, 0, 0, 0, 0, 1.0f, false, 12},
    {"gemma-3-1b", "Gemma 3 1B (5 local layers of a window of 512 to 1 global, GeGLU, QK-norm, tied head)",
     "gemma3", 262144, 32768, 1152, 26, 4, 1, 6912, 1000000.0f, true, 256, 0, 0, 0, 0, 0, 0, 0, 1.0f, true, 512},
    {"gemma-3-4b", "Gemma 3 4B (5 local layers of a window of 1024 to 1 global, linear RoPE scaling of 8)",
     "gemma3", 262144, 131072, 2560, 34, 8, 4, 10240, 1000000.0f, true, 256, 0, 0, 0, 0, 0, 0, 0, 1.0f, true, 1024, 8.0f},
    {"gemma-3-27b", "Gemma 3 27B (queries scaled by width / heads, 5 local layers to 1 global)", "gemma3", 262144,
     131072, 5376, 62, 32, 16, 21504, 1000000.0f, true, 128, 0, 0, 0, 0, 0, 0, 0, 1.0f, true, 1024, 8.0f},
    {"gemma3-tiny", "a small Gemma 3 (6 layers, a window of 12 in 5 of them, RoPE scaling on the global one), for tests",
     "gemma3", 2048, 512, 128, 6, 4, 2, 256, 1000000.0f, true, 32, 0, 0, 0, 0, 0, 0, 0, 1.0f, true, 12, 8.0f},
    {"phi-3-mini", "Phi-3-mini-4k (fused QKV and gate-up, 32 heads of 96)", "phi3", 32064, 4096, 3072, 32, 32, 32,
     8192, 10000.0f, false},
    {"phi-4", "Phi-4 14B (fused QKV and gate-up, GQA 40/10, 100k vocabulary)", "phi3", 100352, 16384, 5120, 40, 40,
     10, 17920, 250000.0f, false},
    {"phi3-tiny", "a small Phi-3 (fused QKV and gate-up, GQA 4/2), for tests", "phi3", 2048, 512, 128, 4, 4, 2, 256,
     10000.0f, false},
    {.name = "phi-3.5-mini",
     .description = "Phi-3.5-mini (Phi-3-mini's shape with LongRoPE to 128k from 4k)",
     .arch = "phi3", .vocab_size = 32064, .context_length = 131072, .embedding_dim = 3072, .layer_count = 32,
     .head_count = 32, .kv_head_count = 32, .ffn_dim = 8192, .rope_freq_base = 10000.0f, .tied_output = false,
     .long_rope_original_context = 4096},
    // An original context of 64: llama.cpp's check, which runs with a context of about 100,
    // takes the long factors too.
    {.name = "phi3-longrope-tiny",
     .description = "a small Phi-3 with LongRoPE (to 4096 from 64), for tests",
     .arch = "phi3", .vocab_size = 2048, .context_length = 4096, .embedding_dim = 128, .layer_count = 4,
     .head_count = 4, .kv_head_count = 2, .ffn_dim = 256, .rope_freq_base = 10000.0f, .tied_output = false,
     .long_rope_original_context = 64},
    {"glm-4.5-air", "GLM-4.5-Air (1 dense layer, then 8 of 128 experts of 1408 and a shared one; a NextN layer)",
     "glm4moe", 151552, 131072, 4096, 46, 96, 8, 10944, 1000000.0f, false, 128, 128, 8, 1408, 1, 1, 1, 64},
    {"glm4moe-tiny",
     "a small GLM-4.5 (a dense layer, then 2 of 8 experts of 64 and a shared one, scaled by 2.5; QK-norm, half-rotated "
     "heads of 64 beside a width of 128; a NextN layer), for tests",
     "glm4moe", 2048, 512, 128, 4, 4, 2, 256, 1000000.0f, false, 64, 8, 2, 64, 1, 1, 1, 32, 2.5f, true},
    // DeepSeek's as llama.cpp's converter writes them from the released configs.
    {.name = "deepseek-v3",
     .description = "DeepSeek-V3/R1 671B (latent attention, 3 dense layers, then 8 of 256 experts in 4 of 8 groups "
                    "and a shared one; YaRN)",
     .arch = "deepseek2", .vocab_size = 129280, .context_length = 163840, .embedding_dim = 7168, .layer_count = 61,
     .head_count = 128, .kv_head_count = 1, .ffn_dim = 18432, .rope_freq_base = 10000.0f, .tied_output = false,
     .head_dim = 192, .expert_count = 256, .experts_per_token = 8, .expert_ffn_dim = 2048, .shared_expert_count = 1,
     .leading_dense_layers = 3, .rope_dim = 64, .expert_weights_scale = 2.5f, .q_lora_rank = 1536,
     .kv_lora_rank = 512, .value_head_dim = 128, .sigmoid_gating = true, .expert_weights_norm = true,
     .expert_groups = 8, .expert_groups_used = 4, .yarn_factor = 40.0f, .yarn_original_context = 4096,
     .yarn_mscale_all_dim = 1.0f},
    {.name = "kimi-k2",
     .description = "Kimi K2 1T (DeepSeek V3's architecture: 64 heads, 1 dense layer, then 8 of 384 experts and a "
                    "shared one)",
     .arch = "deepseek2", .vocab_size = 163840, .context_length = 131072, .embedding_dim = 7168, .layer_count = 61,
     .head_count = 64, .kv_head_count = 1, .ffn_dim = 18432, .rope_freq_base = 50000.0f, .tied_output = false,
     .head_dim = 192, .expert_count = 384, .experts_per_token = 8, .expert_ffn_dim = 2048, .shared_expert_count = 1,
     .leading_dense_layers = 1, .rope_dim = 64, .expert_weights_scale = 2.827f, .q_lora_rank = 1536,
     .kv_lora_rank = 512, .value_head_dim = 128, .sigmoid_gating = true, .expert_weights_norm = true,
     .expert_groups = 1, .expert_groups_used = 1, .yarn_factor = 32.0f, .yarn_original_context = 4096,
     .yarn_beta_fast = 1.0f, .yarn_mscale_all_dim = 1.0f},
    {.name = "deepseek-v2-lite",
     .description = "DeepSeek-V2-Lite 16B (latent attention without a query bottleneck, 1 dense layer, then 6 of 64 "
                    "experts by softmax and 2 shared ones; YaRN)",
     .arch = "deepseek2", .vocab_size = 102400, .context_length = 163840, .embedding_dim = 2048, .layer_count = 27,
     .head_count = 16, .kv_head_count = 1, .ffn_dim = 10944, .rope_freq_base = 10000.0f, .tied_output = false,
     .head_dim = 192, .expert_count = 64, .experts_per_token = 6, .expert_ffn_dim = 1408, .shared_expert_count = 2,
     .leading_dense_layers = 1, .rope_dim = 64, .expert_weights_scale = 1.0f, .kv_lora_rank = 512,
     .value_head_dim = 128, .expert_groups = 1, .expert_groups_used = 1, .yarn_factor = 40.0f,
     .yarn_original_context = 4096, .yarn_mscale_all_dim = 0.707f},
    {.name = "deepseek2-tiny",
     .description = "a small DeepSeek V3 (latent attention of rank 64 with a query bottleneck, a dense layer, then 4 "
                    "of 16 experts in 2 of 4 groups and a shared one, YaRN), for tests",
     .arch = "deepseek2", .vocab_size = 2048, .context_length = 512, .embedding_dim = 128, .layer_count = 4,
     .head_count = 4, .kv_head_count = 1, .ffn_dim = 256, .rope_freq_base = 10000.0f, .tied_output = false,
     .head_dim = 48, .expert_count = 16, .experts_per_token = 4, .expert_ffn_dim = 64, .shared_expert_count = 1,
     .leading_dense_layers = 1, .rope_dim = 16, .expert_weights_scale = 2.5f, .q_lora_rank = 64, .kv_lora_rank = 64,
     .value_head_dim = 32, .sigmoid_gating = true, .expert_weights_norm = true, .expert_groups = 4,
     .expert_groups_used = 2, .yarn_factor = 40.0f, .yarn_original_context = 64, .yarn_mscale_all_dim = 1.0f},
    {.name = "deepseek2-lite-tiny",
     .description = "a small DeepSeek-V2-Lite (latent attention without a query bottleneck, a dense layer, then 3 of "
                    "8 experts by softmax and 2 shared ones, YaRN; V2-Lite's 27 layers, by which llama.cpp tells "
                    "a file without the bottleneck), for tests",
     .arch = "deepseek2", .vocab_size = 2048, .context_length = 512, .embedding_dim = 128, .layer_count = 27,
     .head_count = 4, .kv_head_count = 1, .ffn_dim = 256, .rope_freq_base = 10000.0f, .tied_output = false,
     .head_dim = 48, .expert_count = 8, .experts_per_token = 3, .expert_ffn_dim = 64, .shared_expert_count = 2,
     .leading_dense_layers = 1, .rope_dim = 16, .expert_weights_scale = 1.0f, .kv_lora_rank = 64,
     .value_head_dim = 32, .expert_groups = 1, .expert_groups_used = 1, .yarn_factor = 40.0f,
     .yarn_original_context = 64, .yarn_mscale_all_dim = 0.707f},
}};

// The array's size is written by hand: one more than the shapes listed would leave a shape
// without a name, which the first listing of shapes would read.
constexpr bool every_shape_is_named() {
  for (const SyntheticShape& shape : kShapes) {
    if (shape.name == nullptr) return false;
  }
  return true;
}
static_assert(every_shape_is_named(), "kShapes is declared larger than the shapes it lists");

// splitmix64: a tiny, well-mixed generator; every row gets its own stream so rows can be
// filled in parallel and the file stays the same.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float uniform(uint64_t& state) {  // in [-1, 1)
  state = mix(state);
  return static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

uint64_t hash_name(const std::string& s, uint64_t seed) {
  uint64_t h = seed ^ 0xCBF29CE484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
  return h;
}

// SentencePiece-style vocabulary: control tokens (<unk>, <s>, </s>, then `controls`), the 256
// byte tokens, then letter pieces. Returns the tokens' texts.
std::vector<std::string> add_vocabulary(gguf::Writer& w, int vocab_size, std::initializer_list<const char*> controls) {
  std::vector<gguf::Value> tokens, scores, types;
  std::vector<std::string> texts;
  auto add = [&](std::string text, int type) {
    scores.push_back(gguf::Value::f32(-static_cast<float>(tokens.size())));
    texts.push_back(text);
    tokens.push_back(gguf::Value::string(std::move(text)));
    types.push_back(gguf::Value::i32(type));
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (const char* control : controls) add(control, 3);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    add(name, 6);
  }
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
  const std::string space = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  std::vector<std::string> stems{""};
  for (size_t length = 1; static_cast<int>(tokens.size()) < vocab_size; ++length) {
    std::vector<std::string> next;
    for (const std::string& stem : stems) {
      for (char ch : letters) next.push_back(stem + ch);
    }
    for (const std::string& piece : next) {
      if (static_cast<int>(tokens.size()) < vocab_size) add(space + piece, 1);
      if (static_cast<int>(tokens.size()) < vocab_size) add(piece, 1);
    }
    stems = std::move(next);
  }
  w.set("tokenizer.ggml.model", gguf::Value::string("llama"));
  w.set("tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::String, std::move(tokens)));
  w.set("tokenizer.ggml.scores", gguf::Value::array(gguf::ValueType::Float32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", gguf::Value::array(gguf::ValueType::Int32, std::move(types)));
  w.set("tokenizer.ggml.unknown_token_id", gguf::Value::u32(0));
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(2));
  w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(true));
  w.set("tokenizer.ggml.add_eos_token", gguf::Value::boolean(false));
  return texts;
}

// llama.cpp's Q4_K_M and Q5_K_M give more bits to a subset of attn_v / ffn_down layers.
bool uses_more_bits(int layer, int layer_count) {
  return layer < layer_count / 8 || layer >= 7 * layer_count / 8 ||
         (layer - layer_count / 8) % 3 == 2;
}

}  // namespace

std::span<const SyntheticShape> synthetic_shapes() { return kShapes; }

const SyntheticShape* find_synthetic_shape(std::string_view name) {
  for (const SyntheticShape& s : kShapes) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

tensor::DType WeightTypes::type_of(MatrixRole role, int layer, int layer_count) const {
  using tensor::DType;
  switch (mix) {
    case Mix::None: return base;
    case Mix::MoreBits:
      if (role == MatrixRole::Output) return DType::Q6_K;
      if (role == MatrixRole::AttnV || role == MatrixRole::FfnDown) {
        return uses_more_bits(layer, layer_count) ? DType::Q6_K : base;
      }
      return base;
    case Mix::Q3_K_M:
      switch (role) {
        case MatrixRole::Output: return DType::Q6_K;
        case MatrixRole::AttnOutput: return DType::Q4_K;
        case MatrixRole::AttnV: return layer < 2 ? DType::Q5_K : DType::Q4_K;
        case MatrixRole::FfnDown: return layer < layer_count / 16 ? DType::Q5_K : DType::Q4_K;
        case MatrixRole::FfnGateUp:
        case MatrixRole::Other: return base;
      }
      return base;
    case Mix::Mxfp4:
      return role == MatrixRole::FfnGateUp || role == MatrixRole::FfnDown ? DType::MXFP4 : base;
  }
  return base;
}

WeightTypes parse_weight_types(std::string_view name) {
  using tensor::DType;
  std::string upper(name);
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (upper == "Q3_K_M") return {upper, DType::Q3_K, WeightTypes::Mix::Q3_K_M};
  if (upper == "Q4_K_M") return {upper, DType::Q4_K, WeightTypes::Mix::MoreBits};
  if (upper == "Q5_K_M") return {upper, DType::Q5_K, WeightTypes::Mix::MoreBits};
  if (upper == "MXFP4") return {upper, DType::Q8_0, WeightTypes::Mix::Mxfp4};
  const auto type = tensor::parse_dtype(upper);
  if (!type || !tensor::info(*type).computable) {
    throw std::invalid_argument("unknown weight type '" + std::string(name) +
                                "' (choose F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
                                "Q5_K, Q6_K, IQ4_NL, IQ4_XS, Q3_K_M, Q4_K_M, Q5_K_M or MXFP4)");
  }
  return {upper, *type};
}

void write_synthetic_model(const SyntheticShape& shape, const WeightTypes& types,
                           const std::string& path, uint64_t seed, const gguf::Writer::Progress& progress,
                           int layers, SyntheticWeights weights) {
  if (layers < 0 || layers > shape.layer_count) {
    throw std::invalid_argument(std::string("shape ") + shape.name + " has " + std::to_string(shape.layer_count) +
                                " layers; cannot write " + std::to_string(layers));
  }
  const int layer_count = layers > 0 ? layers : shape.layer_count;
  const int block_count = layer_count + shape.nextn_layers;
  // Every type of a mix is of the base type's block size (MXFP4's 32, as Q8_0's).
  const int block = static_cast<int>(tensor::info(types.base).block_elements);
  const int head_dim = shape.head_dim > 0 ? shape.head_dim : shape.embedding_dim / shape.head_count;
  const bool experts = shape.expert_count > 0;
  const bool dense_layers = !experts || shape.leading_dense_layers > 0;
  const bool latent = shape.kv_lora_rank > 0;
  // With latent attention the output projection reads the heads' values; its other inputs
  // (the latent, the query bottleneck) are checked beside it. attn_k_b's rows of a head's
  // query part without RoPE take Q8_0 where they are no whole blocks of the type, as
  // llama.cpp's quantizer falls back for rows of odd sizes.
  const int attention_out_dim = shape.head_count * (latent ? shape.value_head_dim : head_dim);
  for (int dim : {shape.embedding_dim, experts ? shape.expert_ffn_dim : shape.ffn_dim,
                  dense_layers ? shape.ffn_dim : shape.embedding_dim, attention_out_dim,
                  latent ? shape.kv_lora_rank : shape.embedding_dim,
                  shape.q_lora_rank > 0 ? shape.q_lora_rank : shape.embedding_dim}) {
    if (dim % block != 0) {
      throw std::invalid_argument(std::string("shape ") + shape.name + " has a dimension (" +
                                  std::to_string(dim) + ") that is not a multiple of the " +
                                  types.name + " block");
    }
  }
  gguf::Writer w;
  const std::string a = shape.arch;
  w.set("general.architecture", gguf::Value::string(a));
  const bool copying = weights == SyntheticWeights::Copying;
  w.set("general.name", gguf::Value::string(std::string(shape.name) + (copying ? " (copying weights)" : " (random weights)")));
  w.set("strata.synthetic", gguf::Value::boolean(true));
  if (shape.pooling_type != 0) w.set(a + ".pooling_type", gguf::Value::u32(static_cast<uint32_t>(shape.pooling_type)));
  w.set(a + ".vocab_size", gguf::Value::u32(static_cast<uint32_t>(shape.vocab_size)));
  w.set(a + ".context_length", gguf::Value::u32(static_cast<uint32_t>(shape.context_length)));
  w.set(a + ".embedding_length", gguf::Value::u32(static_cast<uint32_t>(shape.embedding_dim)));
  w.set(a + ".block_count", gguf::Value::u32(static_cast<uint32_t>(block_count)));
  w.set(a + ".feed_forward_length", gguf::Value::u32(static_cast<uint32_t>(shape.ffn_dim)));
  w.set(a + ".attention.head_count", gguf::Value::u32(static_cast<uint32_t>(shape.head_count)));
  w.set(a + ".attention.head_count_kv", gguf::Value::u32(static_cast<uint32_t>(shape.kv_head_count)));
  const int rope_dim = copying ? CopyingWeights::kRotatedDims : shape.rope_dim > 0 ? shape.rope_dim : head_dim;
  if (latent) {  // the cache's widths, then the heads' own
    w.set(a + ".attention.key_length", gguf::Value::u32(static_cast<uint32_t>(shape.kv_lora_rank + rope_dim)));
    w.set(a + ".attention.value_length", gguf::Value::u32(static_cast<uint32_t>(shape.kv_lora_rank)));
    w.set(a + ".attention.key_length_mla", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
    w.set(a + ".attention.value_length_mla", gguf::Value::u32(static_cast<uint32_t>(shape.value_head_dim)));
    w.set(a + ".attention.kv_lora_rank", gguf::Value::u32(static_cast<uint32_t>(shape.kv_lora_rank)));
    if (shape.q_lora_rank > 0) {
      w.set(a + ".attention.q_lora_rank", gguf::Value::u32(static_cast<uint32_t>(shape.q_lora_rank)));
    }
  } else {
    w.set(a + ".attention.key_length", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
    w.set(a + ".attention.value_length", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
  }
  w.set(a + ".rope.dimension_count", gguf::Value::u32(static_cast<uint32_t>(rope_dim)));
  if (experts) {
    w.set(a + ".expert_count", gguf::Value::u32(static_cast<uint32_t>(shape.expert_count)));
    w.set(a + ".expert_used_count", gguf::Value::u32(static_cast<uint32_t>(shape.experts_per_token)));
    w.set(a + ".expert_feed_forward_length", gguf::Value::u32(static_cast<uint32_t>(shape.expert_ffn_dim)));
  }
  const bool glm = a == "glm4moe";
  const bool deepseek = a == "deepseek2";
  if (glm || deepseek) {  // as llama.cpp's converter writes GLM-4.5's and DeepSeek's
    w.set(a + ".expert_shared_count", gguf::Value::u32(static_cast<uint32_t>(shape.shared_expert_count)));
    w.set(a + ".leading_dense_block_count", gguf::Value::u32(static_cast<uint32_t>(shape.leading_dense_layers)));
    w.set(a + ".expert_gating_func", gguf::Value::u32(glm || shape.sigmoid_gating ? 2 : 1));  // sigmoid : softmax
    w.set(a + ".expert_weights_scale", gguf::Value::f32(shape.expert_weights_scale));
  }
  if (glm || shape.expert_weights_norm) w.set(a + ".expert_weights_norm", gguf::Value::boolean(true));
  if (glm) w.set(a + ".nextn_predict_layers", gguf::Value::u32(static_cast<uint32_t>(shape.nextn_layers)));
  if (shape.expert_groups > 0) {
    w.set(a + ".expert_group_count", gguf::Value::u32(static_cast<uint32_t>(shape.expert_groups)));
    w.set(a + ".expert_group_used_count", gguf::Value::u32(static_cast<uint32_t>(shape.expert_groups_used)));
  }
  w.set(a + ".rope.freq_base", gguf::Value::f32(copying ? CopyingWeights::kRopeBase : shape.rope_freq_base));
  const bool gpt_oss = a == "gpt-oss";
  const bool gemma = a == "gemma3";
  if (gpt_oss) {  // the released models' YaRN
    w.set(a + ".rope.scaling.type", gguf::Value::string("yarn"));
    w.set(a + ".rope.scaling.factor", gguf::Value::f32(32.0f));
    w.set(a + ".rope.scaling.original_context_length", gguf::Value::u32(4096));
  }
  if (shape.yarn_factor > 0.0f) {  // DeepSeek's: its mscale_all_dim, times 0.1, as the log multiplier
    w.set(a + ".rope.scaling.type", gguf::Value::string("yarn"));
    w.set(a + ".rope.scaling.factor", gguf::Value::f32(shape.yarn_factor));
    w.set(a + ".rope.scaling.original_context_length",
          gguf::Value::u32(static_cast<uint32_t>(shape.yarn_original_context)));
    w.set(a + ".rope.scaling.yarn_beta_fast", gguf::Value::f32(shape.yarn_beta_fast));
    w.set(a + ".rope.scaling.yarn_beta_slow", gguf::Value::f32(1.0f));
    w.set(a + ".rope.scaling.yarn_log_multiplier", gguf::Value::f32(0.1f * shape.yarn_mscale_all_dim));
  }
  if (shape.rope_linear_factor > 0.0f) {
    w.set(a + ".rope.scaling.type", gguf::Value::string("linear"));
    w.set(a + ".rope.scaling.factor", gguf::Value::f32(shape.rope_linear_factor));
  }
  if (shape.sliding_window > 0) {
    w.set(a + ".attention.sliding_window", gguf::Value::u32(static_cast<uint32_t>(shape.sliding_window)));
  }
  w.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
  // llama.cpp looks <|endoftext|> up in the vocabulary of a model it takes for Phi-3 by its name.
  const std::vector<std::string> vocabulary =
      add_vocabulary(w, shape.vocab_size, a == "phi3" ? std::initializer_list<const char*>{"<|endoftext|>"}
                                                      : std::initializer_list<const char*>{});
  std::optional<CopyingWeights> copying_weights;
  if (copying) copying_weights.emplace(shape, layer_count, vocabulary, seed);
  if (shape.pooling_type != 0) w.set("tokenizer.ggml.add_eos_token", gguf::Value::boolean(true));

  auto pool = std::make_shared<tensor::ThreadPool>(
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  // Matrices: rows of `cols` values uniform in +-sqrt(3/cols), which keeps activations at unit
  // scale through the layers, or the copying weights' rows; a tensor of experts is `count` such
  // matrices. Vectors (norms, biases) stay F32.
  auto matrices = [&](const std::string& name, int cols, int rows, int count, tensor::DType type) {
    const uint64_t tensor_seed = hash_name(name, seed);
    const CopyingWeights::RowFiller copied = copying ? copying_weights->rows_of(name) : nullptr;
    // count 0: one matrix, 2-D; otherwise a 3-D tensor of `count` experts.
    std::vector<uint64_t> dims{static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
    if (count > 0) dims.push_back(static_cast<uint64_t>(count));
    w.add_tensor(name, dims, static_cast<uint32_t>(type), [=](uint8_t* dst, uint64_t) {
      const uint64_t row_bytes = *tensor::row_bytes(type, static_cast<uint64_t>(cols));
      const float amplitude = std::sqrt(3.0f / static_cast<float>(cols));
      pool->parallel_for(static_cast<int64_t>(rows) * std::max(count, 1), [&](int64_t begin, int64_t end) {
        std::vector<float> values(static_cast<size_t>(cols));
        for (int64_t r = begin; r < end; ++r) {
          if (copying) {
            std::fill(values.begin(), values.end(), 0.0f);
            if (copied) copied(r, values);
          } else {
            uint64_t state = mix(tensor_seed + static_cast<uint64_t>(r));
            for (float& v : values) v = uniform(state) * amplitude;
          }
          tensor::quantize_row(type, values.data(), dst + row_bytes * static_cast<uint64_t>(r), cols);
        }
      });
    });
  };
  auto matrix = [&](const std::string& name, int cols, int rows, tensor::DType type) {
    matrices(name, cols, rows, 0, type);
  };
  // `count` vectors (0: one, 1-D) of `length` values uniform in center +- spread (copying
  // weights: center; a llama's vectors are its norms' weights, all 1).
  auto vectors = [&](const std::string& name, int length, int count, float center, float spread) {
    if (copying) spread = 0.0f;
    const size_t values = static_cast<size_t>(length) * static_cast<size_t>(std::max(count, 1));
    std::vector<uint8_t> bytes(values * sizeof(float));
    uint64_t state = hash_name(name, seed);
    for (size_t i = 0; i < values; ++i) {
      const float v = center + spread * uniform(state);
      std::memcpy(bytes.data() + i * sizeof(float), &v, sizeof v);
    }
    std::vector<uint64_t> dims{static_cast<uint64_t>(length)};
    if (count > 0) dims.push_back(static_cast<uint64_t>(count));
    w.add_tensor(name, dims, static_cast<uint32_t>(tensor::DType::F32), std::move(bytes));
  };
  auto vector = [&](const std::string& name, int length, float center, float spread) {
    vectors(name, length, 0, center, spread);
  };

  const int q_dim = shape.head_count * head_dim;
  const int kv_dim = shape.kv_head_count * head_dim;
  matrix("token_embd.weight", shape.embedding_dim, shape.vocab_size, types.base);
  if (shape.long_rope_original_context > 0) {
    const double original = shape.long_rope_original_context;
    const double scale = shape.context_length / original;
    w.set(a + ".rope.scaling.original_context_length", gguf::Value::u32(static_cast<uint32_t>(original)));
    w.set(a + ".rope.scaling.attn_factor",
          gguf::Value::f32(static_cast<float>(std::sqrt(1.0 + std::log(scale) / std::log(original)))));
    // Divisors of each pair's frequency: well above 1 for the long context, near 1 within it.
    vector("rope_factors_long.weight", rope_dim / 2, 8.0f, 7.0f);
    vector("rope_factors_short.weight", rope_dim / 2, 1.1f, 0.1f);
  }
  const bool phi3 = a == "phi3";
  for (int i = 0; i < block_count; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const auto type_of = [&](MatrixRole role) { return types.type_of(role, i, layer_count); };
    vector(p + "attn_norm.weight", shape.embedding_dim, 1.0f, 0.1f);
    if (latent) {  // as llama.cpp's converter writes DeepSeek's: attn_kv_b split into attn_k_b and attn_v_b
      const int query_dim = shape.head_count * head_dim;
      if (shape.q_lora_rank > 0) {
        matrix(p + "attn_q_a.weight", shape.embedding_dim, shape.q_lora_rank, types.base);
        vector(p + "attn_q_a_norm.weight", shape.q_lora_rank, 1.0f, 0.1f);
        matrix(p + "attn_q_b.weight", shape.q_lora_rank, query_dim, types.base);
      } else {
        matrix(p + "attn_q.weight", shape.embedding_dim, query_dim, types.base);
      }
      matrix(p + "attn_kv_a_mqa.weight", shape.embedding_dim, shape.kv_lora_rank + rope_dim, types.base);
      vector(p + "attn_kv_a_norm.weight", shape.kv_lora_rank, 1.0f, 0.1f);
      const int nope_dim = head_dim - rope_dim;
      matrices(p + "attn_k_b.weight", nope_dim, shape.kv_lora_rank, shape.head_count,
               nope_dim % block == 0 ? types.base : tensor::DType::Q8_0);
      matrices(p + "attn_v_b.weight", shape.kv_lora_rank, shape.value_head_dim, shape.head_count,
               type_of(MatrixRole::AttnV));
    } else if (phi3) {  // Q, K and V in one matrix, as llama.cpp's converter writes Phi-3's
      matrix(p + "attn_qkv.weight", shape.embedding_dim, q_dim + 2 * kv_dim, type_of(MatrixRole::AttnV));
    } else {
      matrix(p + "attn_q.weight", shape.embedding_dim, q_dim, types.base);
      matrix(p + "attn_k.weight", shape.embedding_dim, kv_dim, types.base);
      matrix(p + "attn_v.weight", shape.embedding_dim, kv_dim, type_of(MatrixRole::AttnV));
    }
    if (a == "qwen2" || glm || gpt_oss) {
      vector(p + "attn_q.bias", q_dim, 0.0f, 0.1f);
      vector(p + "attn_k.bias", kv_dim, 0.0f, 0.1f);
      vector(p + "attn_v.bias", kv_dim, 0.0f, 0.1f);
    }
    if (a == "qwen3" || a == "qwen3moe" || shape.qk_norm) {
      vector(p + "attn_q_norm.weight", head_dim, 1.0f, 0.1f);
      vector(p + "attn_k_norm.weight", head_dim, 1.0f, 0.1f);
    }
    matrix(p + "attn_output.weight", attention_out_dim, shape.embedding_dim, type_of(MatrixRole::AttnOutput));
    if (gpt_oss) {
      vector(p + "attn_output.bias", shape.embedding_dim, 0.0f, 0.1f);
      vector(p + "attn_sinks.weight", shape.head_count, 0.0f, 2.0f);
    }
    if (gemma) {
      vector(p + "post_attention_norm.weight", shape.embedding_dim, 1.0f, 0.1f);
      vector(p + "post_ffw_norm.weight", shape.embedding_dim, 1.0f, 0.1f);
    }
    vector(p + (gpt_oss || glm ? "post_attention_norm.weight" : "ffn_norm.weight"), shape.embedding_dim, 1.0f, 0.1f);
    if (experts && i >= shape.leading_dense_layers) {
      // The router stays F32, as llama.cpp's converter and quantizer keep it.
      matrix(p + "ffn_gate_inp.weight", shape.embedding_dim, shape.expert_count, tensor::DType::F32);
      // Selection biases of the size of sigmoid probabilities' differences, so that they change choices.
      if (glm || (deepseek && shape.sigmoid_gating)) vector(p + "exp_probs_b.bias", shape.expert_count, 0.0f, 0.2f);
      matrices(p + "ffn_gate_exps.weight", shape.embedding_dim, shape.expert_ffn_dim, shape.expert_count,
               type_of(MatrixRole::FfnGateUp));
      matrices(p + "ffn_up_exps.weight", shape.embedding_dim, shape.expert_ffn_dim, shape.expert_count,
               type_of(MatrixRole::FfnGateUp));
      matrices(p + "ffn_down_exps.weight", shape.expert_ffn_dim, shape.embedding_dim, shape.expert_count,
               type_of(MatrixRole::FfnDown));
      if (gpt_oss) {
        vector(p + "ffn_gate_inp.bias", shape.expert_count, 0.0f, 0.5f);
        vectors(p + "ffn_gate_exps.bias", shape.expert_ffn_dim, shape.expert_count, 0.0f, 0.1f);
        vectors(p + "ffn_up_exps.bias", shape.expert_ffn_dim, shape.expert_count, 0.0f, 0.1f);
        vectors(p + "ffn_down_exps.bias", shape.embedding_dim, shape.expert_count, 0.0f, 0.1f);
      }
      if (shape.shared_expert_count > 0) {
        const int shared = shape.shared_expert_count * shape.expert_ffn_dim;
        matrix(p + "ffn_gate_shexp.weight", shape.embedding_dim, shared, type_of(MatrixRole::FfnGateUp));
        matrix(p + "ffn_up_shexp.weight", shape.embedding_dim, shared, type_of(MatrixRole::FfnGateUp));
        matrix(p + "ffn_down_shexp.weight", shared, shape.embedding_dim, type_of(MatrixRole::FfnDown));
      }
    } else if (phi3) {  // gate and up in one matrix, gate first
      matrix(p + "ffn_up.weight", shape.embedding_dim, 2 * shape.ffn_dim, type_of(MatrixRole::FfnGateUp));
      matrix(p + "ffn_down.weight", shape.ffn_dim, shape.embedding_dim, type_of(MatrixRole::FfnDown));
    } else {
      matrix(p + "ffn_gate.weight", shape.embedding_dim, shape.ffn_dim, type_of(MatrixRole::FfnGateUp));
      matrix(p + "ffn_up.weight", shape.embedding_dim, shape.ffn_dim, type_of(MatrixRole::FfnGateUp));
      matrix(p + "ffn_down.weight", shape.ffn_dim, shape.embedding_dim, type_of(MatrixRole::FfnDown));
    }
    if (i >= layer_count) {  // a NextN layer's own tensors, beside a layer's
      matrix(p + "nextn.eh_proj.weight", 2 * shape.embedding_dim, shape.embedding_dim, types.base);
      vector(p + "nextn.enorm.weight", shape.embedding_dim, 1.0f, 0.1f);
      vector(p + "nextn.hnorm.weight", shape.embedding_dim, 1.0f, 0.1f);
      vector(p + "nextn.shared_head_norm.weight", shape.embedding_dim, 1.0f, 0.1f);
    }
  }
  vector("output_norm.weight", shape.embedding_dim, 1.0f, 0.1f);
  if (!shape.tied_output) {
    matrix("output.weight", shape.embedding_dim, shape.vocab_size, types.type_of(MatrixRole::Output, 0, layer_count));
  }
  w.write(path, 32, progress);
}

}  // namespace strata::model
