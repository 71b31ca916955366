#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "reference/reference.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

namespace strata::reference {
namespace {

namespace fs = std::filesystem;
using tensor::DType;

const std::string kModelPath = std::string(STRATA_SHARED_DIR) + "/models/aidreams260K.gguf";

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("strata_reference_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Removes the file when the test ends, even on failure.
struct TempFile {
  explicit TempFile(const std::string& name) : path(temp_path(name)) {}
  ~TempFile() { fs::remove(path); }
  std::string path;
};

uint16_t to_half(float value) {
  // Only for values exactly representable as normal halves (or zero), which is all we write.
  if (value == 0.0f) return 0;
  int exponent = 0;
  const double mantissa = std::frexp(std::fabs(value), &exponent);  // in [0.5, 1)
  const auto fraction = static_cast<uint16_t>((mantissa * 2.0 - 1.0) * 1024.0);
  const auto biased = static_cast<uint16_t>(exponent - 1 + 15);
  return static_cast<uint16_t>((value < 0 ? 0x8000 : 0) | (biased << 10) | fraction);
}

uint16_t to_bfloat(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// A small model described tensor by tensor, written to GGUF with every matrix in one type.
struct TinyModel {
  std::string arch = "llama";
  std::map<std::string, gguf::Value> metadata;
  struct Tensor {
    std::vector<uint64_t> dims;
    std::vector<float> values;
  };
  std::map<std::string, Tensor> tensors;

  void set_shape(uint32_t embedding, uint32_t layers, uint32_t feed_forward, uint32_t heads,
                 uint32_t kv_heads, uint32_t rope_dims) {
    metadata[arch + ".embedding_length"] = gguf::Value::u32(embedding);
    metadata[arch + ".block_count"] = gguf::Value::u32(layers);
    metadata[arch + ".feed_forward_length"] = gguf::Value::u32(feed_forward);
    metadata[arch + ".attention.head_count"] = gguf::Value::u32(heads);
    metadata[arch + ".attention.head_count_kv"] = gguf::Value::u32(kv_heads);
    metadata[arch + ".attention.layer_norm_rms_epsilon"] = gguf::Value::f32(1e-6f);
    metadata[arch + ".rope.freq_base"] = gguf::Value::f32(10000.0f);
    metadata[arch + ".rope.dimension_count"] = gguf::Value::u32(rope_dims);
    metadata[arch + ".context_length"] = gguf::Value::u32(16);
  }

  // Row-major rows x cols, i.e. GGUF dims {cols, rows}.
  void matrix(const std::string& name, uint64_t rows, uint64_t cols, std::vector<float> values) {
    ASSERT_EQ(values.size(), rows * cols) << name;
    tensors[name] = {{cols, rows}, std::move(values)};
  }
  void vector(const std::string& name, std::vector<float> values) {
    tensors[name] = {{values.size()}, std::move(values)};
  }
  // `count` row-major matrices of rows x cols, one after another: GGUF dims {cols, rows, count}.
  void experts(const std::string& name, uint64_t count, uint64_t rows, uint64_t cols, std::vector<float> values) {
    ASSERT_EQ(values.size(), count * rows * cols) << name;
    tensors[name] = {{cols, rows, count}, std::move(values)};
  }

  void write(const std::string& path, DType matrix_type = DType::F32) const {
    gguf::Writer writer;
    writer.set("general.architecture", gguf::Value::string(arch));
    for (const auto& [key, value] : metadata) writer.set(key, value);
    for (const auto& [name, t] : tensors) {
      const DType type = t.dims.size() >= 2 ? matrix_type : DType::F32;
      std::vector<uint8_t> bytes;
      if (tensor::info(type).block_elements > 1) {
        const auto cols = static_cast<int64_t>(t.dims[0]);
        const uint64_t rows = t.values.size() / t.dims[0];  // of every matrix of the tensor
        const uint64_t row_size = *tensor::row_bytes(type, t.dims[0]);
        bytes.resize(row_size * rows);
        for (uint64_t r = 0; r < rows; ++r) {
          tensor::quantize_row(type, t.values.data() + r * t.dims[0], bytes.data() + r * row_size, cols);
        }
      }
      for (float v : tensor::info(type).block_elements > 1 ? std::vector<float>{} : t.values) {
        if (type == DType::F32) {
          uint8_t raw[4];
          std::memcpy(raw, &v, 4);
          bytes.insert(bytes.end(), raw, raw + 4);
        } else {
          const uint16_t half = type == DType::F16 ? to_half(v) : to_bfloat(v);
          bytes.push_back(static_cast<uint8_t>(half & 0xFF));
          bytes.push_back(static_cast<uint8_t>(half >> 8));
        }
      }
      writer.add_tensor(name, t.dims, static_cast<uint32_t>(type), std::move(bytes));
    }
    writer.write(path);
  }
};

// 1 layer, dim 4, 1 head of 4, FFN 1, vocabulary 3, with weights simple enough to follow by hand.
TinyModel hand_checkable_model(const std::string& arch) {
  TinyModel m;
  m.arch = arch;
  m.set_shape(4, 1, 1, 1, 1, 4);
  m.matrix("token_embd.weight", 3, 4, {1, 0, 0, 0,  0, 0, 1, 0,  0, 1, 0, 1});
  m.vector("blk.0.attn_norm.weight", {1, 1, 1, 1});
  m.matrix("blk.0.attn_q.weight", 4, 4, {1, 0, 0, 0,  0, 1, 0, 0,  0, 0, 1, 0,  0, 0, 0, 1});
  m.matrix("blk.0.attn_k.weight", 4, 4, {0, 0, 1, 0,  0, 1, 0, 0,  1, 0, 0, 0,  0, 0, 0, 1});
  // Not symmetric, so reading it transposed would show.
  m.matrix("blk.0.attn_v.weight", 4, 4, {1, 0, 0, 0,  0, 0, 0, 0,  0, 0, 1, 0,  1, 0, 0, 0});
  m.matrix("blk.0.attn_output.weight", 4, 4, {1, 0, 0, 0,  0, 1, 0, 0,  0, 0, 1, 0,  0, 0, 0, 1});
  m.vector("blk.0.ffn_norm.weight", {1, 1, 1, 1});
  m.matrix("blk.0.ffn_gate.weight", 1, 4, {1, 0, 1, 0});
  m.matrix("blk.0.ffn_up.weight", 1, 4, {1, 0, 0, 0});
  m.matrix("blk.0.ffn_down.weight", 4, 1, {0, 1, 0, 0});
  m.vector("output_norm.weight", {1, 1, 1, 1});
  m.matrix("output.weight", 3, 4, {1, 0, 0, 0,  0, 1, 0, 0,  0, 0, 1, 0});
  if (arch == "qwen2") {
    m.vector("blk.0.attn_q.bias", {0, 0, 0, 0});
    m.vector("blk.0.attn_k.bias", {0, 0, 0, 0});
    m.vector("blk.0.attn_v.bias", {0, 1, 0, 0});
  }
  return m;
}

// The logits of hand_checkable_model for tokens {0, 1}, worked out on paper:
// both embeddings have one non-zero component, so the first RMSNorm gives a = 1/sqrt(1/4 + eps)
// there: h0 = (a,0,0,0), h1 = (0,0,a,0). At position 1 the query (h1 rotated) meets the key
// of position 0, k0 = (0,0,a,0), with the angle of the pair holding component 2: pair (2,3) at
// frequency 10000^(-2/4) = 0.01 for llama, pair (0,2) at frequency 1 for NeoX (qwen2); its own
// key is orthogonal to it. So the scores are a^2 cos(angle) / 2 and 0; `qk_scale` multiplies
// the first, for a model that normalizes queries and keys (qwen3), and `value_scale` the values
// (a = v below), for one whose values come out of a normalized latent (deepseek2).
std::vector<std::vector<double>> hand_logits(double angle, double v_bias, double qk_scale = 1.0,
                                             double value_scale = 1.0) {
  const double eps = static_cast<double>(1e-6f);
  const double a = 1.0 / std::sqrt(0.25 + eps);
  const double p0 = 1.0 / (1.0 + std::exp(-a * a * qk_scale * std::cos(angle) / 2.0));
  const double p1 = 1.0 - p0;
  // Residual after attention: embedding + weighted values, v0 = (v, b, 0, v), v1 = (0, b, v, 0).
  const double v = a * value_scale;
  std::vector<std::vector<double>> residual = {{1.0 + v, v_bias, 0.0, v},
                                               {p0 * v, v_bias, 1.0 + p1 * v, p0 * v}};
  const auto rms = [&](const std::vector<double>& x) {
    return std::sqrt((x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3]) / 4.0 + eps);
  };
  std::vector<std::vector<double>> logits;
  for (std::vector<double>& x : residual) {
    const double r = rms(x);
    const double gate = (x[0] + x[2]) / r;
    const double up = x[0] / r;
    x[1] += gate / (1.0 + std::exp(-gate)) * up;
    const double r_out = rms(x);
    logits.push_back({x[0] / r_out, x[1] / r_out, x[2] / r_out});
  }
  return logits;
}

void expect_near(const std::vector<std::vector<double>>& actual,
                 const std::vector<std::vector<double>>& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t t = 0; t < actual.size(); ++t) {
    ASSERT_EQ(actual[t].size(), expected[t].size());
    for (size_t i = 0; i < actual[t].size(); ++i) {
      EXPECT_NEAR(actual[t][i], expected[t][i], tolerance) << "position " << t << ", logit " << i;
    }
  }
}

TEST(Reference, LlamaMatchesAHandComputation) {
  TempFile file("hand_llama.gguf");
  hand_checkable_model("llama").write(file.path);
  const auto model = gguf::File::open(file.path);
  const std::vector<int32_t> tokens{0, 1};
  expect_near(forward_all(*model, tokens), hand_logits(0.01, 0.0), 1e-12);
}

TEST(Reference, Qwen2MatchesAHandComputationWithNeoxRopeAndBiases) {
  TempFile file("hand_qwen2.gguf");
  hand_checkable_model("qwen2").write(file.path);
  const auto model = gguf::File::open(file.path);
  const std::vector<int32_t> tokens{0, 1};
  expect_near(forward_all(*model, tokens), hand_logits(1.0, 1.0), 1e-12);
}

TEST(Reference, Qwen3NormalizesEachHeadOfQueriesAndKeysBeforeRope) {
  TinyModel m = hand_checkable_model("qwen3");
  // Only dimension 2's weights meet (the rest multiply zeros): 2 for queries, 1.5 for keys.
  m.vector("blk.0.attn_q_norm.weight", {3, 1, 2, 1});
  m.vector("blk.0.attn_k_norm.weight", {0.5, 1, 1.5, 1});
  TempFile file("hand_qwen3.gguf");
  m.write(file.path);
  // The query of position 1 and the key of position 0 are both (0, 0, a, 0): normalized over
  // their head, a becomes a / sqrt(a^2 / 4 + eps), then times its weight; so the score is that
  // of the unnormalized model times 2 * 1.5 / (a^2 / 4 + eps). Both rotate by NeoX's angles.
  const double eps = static_cast<double>(1e-6f);
  const double a = 1.0 / std::sqrt(0.25 + eps);
  const std::vector<int32_t> tokens{0, 1};
  expect_near(forward_all(*gguf::File::open(file.path), tokens), hand_logits(1.0, 0.0, 2 * 1.5 / (a * a / 4 + eps)),
              1e-12);
}

// DeepSeek's latent attention built to compute the hand-checkable model's attention: one head
// whose query is (h0, h1) without RoPE and (h2, h3) rotated (adjacent pairs, a rope part of 2:
// pair 0 at frequency 1); the latent (h0, h1, h2), RMS-normalized, which turns each position's
// one non-zero a into c = a / sqrt(a^2 / 3 + eps); the shared rotated key part (h0, h3); the
// key's part without RoPE the latent's first two, and the value the model's attn_v of the latent.
// At position 1 the query's part without RoPE is zero, and its rotated part (a, 0) meets
// position 0's (a, 0): the score a^2 cos(1) / 2, over a key of 4; the values are c / a times the
// model's.
TEST(Reference, DeepseekLatentAttentionMatchesAHandComputation) {
  TinyModel m = hand_checkable_model("deepseek2");
  m.set_shape(4, 1, 1, 1, 1, 2);
  m.metadata["deepseek2.attention.kv_lora_rank"] = gguf::Value::u32(3);
  m.metadata["deepseek2.attention.key_length"] = gguf::Value::u32(5);  // the cache's: latent and rotated part
  m.metadata["deepseek2.attention.value_length"] = gguf::Value::u32(3);
  m.metadata["deepseek2.attention.key_length_mla"] = gguf::Value::u32(4);
  m.metadata["deepseek2.attention.value_length_mla"] = gguf::Value::u32(4);
  for (const char* name : {"blk.0.attn_k.weight", "blk.0.attn_v.weight"}) m.tensors.erase(name);
  m.matrix("blk.0.attn_kv_a_mqa.weight", 5, 4, {1, 0, 0, 0,  0, 1, 0, 0,  0, 0, 1, 0,  1, 0, 0, 0,  0, 0, 0, 1});
  m.vector("blk.0.attn_kv_a_norm.weight", {1, 1, 1});
  m.experts("blk.0.attn_k_b.weight", 1, 3, 2, {1, 0,  0, 1,  0, 0});
  m.experts("blk.0.attn_v_b.weight", 1, 4, 3, {1, 0, 0,  0, 0, 0,  0, 0, 1,  1, 0, 0});
  TempFile file("hand_deepseek2.gguf");
  m.write(file.path);
  const double eps = static_cast<double>(1e-6f);
  const double a = 1.0 / std::sqrt(0.25 + eps);
  const double c = a / std::sqrt(a * a / 3.0 + eps);
  const std::vector<int32_t> tokens{0, 1};
  expect_near(forward_all(*gguf::File::open(file.path), tokens), hand_logits(1.0, 0.0, 1.0, c / a), 1e-12);
}

// Phi-3 keeps Q, K and V as one matrix and the FFN's gate and up as another (gate first): the
// hand-checkable model so fused computes the function of its parts, with NeoX's angles.
TEST(Reference, Phi3SplitsItsFusedProjections) {
  TinyModel m = hand_checkable_model("phi3");
  const auto take = [&](const std::string& name) {
    std::vector<float> values = m.tensors.at(name).values;
    m.tensors.erase(name);
    return values;
  };
  std::vector<float> qkv = take("blk.0.attn_q.weight");
  for (const char* part : {"blk.0.attn_k.weight", "blk.0.attn_v.weight"}) {
    const std::vector<float> rows = take(part);
    qkv.insert(qkv.end(), rows.begin(), rows.end());
  }
  m.matrix("blk.0.attn_qkv.weight", 12, 4, qkv);
  std::vector<float> gate_up = take("blk.0.ffn_gate.weight");
  const std::vector<float> up = take("blk.0.ffn_up.weight");
  gate_up.insert(gate_up.end(), up.begin(), up.end());
  m.matrix("blk.0.ffn_up.weight", 2, 4, gate_up);
  TempFile file("hand_phi3.gguf");
  m.write(file.path);
  const std::vector<int32_t> tokens{0, 1};
  expect_near(forward_all(*gguf::File::open(file.path), tokens), hand_logits(1.0, 0.0), 1e-12);
}

// 1 layer, dim 4, 1 head of 4, vocabulary 4 (token t embedded as unit vector t, read out by an
// identity head), and a Mixture-of-Experts FFN of 4 experts of width 1, 2 per token: Mixtral's
// (`llama` with expert_count) or Qwen3-MoE's. Attention adds nothing (its output projection is
// zero), so the FFN sees the normalized embedding a e_t, a = 1/sqrt(1/4 + eps). Every expert's
// gate row is all ones and expert e's up row all e + 1, so expert e gives silu(a) (e + 1) a,
// which its down column writes to dimension e. Token t's router scores are a times column t
// of `kRouter`.
constexpr float kRouter[4][4] = {  // [expert][token]
    {2, 2, 0, 0},
    {0, 1, 1, 0},
    {1, 0, 0, 0},
    {-1, 1, 3, 0},
};

TinyModel experts_model(const std::string& arch) {
  TinyModel m = hand_checkable_model(arch);
  m.matrix("token_embd.weight", 4, 4, {1, 0, 0, 0,  0, 1, 0, 0,  0, 0, 1, 0,  0, 0, 0, 1});
  m.matrix("output.weight", 4, 4, {1, 0, 0, 0,  0, 1, 0, 0,  0, 0, 1, 0,  0, 0, 0, 1});
  m.matrix("blk.0.attn_output.weight", 4, 4, std::vector<float>(16, 0.0f));
  for (const char* dense : {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"}) {
    m.tensors.erase(dense);
  }
  m.metadata[arch + ".expert_count"] = gguf::Value::u32(4);
  m.metadata[arch + ".expert_used_count"] = gguf::Value::u32(2);
  if (arch == "qwen3moe") {
    // Its experts' width is their own key, not the dense FFN's.
    m.metadata["qwen3moe.feed_forward_length"] = gguf::Value::u32(3);
    m.metadata["qwen3moe.expert_feed_forward_length"] = gguf::Value::u32(1);
    m.vector("blk.0.attn_q_norm.weight", {1, 1, 1, 1});
    m.vector("blk.0.attn_k_norm.weight", {1, 1, 1, 1});
  }
  std::vector<float> router;
  for (const auto& expert : kRouter) router.insert(router.end(), expert, expert + 4);
  m.matrix("blk.0.ffn_gate_inp.weight", 4, 4, router);
  m.experts("blk.0.ffn_gate_exps.weight", 4, 1, 4, std::vector<float>(16, 1.0f));
  std::vector<float> up, down(16, 0.0f);
  for (int e = 0; e < 4; ++e) {
    up.insert(up.end(), 4, static_cast<float>(e + 1));
    down[static_cast<size_t>(e * 4 + e)] = 1.0f;  // expert e's 4 x 1 matrix: row e
  }
  m.experts("blk.0.ffn_up_exps.weight", 4, 1, 4, up);
  m.experts("blk.0.ffn_down_exps.weight", 4, 4, 1, down);
  return m;
}

// The logits of experts_model after token t, which chose experts `first` and then `second`,
// weighted p_first / (p_first + p_second) = 1 / (1 + exp(-(s_first - s_second))) and 1 minus
// that: their outputs in their dimensions beside the embedding, then the final RMSNorm.
std::vector<double> experts_hand_logits(int t, int first, int second) {
  const double eps = static_cast<double>(1e-6f);
  const double a = 1.0 / std::sqrt(0.25 + eps);
  const double gap = a * (kRouter[first][t] - kRouter[second][t]);
  std::vector<double> x(4, 0.0);
  x[static_cast<size_t>(t)] = 1.0;
  const double silu_a = a / (1.0 + std::exp(-a));
  x[static_cast<size_t>(first)] += 1.0 / (1.0 + std::exp(-gap)) * silu_a * (first + 1) * a;
  x[static_cast<size_t>(second)] += 1.0 / (1.0 + std::exp(gap)) * silu_a * (second + 1) * a;
  const double rms = std::sqrt((x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3]) / 4.0 + eps);
  for (double& v : x) v /= rms;
  return x;
}

std::vector<std::vector<double>> run_experts_model(const std::string& arch, const std::vector<int32_t>& tokens,
                                                   ExpertChoices& choices) {
  TempFile file("hand_" + arch + "_experts.gguf");
  experts_model(arch).write(file.path);
  return forward_all(*gguf::File::open(file.path), tokens, &choices);
}

// The one layer's choices for `tokens`: each position's experts, in order, and its router
// scores, a times kRouter's column.
void expect_choices(const ExpertChoices& choices, const std::vector<int32_t>& tokens,
                    const std::vector<std::vector<int>>& experts) {
  ASSERT_EQ(choices.size(), 1u);
  ASSERT_EQ(choices[0].size(), experts.size());
  const double a = 1.0 / std::sqrt(0.25 + static_cast<double>(1e-6f));
  for (size_t t = 0; t < experts.size(); ++t) {
    EXPECT_EQ(choices[0][t].experts, experts[t]) << "position " << t;
    ASSERT_EQ(choices[0][t].scores.size(), 4u);
    for (size_t e = 0; e < 4; ++e) EXPECT_NEAR(choices[0][t].scores[e], a * kRouter[e][tokens[t]], 1e-12);
  }
}

TEST(Reference, ExpertsAreTheRoutersTopChoicesWeightedByTheirRenormalizedProbabilities) {
  for (const char* arch : {"llama", "qwen3moe"}) {
    SCOPED_TRACE(arch);
    ExpertChoices choices;
    // Token 0 scores (2, 0, 1, -1): experts 0 then 2. Token 2 scores (0, 1, 0, 3): 3 then 1,
    // the order of choices, not of indices.
    const std::vector<int32_t> tokens{0, 2};
    const auto logits = run_experts_model(arch, tokens, choices);
    expect_choices(choices, tokens, {{0, 2}, {3, 1}});
    expect_near(logits, {experts_hand_logits(0, 0, 2), experts_hand_logits(2, 3, 1)}, 1e-12);
  }
}

// experts_model as GLM-4.5 routes: each expert's sigmoid of its score, ranked for the choice
// with kGlmBias added, the chosen weights normalized and scaled by 2; beside them a shared
// expert of width 1 (gate row ones, up row fives) that writes to dimension 0. The FFN's norm is
// post_attention_norm.
constexpr float kGlmBias[4] = {0, 0, -0.5f, 0};

TinyModel glm_experts_model() {
  TinyModel m = experts_model("glm4moe");
  m.metadata["glm4moe.feed_forward_length"] = gguf::Value::u32(3);
  m.metadata["glm4moe.expert_feed_forward_length"] = gguf::Value::u32(1);
  m.metadata["glm4moe.expert_shared_count"] = gguf::Value::u32(1);
  m.metadata["glm4moe.expert_gating_func"] = gguf::Value::u32(2);
  m.metadata["glm4moe.expert_weights_norm"] = gguf::Value::boolean(true);
  m.metadata["glm4moe.expert_weights_scale"] = gguf::Value::f32(2.0f);
  m.tensors["blk.0.post_attention_norm.weight"] = m.tensors.at("blk.0.ffn_norm.weight");
  m.tensors.erase("blk.0.ffn_norm.weight");
  m.vector("blk.0.exp_probs_b.bias", {kGlmBias[0], kGlmBias[1], kGlmBias[2], kGlmBias[3]});
  m.matrix("blk.0.ffn_gate_shexp.weight", 1, 4, {1, 1, 1, 1});
  m.matrix("blk.0.ffn_up_shexp.weight", 1, 4, {5, 5, 5, 5});
  m.matrix("blk.0.ffn_down_shexp.weight", 4, 1, {1, 0, 0, 0});
  return m;
}

// The logits of glm_experts_model after token t, which chose experts `first` and `second`:
// their weights are 2 p_e / (p_first + p_second), p_e = sigmoid(a kRouter[e][t]), unbiased.
std::vector<double> glm_hand_logits(int t, int first, int second) {
  const double eps = static_cast<double>(1e-6f);
  const double a = 1.0 / std::sqrt(0.25 + eps);
  const auto p = [&](int e) { return 1.0 / (1.0 + std::exp(-a * kRouter[e][t])); };
  const double silu_a = a / (1.0 + std::exp(-a));
  std::vector<double> x(4, 0.0);
  x[static_cast<size_t>(t)] = 1.0;
  for (const int e : {first, second}) {
    x[static_cast<size_t>(e)] += 2.0 * p(e) / (p(first) + p(second)) * silu_a * (e + 1) * a;
  }
  x[0] += silu_a * 5.0 * a;
  const double rms = std::sqrt((x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3]) / 4.0 + eps);
  for (double& v : x) v /= rms;
  return x;
}

TEST(Reference, GlmRoutesBySigmoidPlusBiasAndWeighsByTheUnbiasedProbabilities) {
  TempFile file("hand_glm_experts.gguf");
  glm_experts_model().write(file.path);
  ExpertChoices choices;
  // Token 0's sigmoids rank 0, 2, 1, 3; the bias of -0.5 puts expert 2 behind 1. Token 2 ranks
  // 3, then 1. Token 1 takes 0, then 1 and 3 tie: 1, the lower index.
  const std::vector<int32_t> tokens{0, 2, 1};
  const auto logits = forward_all(*gguf::File::open(file.path), tokens, &choices);
  ASSERT_EQ(choices.size(), 1u);
  const std::vector<std::vector<int>> expected{{0, 1}, {3, 1}, {0, 1}};
  const double a = 1.0 / std::sqrt(0.25 + static_cast<double>(1e-6f));
  for (size_t t = 0; t < tokens.size(); ++t) {
    EXPECT_EQ(choices[0][t].experts, expected[t]) << "position " << t;
    for (size_t e = 0; e < 4; ++e) {  // the scores ranked: the biased probabilities
      EXPECT_NEAR(choices[0][t].scores[e], 1.0 / (1.0 + std::exp(-a * kRouter[e][tokens[t]])) + kGlmBias[e], 1e-12);
    }
  }
  expect_near(logits, {glm_hand_logits(0, 0, 1), glm_hand_logits(2, 3, 1), glm_hand_logits(1, 0, 1)}, 1e-12);
}

TEST(Reference, ExpertTiesGoToTheLowerIndex) {
  for (const char* arch : {"llama", "qwen3moe"}) {
    SCOPED_TRACE(arch);
    ExpertChoices choices;
    // Token 1 scores (2, 1, 0, 1): expert 0, then 1 and 3 tie. Token 3 scores 0 for all.
    const std::vector<int32_t> tokens{1, 3};
    const auto logits = run_experts_model(arch, tokens, choices);
    expect_choices(choices, tokens, {{0, 1}, {0, 1}});
    expect_near(logits, {experts_hand_logits(1, 0, 1), experts_hand_logits(3, 0, 1)}, 1e-12);
  }
}

// Weights that are multiples of 1/64 in [-1, 1]: exact in F16 and BF16.
std::vector<float> pseudo_random(size_t count, uint32_t seed) {
  std::vector<float> values(count);
  uint32_t state = seed;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int>(state >> 25) - 64) / 64.0f;
  }
  return values;
}

