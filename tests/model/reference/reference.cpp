#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "tensor/dtype.h"
#include "tensor/quant.h"

namespace strata::reference {
namespace {

using Vector = std::vector<double>;
using Matrix = std::vector<Vector>;  // one row per position

struct Hyperparameters {
  bool neox_rope = false;  // qwen2, qwen3, phi3, glm4moe rotate (x[i], x[i + n/2]); llama, deepseek2 (x[2i], x[2i+1])
  bool qk_norm = false;    // qwen3 (and GLM-4.5): each head of Q and K is RMS-normalized before RoPE
  bool fused_gate_up = false;  // phi3: ffn_up holds the gate's rows, then the up's
  std::string ffn_norm = "ffn_norm";  // the norm before the FFN; glm4moe's is post_attention_norm
  size_t embedding = 0;
  size_t layers = 0;  // those the forward pass runs: glm4moe's NextN layers after them are not
  size_t feed_forward = 0;
  size_t heads = 0;
  size_t kv_heads = 0;
  size_t head_dim = 0;
  size_t context = 0;
  double rms_epsilon = 0.0;
  size_t rope_dims = 0;
  double rope_base = 10000.0;
  double rope_position_scale = 1.0;  // 1 / linear scaling factor
  // A Mixture-of-Experts FFN (Mixtral, Qwen3-MoE) when expert_count > 0: experts_per_token of
  // expert_count SwiGLU experts of expert_feed_forward rows each.
  size_t expert_count = 0;
  size_t experts_per_token = 0;
  size_t expert_feed_forward = 0;
  // gpt-oss: attention sinks; the even layers attend to the last `sliding_window` positions;
  // YaRN RoPE; the router picks the top experts by score and weighs them by a softmax over
  // just their scores; experts have biases and the clamped SwiGLU
  // (g = min(gate, 7), u = clamp(up, -7, 7): g sigmoid(1.702 g) (u + 1)).
  bool gpt_oss = false;
  size_t sliding_window = 0;
  double yarn_factor = 0.0;  // 0: no YaRN
  double yarn_original_context = 0.0;
  // Gemma 3: embeddings times sqrt(width); 5 of every 6 layers local (a window, RoPE base
  // 10000, unscaled), the 6th global; queries scaled by 1 / sqrt(query_pre_attn_scalar), which
  // is the head size (the 27B's, of 62 layers, width / heads); attention and FFN outputs
  // RMS-normalized before the residual; GeGLU (tanh GELU) FFNs.
  bool gemma = false;
  // glm4moe's routing: each expert's sigmoid of its score, plus a per-expert bias for the choice
  // only; the chosen weights divided by their sum (when normalized) and scaled; a shared
  // expert every token runs; and leading layers with a dense FFN instead.
  bool sigmoid_gating = false;
  bool selection_bias = false;
  bool normalize_weights = true;
  double weights_scale = 1.0;
  size_t shared_feed_forward = 0;
  size_t leading_dense = 0;
  // DeepSeek (deepseek2): multi-head latent attention, in its plain form. Each head's query
  // (nope_dim + rope_dims: the part without RoPE first) is a projection of the input, or of a
  // normalized bottleneck of q_rank; one projection gives the latent (kv_rank, normalized)
  // and a rope_dims key part every head shares; each head's key is its own projection of the
  // latent (nope_dim) beside that shared part, its value another (value_dim). The experts'
  // groups: a position chooses among the experts of the expert_groups_used groups whose two
  // highest ranked scores sum highest.
  bool latent_attention = false;
  size_t q_rank = 0;
  size_t kv_rank = 0;
  size_t nope_dim = 0;
  size_t value_dim = 0;
  size_t expert_groups = 0;
  size_t expert_groups_used = 0;
  // YaRN's cos and sin magnitude, and DeepSeek's factor of the attention scale.
  double yarn_magnitude = 1.0;
  std::string rope_factors = "rope_freqs.weight";  // the per-frequency divisors' tensor, if the file has it
  double attention_factor = 1.0;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
};

size_t required_uint(const gguf::File& model, const std::string& key) {
  const std::optional<uint64_t> value = model.get_uint(key);
  if (!value || *value == 0) throw gguf::Error("reference: missing or zero " + key);
  return static_cast<size_t>(*value);
}

Hyperparameters read_hyperparameters(const gguf::File& model) {
  const std::optional<std::string> arch = model.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "qwen3moe" && arch != "gpt-oss" &&
      arch != "gemma3" && arch != "phi3" && arch != "glm4moe" && arch != "deepseek2") {
    throw gguf::Error("reference: unsupported architecture " + arch.value_or("(none)"));
  }
  const std::string prefix = *arch + ".";
  const bool glm = *arch == "glm4moe";
  const bool deepseek = *arch == "deepseek2";
  Hyperparameters hp;
  hp.neox_rope = *arch != "llama" && !deepseek;
  hp.gemma = *arch == "gemma3";
  hp.qk_norm = *arch == "qwen3" || *arch == "qwen3moe" || hp.gemma ||
               (glm && model.find_tensor("blk.0.attn_q_norm.weight"));
  hp.gpt_oss = *arch == "gpt-oss";
  if (hp.gpt_oss || hp.gemma) hp.sliding_window = required_uint(model, prefix + "attention.sliding_window");
  hp.fused_gate_up = *arch == "phi3";
  if (glm || hp.gpt_oss) hp.ffn_norm = "post_attention_norm";
  hp.embedding = required_uint(model, prefix + "embedding_length");
  hp.layers = required_uint(model, prefix + "block_count") -
              model.get_uint(prefix + "nextn_predict_layers").value_or(0);
  hp.feed_forward = required_uint(model, prefix + "feed_forward_length");
  if (glm || deepseek) {
    // llama.cpp's numbers: 1 softmax, 2 sigmoid; unset, GLM's is sigmoid and DeepSeek's softmax.
    const uint64_t gating = model.get_uint(prefix + "expert_gating_func").value_or(glm ? 2 : 1);
    if (gating != 1 && gating != 2) throw gguf::Error("reference: unknown expert gating function");
    hp.sigmoid_gating = gating == 2;
    hp.leading_dense = model.get_uint(prefix + "leading_dense_block_count").value_or(0);
    hp.selection_bias = glm || model.find_tensor("blk." + std::to_string(hp.leading_dense) + ".exp_probs_b.bias");
    hp.normalize_weights = model.get_bool(prefix + "expert_weights_norm").value_or(false);
    hp.weights_scale = model.get_float(prefix + "expert_weights_scale").value_or(1.0);
    hp.leading_dense = model.get_uint(prefix + "leading_dense_block_count").value_or(0);
  }
  // Mixtral is a llama whose metadata counts experts; Qwen3-MoE, gpt-oss and GLM-4.5 always
  // have them.
  if (model.get_uint(prefix + "expert_count") || *arch == "qwen3moe" || hp.gpt_oss || glm) {
    hp.expert_groups = model.get_uint(prefix + "expert_group_count").value_or(1);
    hp.expert_groups_used = model.get_uint(prefix + "expert_group_used_count").value_or(1);
    hp.expert_count = required_uint(model, prefix + "expert_count");
    hp.experts_per_token = required_uint(model, prefix + "expert_used_count");
    // Mixtral's experts are feed_forward_length wide; Qwen3-MoE names their width.
    hp.expert_feed_forward =
        model.get_uint(prefix + "expert_feed_forward_length").value_or(hp.feed_forward);
    if (hp.experts_per_token > hp.expert_count || hp.expert_feed_forward == 0) {
      throw gguf::Error("reference: inconsistent expert counts");
    }
    hp.shared_feed_forward = model.get_uint(prefix + "expert_shared_count").value_or(0) * hp.expert_feed_forward;
  }
  hp.heads = required_uint(model, prefix + "attention.head_count");
  hp.kv_heads = model.get_uint(prefix + "attention.head_count_kv").value_or(hp.heads);
  hp.head_dim = model.get_uint(prefix + "attention.key_length").value_or(hp.embedding / hp.heads);
  hp.context = required_uint(model, prefix + "context_length");
  const std::optional<double> epsilon = model.get_float(prefix + "attention.layer_norm_rms_epsilon");
  if (!epsilon) throw gguf::Error("reference: missing " + prefix + "attention.layer_norm_rms_epsilon");
  hp.rms_epsilon = *epsilon;
  hp.rope_dims = model.get_uint(prefix + "rope.dimension_count").value_or(hp.head_dim);
  hp.rope_base = model.get_float(prefix + "rope.freq_base").value_or(10000.0);
  if (hp.kv_heads == 0 || hp.heads % hp.kv_heads != 0 || hp.head_dim == 0 ||
      hp.rope_dims % 2 != 0 || hp.rope_dims > hp.head_dim) {
    throw gguf::Error("reference: inconsistent attention shape");
  }

