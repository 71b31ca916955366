#include "model/synthetic.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "gguf/gguf.h"
#include "tensor/quant.h"
#include "tensor/thread_pool.h"

namespace strata::model {
namespace {

constexpr std::array<SyntheticShape, 10> kShapes{{
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
    {"qwen3moe-tiny", "a small Qwen3-MoE (2 of 8 experts of 64), for tests", "qwen3moe", 2048, 512, 128, 4, 4, 2,
     256, 1000000.0f, false, 32, 8, 2, 64},
}};

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

// SentencePiece-style vocabulary: control tokens, the 256 byte tokens, then letter pieces.
void add_vocabulary(gguf::Writer& w, int vocab_size) {
  std::vector<gguf::Value> tokens, scores, types;
  auto add = [&](std::string text, int type) {
    scores.push_back(gguf::Value::f32(-static_cast<float>(tokens.size())));
    tokens.push_back(gguf::Value::string(std::move(text)));
    types.push_back(gguf::Value::i32(type));
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
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
}

// llama.cpp's *_M mixes give more bits to a subset of attn_v / ffn_down layers.
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

WeightTypes parse_weight_types(std::string_view name) {
  std::string upper(name);
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (upper == "Q4_K_M") return {upper, tensor::DType::Q4_K, tensor::DType::Q6_K, true};
  if (upper == "Q5_K_M") return {upper, tensor::DType::Q5_K, tensor::DType::Q6_K, true};
  if (upper == "MXFP4") return {upper, tensor::DType::Q8_0, tensor::DType::Q8_0, false, tensor::DType::MXFP4};
  const auto type = tensor::parse_dtype(upper);
  if (!type || !tensor::info(*type).computable) {
    throw std::invalid_argument("unknown weight type '" + std::string(name) +
                                "' (choose F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, "
                                "Q5_K, Q6_K, IQ4_NL, IQ4_XS, Q4_K_M, Q5_K_M or MXFP4)");
  }
  return {upper, *type, *type, false};
}

void write_synthetic_model(const SyntheticShape& shape, const WeightTypes& types,
                           const std::string& path, uint64_t seed, const gguf::Writer::Progress& progress,
                           int layers) {
  if (layers < 0 || layers > shape.layer_count) {
    throw std::invalid_argument(std::string("shape ") + shape.name + " has " + std::to_string(shape.layer_count) +
                                " layers; cannot write " + std::to_string(layers));
  }
  const int layer_count = layers > 0 ? layers : shape.layer_count;
  const int block = static_cast<int>(tensor::info(types.base).block_elements);
  const tensor::DType ffn = types.ffn.value_or(types.base);
  const int head_dim = shape.head_dim > 0 ? shape.head_dim : shape.embedding_dim / shape.head_count;
  const bool experts = shape.expert_count > 0;
  for (int dim : {shape.embedding_dim, experts ? shape.expert_ffn_dim : shape.ffn_dim, shape.head_count * head_dim}) {
    if (dim % block != 0 || dim % tensor::info(types.important).block_elements != 0 ||
        dim % tensor::info(ffn).block_elements != 0) {
      throw std::invalid_argument(std::string("shape ") + shape.name + " has a dimension (" +
                                  std::to_string(dim) + ") that is not a multiple of the " +
                                  types.name + " block");
    }
  }
  gguf::Writer w;
  const std::string a = shape.arch;
  w.set("general.architecture", gguf::Value::string(a));
  w.set("general.name", gguf::Value::string(std::string(shape.name) + " (random weights)"));
  w.set("strata.synthetic", gguf::Value::boolean(true));
  w.set(a + ".vocab_size", gguf::Value::u32(static_cast<uint32_t>(shape.vocab_size)));
  w.set(a + ".context_length", gguf::Value::u32(static_cast<uint32_t>(shape.context_length)));
  w.set(a + ".embedding_length", gguf::Value::u32(static_cast<uint32_t>(shape.embedding_dim)));
  w.set(a + ".block_count", gguf::Value::u32(static_cast<uint32_t>(layer_count)));
  w.set(a + ".feed_forward_length", gguf::Value::u32(static_cast<uint32_t>(shape.ffn_dim)));
  w.set(a + ".attention.head_count", gguf::Value::u32(static_cast<uint32_t>(shape.head_count)));
  w.set(a + ".attention.head_count_kv", gguf::Value::u32(static_cast<uint32_t>(shape.kv_head_count)));
  w.set(a + ".attention.key_length", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
  w.set(a + ".attention.value_length", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
  w.set(a + ".rope.dimension_count", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
  if (experts) {
    w.set(a + ".expert_count", gguf::Value::u32(static_cast<uint32_t>(shape.expert_count)));
    w.set(a + ".expert_used_count", gguf::Value::u32(static_cast<uint32_t>(shape.experts_per_token)));
    w.set(a + ".expert_feed_forward_length", gguf::Value::u32(static_cast<uint32_t>(shape.expert_ffn_dim)));
  }
  w.set(a + ".rope.freq_base", gguf::Value::f32(shape.rope_freq_base));
  w.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
  add_vocabulary(w, shape.vocab_size);

  auto pool = std::make_shared<tensor::ThreadPool>(
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  // Matrices: rows of `cols` values uniform in +-sqrt(3/cols), which keeps activations at unit
  // scale through the layers; a tensor of experts is `count` such matrices. Vectors (norms,
  // biases) stay F32.
  auto matrices = [&](const std::string& name, int cols, int rows, int count, tensor::DType type) {
    const uint64_t tensor_seed = hash_name(name, seed);
    // count 0: one matrix, 2-D; otherwise a 3-D tensor of `count` experts.
    std::vector<uint64_t> dims{static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
    if (count > 0) dims.push_back(static_cast<uint64_t>(count));
    w.add_tensor(name, dims, static_cast<uint32_t>(type), [=](uint8_t* dst, uint64_t) {
      const uint64_t row_bytes = *tensor::row_bytes(type, static_cast<uint64_t>(cols));
      const float amplitude = std::sqrt(3.0f / static_cast<float>(cols));
      pool->parallel_for(static_cast<int64_t>(rows) * std::max(count, 1), [&](int64_t begin, int64_t end) {
        std::vector<float> values(static_cast<size_t>(cols));
        for (int64_t r = begin; r < end; ++r) {
          uint64_t state = mix(tensor_seed + static_cast<uint64_t>(r));
          for (float& v : values) v = uniform(state) * amplitude;
          tensor::quantize_row(type, values.data(), dst + row_bytes * static_cast<uint64_t>(r), cols);
        }
      });
    });
  };
  auto matrix = [&](const std::string& name, int cols, int rows, tensor::DType type) {
    matrices(name, cols, rows, 0, type);
  };
  auto vector = [&](const std::string& name, int length, float center, float spread) {
    std::vector<uint8_t> bytes(static_cast<size_t>(length) * sizeof(float));
    uint64_t state = hash_name(name, seed);
    for (int i = 0; i < length; ++i) {
      const float v = center + spread * uniform(state);
      std::memcpy(bytes.data() + static_cast<size_t>(i) * sizeof(float), &v, sizeof v);
    }
    w.add_tensor(name, {static_cast<uint64_t>(length)}, static_cast<uint32_t>(tensor::DType::F32),
                 std::move(bytes));
  };

  const int q_dim = shape.head_count * head_dim;
  const int kv_dim = shape.kv_head_count * head_dim;
  matrix("token_embd.weight", shape.embedding_dim, shape.vocab_size, types.base);
  for (int i = 0; i < layer_count; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool more_bits = types.mixed && uses_more_bits(i, layer_count);
    vector(p + "attn_norm.weight", shape.embedding_dim, 1.0f, 0.1f);
    matrix(p + "attn_q.weight", shape.embedding_dim, q_dim, types.base);
    matrix(p + "attn_k.weight", shape.embedding_dim, kv_dim, types.base);
    matrix(p + "attn_v.weight", shape.embedding_dim, kv_dim, more_bits ? types.important : types.base);
    if (a == "qwen2") {
      vector(p + "attn_q.bias", q_dim, 0.0f, 0.1f);
      vector(p + "attn_k.bias", kv_dim, 0.0f, 0.1f);
      vector(p + "attn_v.bias", kv_dim, 0.0f, 0.1f);
    }
    if (a == "qwen3" || a == "qwen3moe") {
      vector(p + "attn_q_norm.weight", head_dim, 1.0f, 0.1f);
      vector(p + "attn_k_norm.weight", head_dim, 1.0f, 0.1f);
    }
    matrix(p + "attn_output.weight", q_dim, shape.embedding_dim, types.base);
    vector(p + "ffn_norm.weight", shape.embedding_dim, 1.0f, 0.1f);
    if (experts) {
      // The router stays F32, as llama.cpp's converter and quantizer keep it.
      matrix(p + "ffn_gate_inp.weight", shape.embedding_dim, shape.expert_count, tensor::DType::F32);
      matrices(p + "ffn_gate_exps.weight", shape.embedding_dim, shape.expert_ffn_dim, shape.expert_count, ffn);
      matrices(p + "ffn_up_exps.weight", shape.embedding_dim, shape.expert_ffn_dim, shape.expert_count, ffn);
      matrices(p + "ffn_down_exps.weight", shape.expert_ffn_dim, shape.embedding_dim, shape.expert_count,
               more_bits ? types.important : ffn);
    } else {
      matrix(p + "ffn_gate.weight", shape.embedding_dim, shape.ffn_dim, ffn);
      matrix(p + "ffn_up.weight", shape.embedding_dim, shape.ffn_dim, ffn);
      matrix(p + "ffn_down.weight", shape.ffn_dim, shape.embedding_dim, more_bits ? types.important : ffn);
    }
  }
  vector("output_norm.weight", shape.embedding_dim, 1.0f, 0.1f);
  if (!shape.tied_output) {
    matrix("output.weight", shape.embedding_dim, shape.vocab_size, types.important);
  }
  w.write(path, 32, progress);
}

}  // namespace strata::model