// 2 layers, dim 8, 4 query heads of 2, FFN 6, vocabulary 5; `kv_heads` 2 or 4. With 4, each
// of the 2 key/value heads is duplicated so that the model computes the same function.
TinyModel random_model(uint32_t kv_heads, const std::string& arch = "llama") {
  TinyModel m;
  m.arch = arch;
  m.set_shape(8, 2, 6, 4, kv_heads, 2);
  m.matrix("token_embd.weight", 5, 8, pseudo_random(40, 1));
  m.vector("output_norm.weight", pseudo_random(8, 2));
  for (int layer = 0; layer < 2; ++layer) {
    const std::string b = "blk." + std::to_string(layer) + ".";
    const auto seed = static_cast<uint32_t>(10 * layer);
    m.vector(b + "attn_norm.weight", pseudo_random(8, seed + 3));
    m.vector(b + "ffn_norm.weight", pseudo_random(8, seed + 4));
    m.matrix(b + "attn_q.weight", 8, 8, pseudo_random(64, seed + 5));
    m.matrix(b + "attn_output.weight", 8, 8, pseudo_random(64, seed + 6));
    m.matrix(b + "ffn_gate.weight", 6, 8, pseudo_random(48, seed + 7));
    m.matrix(b + "ffn_up.weight", 6, 8, pseudo_random(48, seed + 8));
    m.matrix(b + "ffn_down.weight", 8, 6, pseudo_random(48, seed + 9));
    if (arch == "qwen3") {
      m.vector(b + "attn_q_norm.weight", pseudo_random(2, seed + 13));
      m.vector(b + "attn_k_norm.weight", pseudo_random(2, seed + 14));
    }
    for (const char* name : {"attn_k.weight", "attn_v.weight"}) {
      // Two heads of 2 rows of 8.
      const std::vector<float> grouped = pseudo_random(32, seed + (name[5] == 'k' ? 11u : 12u));
      if (kv_heads == 2) {
        m.matrix(b + name, 4, 8, grouped);
      } else {
        std::vector<float> duplicated;
        for (int head = 0; head < 4; ++head) {
          const auto first = grouped.begin() + (head / 2) * 16;
          duplicated.insert(duplicated.end(), first, first + 16);
        }
        m.matrix(b + name, 8, 8, duplicated);
      }
    }
  }
  return m;
}