  const std::string scaling = model.get_string(prefix + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    const double factor = model.get_float(prefix + "rope.scaling.factor").value_or(1.0);
    if (factor <= 0.0) throw gguf::Error("reference: RoPE scaling factor must be positive");
    hp.rope_position_scale = 1.0 / factor;
  } else if (scaling == "yarn") {
    hp.yarn_factor = model.get_float(prefix + "rope.scaling.factor").value_or(1.0);
    hp.yarn_original_context = static_cast<double>(required_uint(model, prefix + "rope.scaling.original_context_length"));
    if (hp.yarn_factor < 1.0) throw gguf::Error("reference: YaRN factor below 1");
    hp.yarn_beta_fast = model.get_float(prefix + "rope.scaling.yarn_beta_fast").value_or(32.0);
    hp.yarn_beta_slow = model.get_float(prefix + "rope.scaling.yarn_beta_slow").value_or(1.0);
    // YaRN scales cos and sin by 1 + 0.1 ln(factor). DeepSeek's, given its mscale_all_dim m
    // (the converter writes 0.1 m), scales the scores by (1 + 0.1 m ln(factor))^2 instead, and
    // cos and sin by its mscale's over m's, which GGUF takes for 1.
    const double log_multiplier = model.get_float(prefix + "rope.scaling.yarn_log_multiplier").value_or(0.0);
    if (log_multiplier != 0.0 && !deepseek) throw gguf::Error("reference: YaRN log multiplier outside deepseek2");
    const double mscale = 1.0 + log_multiplier * std::log(hp.yarn_factor);
    hp.attention_factor = mscale * mscale;
    hp.yarn_magnitude = log_multiplier != 0.0 ? 1.0 : 1.0 + 0.1 * std::log(hp.yarn_factor);
  } else if (scaling != "none") {
    throw gguf::Error("reference: unsupported RoPE scaling " + scaling);
  }
  // LongRoPE's attention factor scales cos and sin like YaRN's magnitude.
  hp.yarn_magnitude *= model.get_float(prefix + "rope.scaling.attn_factor").value_or(1.0);
  // Llama 3 stores its long-context RoPE correction as per-frequency divisors; LongRoPE one set
  // for a context past the original one and one within it, and the model's context decides.
  if ((model.find_tensor("rope_factors_long.weight") == nullptr) !=
      (model.find_tensor("rope_factors_short.weight") == nullptr)) {
    throw gguf::Error("reference: LongRoPE needs both rope_factors_long and rope_factors_short");
  }
  if (model.find_tensor("rope_factors_long.weight")) {
    const bool past_original =
        hp.context > model.get_uint(prefix + "rope.scaling.original_context_length").value_or(hp.context);
    hp.rope_factors = past_original ? "rope_factors_long.weight" : "rope_factors_short.weight";
  }
  if (deepseek) {
    hp.latent_attention = true;
    hp.kv_rank = required_uint(model, prefix + "attention.kv_lora_rank");
    hp.q_rank = model.get_uint(prefix + "attention.q_lora_rank").value_or(0);
    // Newer files name the heads' sizes *_mla (key_length being the cache's); older ones not.
    const bool mla_names = model.get_uint(prefix + "attention.key_length_mla").has_value();
    const size_t key = required_uint(model, prefix + (mla_names ? "attention.key_length_mla" : "attention.key_length"));
    hp.value_dim = required_uint(model, prefix + (mla_names ? "attention.value_length_mla" : "attention.value_length"));
    if (key <= hp.rope_dims) throw gguf::Error("reference: latent attention's key no wider than its RoPE part");
    hp.nope_dim = key - hp.rope_dims;
  }
  return hp;
}

double half_to_double(uint16_t bits) {
  const int sign = bits >> 15;
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(mantissa + 1024, exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

// A weight matrix of `rows` rows of `cols` values (GGUF dims {cols, rows}), decoded row by row;
// or matrix `matrix` of a tensor of several (dims {cols, rows, count}: a layer's experts).
class Weight {
 public:
  Weight(const gguf::File& model, const gguf::TensorInfo& info, size_t matrix = 0)
      : model_(model), info_(info) {
    const auto type = static_cast<tensor::DType>(info.type);
    if (!tensor::info(type).computable) {
      throw gguf::Error("reference: tensor " + info.name + " has unsupported type " +
                        std::string(tensor::dtype_name(type)));
    }
    const std::optional<uint64_t> bytes = tensor::row_bytes(type, info.dims[0]);
    if (!bytes) throw gguf::Error("reference: rows of " + info.name + " are not whole blocks");
    row_bytes_ = static_cast<size_t>(*bytes);
    first_byte_ = matrix * rows() * row_bytes_;
  }
  size_t cols() const { return static_cast<size_t>(info_.dims[0]); }
  size_t rows() const { return info_.dims.size() > 1 ? static_cast<size_t>(info_.dims[1]) : 1; }

  // Plain float types are decoded here; block-quantized rows go through the engine's
  // dequantizer, which has its own tests against hand-built blocks.
  Vector row(size_t index) const {
    const uint8_t* data = model_.tensor_data(info_) + first_byte_ + index * row_bytes_;
    Vector values(cols());
    switch (static_cast<tensor::DType>(info_.type)) {
      case tensor::DType::F32:
        for (size_t c = 0; c < values.size(); ++c) {
          float value;
          std::memcpy(&value, data + c * 4, 4);
          values[c] = value;
        }
        break;
      case tensor::DType::F16:
        for (size_t c = 0; c < values.size(); ++c) {
          uint16_t bits;
          std::memcpy(&bits, data + c * 2, 2);
          values[c] = half_to_double(bits);
        }
        break;
      case tensor::DType::BF16:  // the upper half of an F32
        for (size_t c = 0; c < values.size(); ++c) {
          uint16_t bits;
          std::memcpy(&bits, data + c * 2, 2);
          const uint32_t widened = uint32_t{bits} << 16;
          float value;
          std::memcpy(&value, &widened, 4);
          values[c] = value;
        }
        break;
      default: {
        std::vector<float> dequantized(values.size());
        tensor::dequantize_row(static_cast<tensor::DType>(info_.type), data, dequantized.data(),
                               static_cast<int64_t>(dequantized.size()));
        values.assign(dequantized.begin(), dequantized.end());
      }
    }
    return values;
  }

 private:
  const gguf::File& model_;
  const gguf::TensorInfo& info_;
  size_t row_bytes_ = 0;
  size_t first_byte_ = 0;
};

const gguf::TensorInfo* find_with_shape(const gguf::File& model, const std::string& name,
                                        std::vector<uint64_t> dims) {
  const gguf::TensorInfo* info = model.find_tensor(name);
  if (info && info->dims != dims) throw gguf::Error("reference: tensor " + name + " has the wrong shape");
  return info;
}

Weight require(const gguf::File& model, const std::string& name, std::vector<uint64_t> dims) {
  const gguf::TensorInfo* info = find_with_shape(model, name, std::move(dims));
  if (!info) throw gguf::Error("reference: missing tensor " + name);
  return Weight(model, *info);
}

// The `count` matrices of a tensor of experts, each `rows` rows of `cols` values.
std::vector<Weight> require_experts(const gguf::File& model, const std::string& name, uint64_t cols,
                                    uint64_t rows, uint64_t count) {
  const gguf::TensorInfo* info = find_with_shape(model, name, {cols, rows, count});
  if (!info) throw gguf::Error("reference: missing tensor " + name);
  std::vector<Weight> experts;
  for (size_t e = 0; e < count; ++e) experts.emplace_back(model, *info, e);
  return experts;
}

std::optional<Vector> optional_vector(const gguf::File& model, const std::string& name, size_t n) {
  const gguf::TensorInfo* info = find_with_shape(model, name, {n});
  if (!info) return std::nullopt;
  return Weight(model, *info).row(0);
}

Vector required_vector(const gguf::File& model, const std::string& name, size_t n) {
  std::optional<Vector> v = optional_vector(model, name, n);
  if (!v) throw gguf::Error("reference: missing tensor " + name);
  return *std::move(v);
}

double dot(const Vector& a, const Vector& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// y = W x (+ bias) for every position; each weight row is decoded once for all positions.
Matrix project(const Weight& weight, const Matrix& inputs, const std::optional<Vector>& bias) {
  Matrix outputs(inputs.size(), Vector(weight.rows()));
  for (size_t r = 0; r < weight.rows(); ++r) {
    const Vector row = weight.row(r);
    for (size_t t = 0; t < inputs.size(); ++t) {
      outputs[t][r] = dot(row, inputs[t]) + (bias ? (*bias)[r] : 0.0);
    }
  }
  return outputs;
}

Matrix rms_norm(const Matrix& inputs, const Vector& weight, double epsilon) {
  Matrix outputs = inputs;
  for (Vector& x : outputs) {
    const double inverse_rms = 1.0 / std::sqrt(dot(x, x) / static_cast<double>(x.size()) + epsilon);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= inverse_rms * weight[i];
  }
  return outputs;
}

// RMSNorm of each head of every position on its own, with one weight per head dimension.
void rms_norm_heads(Matrix& projections, size_t head_count, size_t head_dim, const Vector& weight,
                    double epsilon) {
  for (Vector& x : projections) {
    for (size_t head = 0; head < head_count; ++head) {
      const auto first = x.begin() + static_cast<std::ptrdiff_t>(head * head_dim);
      const Matrix normed = rms_norm({Vector(first, first + static_cast<std::ptrdiff_t>(head_dim))}, weight, epsilon);
      std::copy(normed[0].begin(), normed[0].end(), first);
    }
  }
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

struct FfnBiases {
  std::optional<Vector> gate, up, down;
};

// How a gated FFN combines its gate g and up u: SwiGLU, silu(g) * u; gpt-oss's clamped form
// (Hyperparameters); Gemma's GeGLU, tanh-GELU(g) * u.
enum class Gating { Silu, ClampedSilu, Gelu };

// down(act(gate, up)) (+ its bias) of every position, from its gate's and up's projections.
Matrix gated_down(const Matrix& gates, Matrix hidden, const Weight& down, Gating gating,
                  const std::optional<Vector>& down_bias = std::nullopt) {
  for (size_t t = 0; t < hidden.size(); ++t) {
    for (size_t i = 0; i < hidden[t].size(); ++i) {
      const double g = gates[t][i];
      switch (gating) {
        case Gating::Silu: hidden[t][i] *= silu(g); break;
        case Gating::ClampedSilu: {
          const double clamped = std::min(g, 7.0);
          hidden[t][i] = clamped / (1.0 + std::exp(-1.702 * clamped)) * (std::clamp(hidden[t][i], -7.0, 7.0) + 1.0);
          break;
        }
        case Gating::Gelu:
          hidden[t][i] *= 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)));
          break;
      }
    }
  }
  return project(down, hidden, down_bias);
}

// The gated feed-forward network down(act(gate x, up x)) of every position, biases added
// where given.
Matrix gated_ffn(const Weight& gate, const Weight& up, const Weight& down, const Matrix& inputs, Gating gating,
                 const FfnBiases& biases = {}) {
  return gated_down(project(gate, inputs, biases.gate), project(up, inputs, biases.up), down, gating, biases.down);
}

// Columns [first, first + count) of every row.
Matrix columns(const Matrix& rows, size_t first, size_t count) {
  Matrix out;
  for (const Vector& row : rows) {
    out.emplace_back(row.begin() + static_cast<std::ptrdiff_t>(first),
                     row.begin() + static_cast<std::ptrdiff_t>(first + count));
  }
  return out;
}

// The `count` indices of the largest probabilities, largest first; of equal ones the lower index.
std::vector<int> top_experts(const Vector& probabilities, size_t count) {
  std::vector<int> chosen;
  std::vector<bool> taken(probabilities.size(), false);
  while (chosen.size() < count) {
    size_t best = probabilities.size();
    for (size_t e = 0; e < probabilities.size(); ++e) {
      // Strictly greater: an equal probability further on does not displace the lower index.
      if (!taken[e] && (best == probabilities.size() || probabilities[e] > probabilities[best])) best = e;
    }
    taken[best] = true;
    chosen.push_back(static_cast<int>(best));
  }
  return chosen;
}

// A Mixture-of-Experts FFN: each position's router scores go through a softmax (or, for
// glm4moe, each through a sigmoid); the position takes the experts of its top
// experts_per_token probabilities (glm4moe: each plus its expert's exp_probs_b), and sums
// their SwiGLU outputs weighted by those probabilities divided by their sum (glm4moe: when
// expert_weights_norm, then times expert_weights_scale), in its order of choices, plus the
// shared expert's output. Every expert is computed for every position (plainly; the engine
// runs each only on the rows that chose it). Records each position's choices in `choices`,
// with the values its choice ranks as scores: the router's scores, or glm4moe's biased
// probabilities.
Matrix mixture_of_experts(const gguf::File& model, const std::string& block, const Hyperparameters& hp,
                          const Matrix& inputs, std::vector<ExpertChoice>& choices) {
  const Matrix scores = project(require(model, block + "ffn_gate_inp.weight", {hp.embedding, hp.expert_count}),
                                inputs, optional_vector(model, block + "ffn_gate_inp.bias", hp.expert_count));
  const auto experts = [&](const char* name, uint64_t cols, uint64_t rows) {
    return require_experts(model, block + name, cols, rows, hp.expert_count);
  };
  const std::vector<Weight> gates = experts("ffn_gate_exps.weight", hp.embedding, hp.expert_feed_forward);
  const std::vector<Weight> ups = experts("ffn_up_exps.weight", hp.embedding, hp.expert_feed_forward);
  const std::vector<Weight> downs = experts("ffn_down_exps.weight", hp.expert_feed_forward, hp.embedding);
  // gpt-oss's experts have biases: row e of a {length, experts} tensor is expert e's.
  const auto expert_bias = [&](const char* name, uint64_t length, size_t e) -> std::optional<Vector> {
    const gguf::TensorInfo* info = find_with_shape(model, block + name, {length, hp.expert_count});
    if (!info) return std::nullopt;
    return Weight(model, *info).row(e);
  };
  std::vector<Matrix> expert_outputs;
  for (size_t e = 0; e < hp.expert_count; ++e) {
    const FfnBiases biases{expert_bias("ffn_gate_exps.bias", hp.expert_feed_forward, e),
                           expert_bias("ffn_up_exps.bias", hp.expert_feed_forward, e),
                           expert_bias("ffn_down_exps.bias", hp.embedding, e)};
    expert_outputs.push_back(
        gated_ffn(gates[e], ups[e], downs[e], inputs, hp.gpt_oss ? Gating::ClampedSilu : Gating::Silu, biases));
  }

  const std::optional<Vector> bias =
      hp.selection_bias ? optional_vector(model, block + "exp_probs_b.bias", hp.expert_count) : std::nullopt;
  if (hp.selection_bias && !bias) throw gguf::Error("reference: missing tensor " + block + "exp_probs_b.bias");
  Matrix outputs(inputs.size(), Vector(hp.embedding, 0.0));
  if (hp.shared_feed_forward > 0) {
    const auto shared = [&](const char* name, uint64_t cols, uint64_t rows) {
      return require(model, block + name, {cols, rows});
    };
    outputs = gated_ffn(shared("ffn_gate_shexp.weight", hp.embedding, hp.shared_feed_forward),
                        shared("ffn_up_shexp.weight", hp.embedding, hp.shared_feed_forward),
                        shared("ffn_down_shexp.weight", hp.shared_feed_forward, hp.embedding), inputs, Gating::Silu);
  }
  choices.clear();
  for (size_t t = 0; t < inputs.size(); ++t) {
    Vector probabilities(hp.expert_count);
    if (hp.sigmoid_gating) {
      for (size_t e = 0; e < hp.expert_count; ++e) probabilities[e] = 1.0 / (1.0 + std::exp(-scores[t][e]));
    } else {
      const double max_score = *std::max_element(scores[t].begin(), scores[t].end());
      double total = 0.0;
      for (size_t e = 0; e < hp.expert_count; ++e) {
        probabilities[e] = std::exp(scores[t][e] - max_score);
        total += probabilities[e];
      }
      for (double& p : probabilities) p /= total;
    }
    // gpt-oss chooses by score and softmaxes only the chosen scores; the others by probability
    // (glm4moe's plus its expert's bias) and divide by the chosen ones' sum. (The same weights
    // in exact arithmetic.)
    Vector ranked = hp.gpt_oss ? scores[t] : probabilities;
    for (size_t e = 0; bias && e < hp.expert_count; ++e) ranked[e] += (*bias)[e];
    // Groups of consecutive experts: only those of the best groups by their two highest
    // ranked scores stay candidates.
    double group_margin = INFINITY;
    if (hp.expert_groups > 1) {
      const size_t group_size = hp.expert_count / hp.expert_groups;
      Vector group_scores;
      for (size_t g = 0; g < hp.expert_groups; ++g) {
        const Vector members(ranked.begin() + static_cast<std::ptrdiff_t>(g * group_size),
                             ranked.begin() + static_cast<std::ptrdiff_t>((g + 1) * group_size));
        const std::vector<int> best = top_experts(members, 2);
        group_scores.push_back(members[static_cast<size_t>(best[0])] + members[static_cast<size_t>(best[1])]);
      }
      const std::vector<int> kept = top_experts(group_scores, hp.expert_groups_used);
      for (size_t g = 0; g < hp.expert_groups; ++g) {
        if (std::find(kept.begin(), kept.end(), static_cast<int>(g)) == kept.end()) {
          group_margin = std::min(group_margin, group_scores[static_cast<size_t>(kept.back())] - group_scores[g]);
        }
      }
      for (size_t e = 0; e < hp.expert_count; ++e) {
        if (std::find(kept.begin(), kept.end(), static_cast<int>(e / group_size)) == kept.end()) ranked[e] = -INFINITY;
      }
    }
    const std::vector<int> chosen = top_experts(ranked, hp.experts_per_token);
    double chosen_total = 0.0;
    for (int e : chosen) chosen_total += probabilities[static_cast<size_t>(e)];
    double chosen_max = -INFINITY, chosen_exp_total = 0.0;
    for (int e : chosen) chosen_max = std::max(chosen_max, scores[t][static_cast<size_t>(e)]);
    for (int e : chosen) chosen_exp_total += std::exp(scores[t][static_cast<size_t>(e)] - chosen_max);
    for (int e : chosen) {
      const double weight =
          hp.gpt_oss ? std::exp(scores[t][static_cast<size_t>(e)] - chosen_max) / chosen_exp_total
                     : probabilities[static_cast<size_t>(e)] / (hp.normalize_weights ? chosen_total : 1.0) *
                           hp.weights_scale;
      for (size_t i = 0; i < hp.embedding; ++i) outputs[t][i] += weight * expert_outputs[static_cast<size_t>(e)][t][i];
    }
    choices.push_back({chosen, bias || hp.expert_groups > 1 ? ranked : scores[t], hp.sigmoid_gating ? 0.25 : 1.0,
                       group_margin});
  }
  return outputs;
}

// YaRN (as llama.cpp applies it to GGUF files): the pairs that turn more than beta_fast (32
// unless the file says) times within the original context keep their frequency, those that
// turn fewer than beta_slow (1) times take it divided by the factor, with a linear ramp
// between (the pair bounds rounded outwards).
double yarn_frequency_scale(const Hyperparameters& hp, size_t pair) {
  if (hp.yarn_factor == 0.0) return 1.0;
  const double dims = static_cast<double>(hp.rope_dims);
  const auto pair_turning = [&](double turns) {
    return dims * std::log(hp.yarn_original_context / (turns * 2.0 * 3.14159265358979323846)) /
           (2.0 * std::log(hp.rope_base));
  };
  const double low = std::max(0.0, std::floor(pair_turning(hp.yarn_beta_fast)));
  const double high = std::min(dims - 1.0, std::ceil(pair_turning(hp.yarn_beta_slow)));
  const double ramp = std::clamp((static_cast<double>(pair) - low) / std::max(0.001, high - low), 0.0, 1.0);
  const double kept = 1.0 - ramp;
  return kept + (1.0 - kept) / hp.yarn_factor;
}

// Rotates each head of every position by its position's angles.
void apply_rope(Matrix& projections, size_t head_count, const Hyperparameters& hp,
                const std::optional<Vector>& frequency_factors) {
  const size_t half = hp.rope_dims / 2;
  for (size_t position = 0; position < projections.size(); ++position) {
    for (size_t head = 0; head < head_count; ++head) {
      double* x = projections[position].data() + head * hp.head_dim;
      for (size_t i = 0; i < half; ++i) {
        const double inverse_frequency =
            std::pow(hp.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(hp.rope_dims)) *
            yarn_frequency_scale(hp, i);
        const double angle = static_cast<double>(position) * hp.rope_position_scale *
                             inverse_frequency / (frequency_factors ? (*frequency_factors)[i] : 1.0);
        const size_t first = hp.neox_rope ? i : 2 * i;
        const size_t second = hp.neox_rope ? i + half : 2 * i + 1;
        const double a = x[first];
        const double b = x[second];
        const double magnitude = hp.yarn_magnitude;
        x[first] = magnitude * (a * std::cos(angle) - b * std::sin(angle));
        x[second] = magnitude * (a * std::sin(angle) + b * std::cos(angle));
      }
    }
  }
}

// The heads of an attention: `heads` queries and keys of key_dim, grouped onto kv_heads
// key/value heads, values of value_dim; scores times `scale`.
struct Heads {
  size_t heads, kv_heads, key_dim, value_dim;
  double scale;
};

// Causal multi-head attention with grouped key/value heads; position t sees positions
// t - window + 1 .. t (window 0: all before it). A head's sink is one more logit in its
// softmax, with no value.
Matrix attend(const Matrix& queries, const Matrix& keys, const Matrix& values, const Heads& shape, size_t window,
              const std::optional<Vector>& sinks) {
  const size_t group = shape.heads / shape.kv_heads;
  Matrix outputs(queries.size(), Vector(shape.heads * shape.value_dim, 0.0));
  for (size_t t = 0; t < queries.size(); ++t) {
    for (size_t head = 0; head < shape.heads; ++head) {
      const size_t q_offset = head * shape.key_dim;
      const size_t k_offset = (head / group) * shape.key_dim;
      const size_t first = window > 0 && t + 1 > window ? t + 1 - window : 0;
      Vector scores(t + 1, -INFINITY);
      for (size_t j = first; j <= t; ++j) {
        double score = 0.0;
        for (size_t d = 0; d < shape.key_dim; ++d) {
          score += queries[t][q_offset + d] * keys[j][k_offset + d];
        }
        scores[j] = score * shape.scale;
      }
      double max_score = sinks ? (*sinks)[head] : -INFINITY;
      for (double s : scores) max_score = std::max(max_score, s);
      double total = sinks ? std::exp((*sinks)[head] - max_score) : 0.0;
      for (double& s : scores) total += (s = std::exp(s - max_score));
      for (size_t j = first; j <= t; ++j) {
        for (size_t d = 0; d < shape.value_dim; ++d) {
          outputs[t][head * shape.value_dim + d] += scores[j] / total * values[j][(head / group) * shape.value_dim + d];
        }
      }
    }
  }
  return outputs;
}

void add_in_place(Matrix& accumulator, const Matrix& addend) {
  for (size_t t = 0; t < accumulator.size(); ++t) {
    for (size_t i = 0; i < accumulator[t].size(); ++i) accumulator[t][i] += addend[t][i];
  }
}

// DeepSeek's latent attention as its definition states it: every head's full key and value
// from the latent, then plain multi-head attention over them.
Matrix latent_attention(const gguf::File& model, const std::string& block, const Hyperparameters& hp,
                        const Matrix& input) {
  const auto norm = [&](const std::string& name, size_t size) { return required_vector(model, block + name, size); };
  const size_t query_dim = hp.nope_dim + hp.rope_dims;
  Matrix queries;
  if (hp.q_rank > 0) {
    const Matrix bottleneck = rms_norm(project(require(model, block + "attn_q_a.weight", {hp.embedding, hp.q_rank}),
                                               input, std::nullopt),
                                       norm("attn_q_a_norm.weight", hp.q_rank), hp.rms_epsilon);
    queries = project(require(model, block + "attn_q_b.weight", {hp.q_rank, hp.heads * query_dim}), bottleneck,
                      std::nullopt);
  } else {
    queries = project(require(model, block + "attn_q.weight", {hp.embedding, hp.heads * query_dim}), input,
                      std::nullopt);
  }
  const Matrix compressed = project(
      require(model, block + "attn_kv_a_mqa.weight", {hp.embedding, hp.kv_rank + hp.rope_dims}), input, std::nullopt);
  const Matrix latent = rms_norm(columns(compressed, 0, hp.kv_rank), norm("attn_kv_a_norm.weight", hp.kv_rank),
                                 hp.rms_epsilon);
  Hyperparameters rope = hp;
  rope.head_dim = hp.rope_dims;  // RoPE's parts on their own
  Matrix shared_rotated = columns(compressed, hp.kv_rank, hp.rope_dims);
  apply_rope(shared_rotated, 1, rope, std::nullopt);
  Matrix query_rotated(queries.size(), Vector(hp.heads * hp.rope_dims));
  for (size_t t = 0; t < queries.size(); ++t) {
    for (size_t h = 0; h < hp.heads; ++h) {
      for (size_t d = 0; d < hp.rope_dims; ++d) {
        query_rotated[t][h * hp.rope_dims + d] = queries[t][h * query_dim + hp.nope_dim + d];
      }
    }
  }
  apply_rope(query_rotated, hp.heads, rope, std::nullopt);
  // A head's key part without RoPE, element c: the latent times row c of its decompression.
  // Newer files hold those rows transposed, per head (attn_k_b: the latent's rank rows of
  // nope_dim), and the values' per head (attn_v_b); older ones both in one attn_kv_b, per head
  // nope_dim key rows then value_dim value rows.
  const bool split = model.find_tensor(block + "attn_k_b.weight") != nullptr;
  Matrix keys(queries.size(), Vector(hp.heads * query_dim));
  Matrix values(queries.size(), Vector(hp.heads * hp.value_dim));
  if (split) {
    const std::vector<Weight> k_b = require_experts(model, block + "attn_k_b.weight", hp.nope_dim, hp.kv_rank, hp.heads);
    const std::vector<Weight> v_b =
        require_experts(model, block + "attn_v_b.weight", hp.kv_rank, hp.value_dim, hp.heads);
    for (size_t h = 0; h < hp.heads; ++h) {
      for (size_t r = 0; r < hp.kv_rank; ++r) {
        const Vector row = k_b[h].row(r);
        for (size_t t = 0; t < queries.size(); ++t) {
          for (size_t c = 0; c < hp.nope_dim; ++c) keys[t][h * query_dim + c] += row[c] * latent[t][r];
        }
      }
      const Matrix head_values = project(v_b[h], latent, std::nullopt);
      for (size_t t = 0; t < queries.size(); ++t) {
        std::copy(head_values[t].begin(), head_values[t].end(), values[t].begin() + h * hp.value_dim);
      }
    }
  } else {
    const size_t per_head = hp.nope_dim + hp.value_dim;
    const Matrix decompressed = project(
        require(model, block + "attn_kv_b.weight", {hp.kv_rank, hp.heads * per_head}), latent, std::nullopt);
    for (size_t t = 0; t < queries.size(); ++t) {
      for (size_t h = 0; h < hp.heads; ++h) {
        for (size_t c = 0; c < hp.nope_dim; ++c) keys[t][h * query_dim + c] = decompressed[t][h * per_head + c];
        for (size_t d = 0; d < hp.value_dim; ++d) {
          values[t][h * hp.value_dim + d] = decompressed[t][h * per_head + hp.nope_dim + d];
        }
      }
    }
  }
  for (size_t t = 0; t < queries.size(); ++t) {
    for (size_t h = 0; h < hp.heads; ++h) {
      for (size_t d = 0; d < hp.rope_dims; ++d) {
        queries[t][h * query_dim + hp.nope_dim + d] = query_rotated[t][h * hp.rope_dims + d];
        keys[t][h * query_dim + hp.nope_dim + d] = shared_rotated[t][d];
      }
    }
  }
  const Heads shape{hp.heads, hp.heads, query_dim, hp.value_dim,
                    hp.attention_factor / std::sqrt(static_cast<double>(query_dim))};
  return project(require(model, block + "attn_output.weight", {hp.heads * hp.value_dim, hp.embedding}),
                 attend(queries, keys, values, shape, 0, std::nullopt), std::nullopt);
}

// Grouped-query attention (every architecture but deepseek2), its output projected.
Matrix grouped_attention(const gguf::File& model, const std::string& block, const Hyperparameters& hp, size_t layer,
                         const Matrix& attention_input, const std::optional<Vector>& frequency_factors) {
  const auto norm = [&](const char* name, size_t size) { return required_vector(model, block + name, size); };
  const auto bias = [&](const char* name, uint64_t size) { return optional_vector(model, block + name, size); };
  const uint64_t q_size = hp.heads * hp.head_dim;
  const uint64_t kv_size = hp.kv_heads * hp.head_dim;
  Matrix queries, keys, values;
  if (model.find_tensor(block + "attn_qkv.weight")) {  // phi3: one projection, then its parts
    const Matrix qkv = project(require(model, block + "attn_qkv.weight", {hp.embedding, q_size + 2 * kv_size}),
                               attention_input, bias("attn_qkv.bias", q_size + 2 * kv_size));
    queries = columns(qkv, 0, q_size);
    keys = columns(qkv, q_size, kv_size);
    values = columns(qkv, q_size + kv_size, kv_size);
  } else {
    queries = project(require(model, block + "attn_q.weight", {hp.embedding, q_size}), attention_input,
                      bias("attn_q.bias", q_size));
    keys = project(require(model, block + "attn_k.weight", {hp.embedding, kv_size}), attention_input,
                   bias("attn_k.bias", kv_size));
    values = project(require(model, block + "attn_v.weight", {hp.embedding, kv_size}), attention_input,
                     bias("attn_v.bias", kv_size));
  }
  if (hp.qk_norm) {
    rms_norm_heads(queries, hp.heads, hp.head_dim, norm("attn_q_norm.weight", hp.head_dim), hp.rms_epsilon);
    rms_norm_heads(keys, hp.kv_heads, hp.head_dim, norm("attn_k_norm.weight", hp.head_dim), hp.rms_epsilon);
  }
  const bool local = (hp.gpt_oss && layer % 2 == 0) || (hp.gemma && (layer + 1) % 6 != 0);
  Hyperparameters rope = hp;
  if (hp.gemma && local) {
    rope.rope_base = 10000.0;
    rope.rope_position_scale = 1.0;
  }
  apply_rope(queries, hp.heads, rope, frequency_factors);
  apply_rope(keys, hp.kv_heads, rope, frequency_factors);
  // Gemma 3's 27B scales queries by width / heads, every other model by its head size.
  const double query_scalar = hp.gemma && hp.layers == 62 ? static_cast<double>(hp.embedding / hp.heads)
                                                           : static_cast<double>(hp.head_dim);
  const Heads shape{hp.heads, hp.kv_heads, hp.head_dim, hp.head_dim, 1.0 / std::sqrt(query_scalar)};
  Matrix attention = project(require(model, block + "attn_output.weight", {q_size, hp.embedding}),
                             attend(queries, keys, values, shape, local ? hp.sliding_window : 0,
                                    bias("attn_sinks.weight", hp.heads)),
                             bias("attn_output.bias", hp.embedding));
  if (hp.gemma) attention = rms_norm(attention, norm("post_attention_norm.weight", hp.embedding), hp.rms_epsilon);
  return attention;
}

}  // namespace

std::vector<std::vector<double>> forward_all(const gguf::File& model, std::span<const int32_t> tokens,
                                             ExpertChoices* expert_choices) {
  const Hyperparameters hp = read_hyperparameters(model);
  const gguf::TensorInfo* embedding_info = model.find_tensor("token_embd.weight");
  if (!embedding_info || embedding_info->dims.size() != 2 || embedding_info->dims[0] != hp.embedding) {
    throw gguf::Error("reference: missing or misshapen token_embd.weight");
  }
  const Weight embeddings(model, *embedding_info);
  const uint64_t vocab = embedding_info->dims[1];
  if (tokens.size() > hp.context) throw std::invalid_argument("reference: tokens exceed the context");

  Matrix x;
  for (int32_t token : tokens) {
    if (token < 0 || static_cast<uint64_t>(token) >= vocab) {
      throw std::invalid_argument("reference: token " + std::to_string(token) + " outside the vocabulary");
    }
    x.push_back(embeddings.row(static_cast<size_t>(token)));
    if (hp.gemma) {
      for (double& v : x.back()) v *= std::sqrt(static_cast<double>(hp.embedding));
    }
  }

  const std::optional<Vector> frequency_factors = optional_vector(model, hp.rope_factors, hp.rope_dims / 2);
  for (size_t layer = 0; layer < hp.layers; ++layer) {
    const std::string block = "blk." + std::to_string(layer) + ".";
    const auto norm = [&](const char* name, size_t size) { return required_vector(model, block + name, size); };

    const Matrix attention_input = rms_norm(x, norm("attn_norm.weight", hp.embedding), hp.rms_epsilon);
    if (hp.latent_attention) {
      add_in_place(x, latent_attention(model, block, hp, attention_input));
    } else {
      add_in_place(x, grouped_attention(model, block, hp, layer, attention_input, frequency_factors));
    }

    const Matrix ffn_input = rms_norm(x, norm((hp.ffn_norm + ".weight").c_str(), hp.embedding), hp.rms_epsilon);
    if (hp.expert_count > 0 && layer >= hp.leading_dense) {
      std::vector<ExpertChoice> layer_choices;
      add_in_place(x, mixture_of_experts(model, block, hp, ffn_input, layer_choices));
      if (expert_choices) expert_choices->push_back(std::move(layer_choices));
    } else if (hp.fused_gate_up) {
      const size_t ff = hp.feed_forward;
      const Matrix gate_up = project(require(model, block + "ffn_up.weight", {hp.embedding, 2 * ff}), ffn_input,
                                     std::nullopt);
      add_in_place(x, gated_down(columns(gate_up, 0, ff), columns(gate_up, ff, ff),
                                 require(model, block + "ffn_down.weight", {ff, hp.embedding}), Gating::Silu));
    } else {
      Matrix ffn = gated_ffn(require(model, block + "ffn_gate.weight", {hp.embedding, hp.feed_forward}),
                             require(model, block + "ffn_up.weight", {hp.embedding, hp.feed_forward}),
                             require(model, block + "ffn_down.weight", {hp.feed_forward, hp.embedding}), ffn_input,
                             hp.gemma ? Gating::Gelu : Gating::Silu);
      if (hp.gemma) ffn = rms_norm(ffn, norm("post_ffw_norm.weight", hp.embedding), hp.rms_epsilon);
      add_in_place(x, ffn);
    }
  }

  const std::optional<Vector> output_norm = optional_vector(model, "output_norm.weight", hp.embedding);
  if (!output_norm) throw gguf::Error("reference: missing tensor output_norm.weight");
  const gguf::TensorInfo* output = find_with_shape(model, "output.weight", {hp.embedding, vocab});
  // Without its own output matrix the model reuses the token embeddings.
  const Weight output_weight = output ? Weight(model, *output) : embeddings;
  return project(output_weight, rms_norm(x, *output_norm, hp.rms_epsilon), std::nullopt);
}

}  // namespace strata::reference