std::vector<std::vector<double>> run(const TinyModel& m, const std::vector<int32_t>& tokens,
                                     DType type = DType::F32) {
  TempFile file("tiny.gguf");
  m.write(file.path, type);
  return forward_all(*gguf::File::open(file.path), tokens);
}

const std::vector<int32_t> kTinyTokens{1, 4, 0, 2, 2, 3};

TEST(Reference, GroupedQueryAttentionSharesKeyValueHeads) {
  expect_near(run(random_model(2), kTinyTokens), run(random_model(4), kTinyTokens), 1e-12);
}

// QK-norm normalizes each head on its own: scaling one query head's rows of attn_q by 4 and
// one key head's rows of attn_k by 1/4 leaves a qwen3 model's logits as they were (exactly:
// powers of two, and no epsilon), while a llama's change.
TEST(Reference, Qwen3QkNormMakesEachHeadIndependentOfItsScale) {
  for (const char* arch : {"qwen3", "llama"}) {
    SCOPED_TRACE(arch);
    TinyModel plain = random_model(2, arch);
    plain.metadata[std::string(arch) + ".attention.layer_norm_rms_epsilon"] = gguf::Value::f32(0.0f);
    TinyModel scaled = plain;
    for (const char* layer : {"blk.0.", "blk.1."}) {
      std::vector<float>& q = scaled.tensors[std::string(layer) + "attn_q.weight"].values;
      for (size_t i = 16; i < 32; ++i) q[i] *= 4.0f;  // rows 2 and 3: query head 1
      std::vector<float>& k = scaled.tensors[std::string(layer) + "attn_k.weight"].values;
      for (size_t i = 0; i < 16; ++i) k[i] *= 0.25f;  // rows 0 and 1: key head 0
    }
    const auto expected = run(plain, kTinyTokens);
    const auto actual = run(scaled, kTinyTokens);
    if (std::string(arch) == "qwen3") {
      expect_near(actual, expected, 0.0);
    } else {
      EXPECT_NE(actual, expected);
    }
  }
}

TEST(Reference, TiedOutputUsesTheTokenEmbeddings) {
  TinyModel explicit_output = random_model(2);
  explicit_output.matrix("output.weight", 5, 8, pseudo_random(40, 1));
  expect_near(run(random_model(2), kTinyTokens), run(explicit_output, kTinyTokens), 0.0);
}

TEST(Reference, DecodesHalfAndBfloatWeights) {
  const auto f32 = run(random_model(2), kTinyTokens);
  expect_near(run(random_model(2), kTinyTokens, DType::F16), f32, 0.0);
  expect_near(run(random_model(2), kTinyTokens, DType::BF16), f32, 0.0);
}

// Width 256 so that every block format, K-quants included, fits a row.
TinyModel wide_model() {
  TinyModel m;
  m.set_shape(256, 1, 256, 4, 2, 64);
  m.matrix("token_embd.weight", 5, 256, pseudo_random(5 * 256, 21));
  m.vector("output_norm.weight", pseudo_random(256, 22));
  m.vector("blk.0.attn_norm.weight", pseudo_random(256, 23));
  m.vector("blk.0.ffn_norm.weight", pseudo_random(256, 24));
  m.matrix("blk.0.attn_q.weight", 256, 256, pseudo_random(256 * 256, 25));
  m.matrix("blk.0.attn_k.weight", 128, 256, pseudo_random(128 * 256, 26));
  m.matrix("blk.0.attn_v.weight", 128, 256, pseudo_random(128 * 256, 27));
  m.matrix("blk.0.attn_output.weight", 256, 256, pseudo_random(256 * 256, 28));
  m.matrix("blk.0.ffn_gate.weight", 256, 256, pseudo_random(256 * 256, 29));
  m.matrix("blk.0.ffn_up.weight", 256, 256, pseudo_random(256 * 256, 30));
  m.matrix("blk.0.ffn_down.weight", 256, 256, pseudo_random(256 * 256, 31));
  return m;
}

TEST(Reference, QuantizedWeightsActAsTheirDequantizedValues) {
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4}) {
    SCOPED_TRACE(std::string(tensor::dtype_name(type)));
    TinyModel dequantized = wide_model();
    for (auto& [name, t] : dequantized.tensors) {
      if (t.dims.size() != 2) continue;
      std::vector<uint8_t> block_row(*tensor::row_bytes(type, t.dims[0]));
      for (uint64_t r = 0; r < t.dims[1]; ++r) {
        float* row = t.values.data() + r * t.dims[0];
        tensor::quantize_row(type, row, block_row.data(), static_cast<int64_t>(t.dims[0]));
        tensor::dequantize_row(type, block_row.data(), row, static_cast<int64_t>(t.dims[0]));
      }
    }
    expect_near(run(wide_model(), kTinyTokens, type), run(dequantized, kTinyTokens), 0.0);
  }
}

TEST(Reference, RefusesWhatItCannotRun) {
  TinyModel unknown = random_model(2);
  unknown.arch = "gpt2";
  EXPECT_THROW(run(unknown, kTinyTokens), gguf::Error);
  TinyModel yarn = random_model(2);
  yarn.metadata["llama.rope.scaling.type"] = gguf::Value::string("yarn");
  EXPECT_THROW(run(yarn, kTinyTokens), gguf::Error);
  TinyModel half_longrope = random_model(2);
  half_longrope.vector("rope_factors_long.weight", {1.0f});
  EXPECT_THROW(run(half_longrope, kTinyTokens), gguf::Error);
  TinyModel missing = random_model(2);
  missing.tensors.erase("blk.1.ffn_up.weight");
  EXPECT_THROW(run(missing, kTinyTokens), gguf::Error);
  TinyModel no_head_norm = random_model(2, "qwen3");
  no_head_norm.tensors.erase("blk.0.attn_k_norm.weight");
  EXPECT_THROW(run(no_head_norm, kTinyTokens), gguf::Error);
  TinyModel misshapen_experts = experts_model("llama");
  misshapen_experts.experts("blk.0.ffn_down_exps.weight", 2, 4, 1, std::vector<float>(8, 0.0f));
  EXPECT_THROW(run(misshapen_experts, {0, 1}), gguf::Error);
  TinyModel too_many_chosen = experts_model("qwen3moe");
  too_many_chosen.metadata["qwen3moe.expert_used_count"] = gguf::Value::u32(5);
  EXPECT_THROW(run(too_many_chosen, {0, 1}), gguf::Error);
  EXPECT_THROW(run(random_model(2), {0, 5}), std::invalid_argument);
  EXPECT_THROW(run(random_model(2), std::vector<int32_t>(17, 0)), std::invalid_argument);
}

TEST(Reference, RopeScalingSlowsTheRotation) {
  // random_model rotates one pair per head, at frequency 1: a linear factor of 2 and a Llama 3
  // frequency divisor of 2 both halve its angle, and position 0 (angle 0) is unaffected.
  TinyModel linear = random_model(2);
  linear.metadata["llama.rope.scaling.type"] = gguf::Value::string("linear");
  linear.metadata["llama.rope.scaling.factor"] = gguf::Value::f32(2.0f);
  TinyModel divided = random_model(2);
  divided.vector("rope_freqs.weight", {2.0f});
  const auto plain = run(random_model(2), kTinyTokens);
  const auto slowed = run(linear, kTinyTokens);
  expect_near(run(divided, kTinyTokens), slowed, 1e-12);
  expect_near({slowed[0]}, {plain[0]}, 1e-12);
  double largest_difference = 0.0;
  for (size_t i = 0; i < plain[1].size(); ++i) {
    largest_difference = std::max(largest_difference, std::fabs(plain[1][i] - slowed[1][i]));
  }
  EXPECT_GT(largest_difference, 1e-6);
}

class AidreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kModelPath)) GTEST_SKIP() << "missing " << kModelPath;
    model_ = gguf::File::open(kModelPath);
    const gguf::Array* pieces = model_->get_array("tokenizer.ggml.tokens");
    ASSERT_NE(pieces, nullptr);
    for (const gguf::Value& piece : pieces->items) pieces_.push_back(*piece.as_string());
  }

  // Greedy longest match over the vocabulary: enough to build a prompt for this model.
  std::vector<int32_t> tokenize(const std::string& text) const {
    std::string remaining;
    for (char c : " " + text) remaining += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    std::vector<int32_t> tokens;
    while (!remaining.empty()) {
      int32_t best = -1;
      for (size_t id = 0; id < pieces_.size(); ++id) {
        const std::string& piece = pieces_[id];
        if (!piece.empty() && remaining.starts_with(piece) &&
            (best < 0 || piece.size() > pieces_[static_cast<size_t>(best)].size())) {
          best = static_cast<int32_t>(id);
        }
      }
      EXPECT_GE(best, 0) << "cannot tokenize " << remaining;
      if (best < 0) break;
      tokens.push_back(best);
      remaining.erase(0, pieces_[static_cast<size_t>(best)].size());
    }
    return tokens;
  }

  std::string text_of(int32_t token) const {
    std::string text;
    const std::string& piece = pieces_[static_cast<size_t>(token)];
    for (size_t i = 0; i < piece.size(); ++i) {
      if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
        text += ' ';
        i += 2;
      } else {
        text += piece[i];
      }
    }
    return text;
  }

  std::unique_ptr<gguf::File> model_;
  std::vector<std::string> pieces_;
};

TEST_F(AidreamsTest, LogitsDoNotDependOnLaterTokens) {
  const std::vector<int32_t> first{1, 300, 12, 47, 400, 5, 511, 260, 99, 200};
  std::vector<int32_t> second = first;
  second[6] = 42;
  second[9] = 7;
  const auto a = forward_all(*model_, first);
  const auto b = forward_all(*model_, second);
  ASSERT_EQ(a.size(), first.size());
  ASSERT_EQ(a[0].size(), 512u);
  for (size_t t = 0; t < 6; ++t) EXPECT_EQ(a[t], b[t]) << "position " << t;
  EXPECT_NE(a[6], b[6]);
  EXPECT_NE(a[9], b[9]);
  // And a prefix alone gives the same rows as within the longer sequence.
  const std::vector<int32_t> prefix(first.begin(), first.begin() + 4);
  const auto c = forward_all(*model_, prefix);
  for (size_t t = 0; t < 4; ++t) EXPECT_EQ(a[t], c[t]) << "position " << t;
}

TEST_F(AidreamsTest, GreedyDecodingWritesEnglish) {
  std::vector<int32_t> tokens{1};
  const std::vector<int32_t> prompt = tokenize("Once upon a time");
  tokens.insert(tokens.end(), prompt.begin(), prompt.end());
  const size_t prompt_size = tokens.size();
  for (int step = 0; step < 64; ++step) {
    const std::vector<double> last = forward_all(*model_, tokens).back();
    tokens.push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
  }

  std::string prompt_text, generated_text, prompt_ids, generated_ids;
  for (size_t i = 0; i < tokens.size(); ++i) {
    (i < prompt_size ? prompt_text : generated_text) += i == 0 ? "" : text_of(tokens[i]);
    (i < prompt_size ? prompt_ids : generated_ids) += std::to_string(tokens[i]) + " ";
  }
  std::cout << "prompt:" << prompt_text << "\nprompt ids: " << prompt_ids
            << "\ngenerated:" << generated_text << "\ngenerated ids: " << generated_ids << "\n";

  // Most generated pieces are letters, spaces or ordinary punctuation, not bytes or noise.
  int wordlike = 0;
  for (size_t i = prompt_size; i < tokens.size(); ++i) {
    const std::string text = text_of(tokens[i]);
    bool ok = !text.empty();
    for (char c : text) {
      ok = ok && (std::isalpha(static_cast<unsigned char>(c)) || c == ' ' || c == ',' || c == '.');
    }
    wordlike += ok;
  }
  EXPECT_GT(wordlike, 64 * 8 / 10);
}

}  // namespace
}  // namespace strata::reference
