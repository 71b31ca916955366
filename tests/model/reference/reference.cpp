#include "reference/reference.h"

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
  bool neox_rope = false;  // qwen2 rotates (x[i], x[i + n/2]); llama (x[2i], x[2i+1])
  size_t embedding = 0;
  size_t layers = 0;
  size_t feed_forward = 0;
  size_t heads = 0;
  size_t kv_heads = 0;
  size_t head_dim = 0;
  size_t context = 0;
  double rms_epsilon = 0.0;
  size_t rope_dims = 0;
  double rope_base = 10000.0;
  double rope_position_scale = 1.0;  // 1 / linear scaling factor
};

size_t required_uint(const gguf::File& model, const std::string& key) {
  const std::optional<uint64_t> value = model.get_uint(key);
  if (!value || *value == 0) throw gguf::Error("reference: missing or zero " + key);
  return static_cast<size_t>(*value);
}

Hyperparameters read_hyperparameters(const gguf::File& model) {
  const std::optional<std::string> arch = model.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen2") {
    throw gguf::Error("reference: unsupported architecture " + arch.value_or("(none)"));
  }
  const std::string prefix = *arch + ".";
  Hyperparameters hp;
  hp.neox_rope = *arch == "qwen2";
  hp.embedding = required_uint(model, prefix + "embedding_length");
  hp.layers = required_uint(model, prefix + "block_count");
  hp.feed_forward = required_uint(model, prefix + "feed_forward_length");
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
  } else if (scaling != "none") {
    throw gguf::Error("reference: unsupported RoPE scaling " + scaling);
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

// A weight matrix of `rows` rows of `cols` values (GGUF dims {cols, rows}), decoded row by row.
class Weight {
 public:
  Weight(const gguf::File& model, const gguf::TensorInfo& info) : model_(model), info_(info) {
    const auto type = static_cast<tensor::DType>(info.type);
    if (!tensor::info(type).computable) {
      throw gguf::Error("reference: tensor " + info.name + " has unsupported type " +
                        std::string(tensor::dtype_name(type)));
    }
    const std::optional<uint64_t> bytes = tensor::row_bytes(type, info.dims[0]);
    if (!bytes) throw gguf::Error("reference: rows of " + info.name + " are not whole blocks");
    row_bytes_ = static_cast<size_t>(*bytes);
  }
  size_t cols() const { return static_cast<size_t>(info_.dims[0]); }
  size_t rows() const { return info_.dims.size() > 1 ? static_cast<size_t>(info_.dims[1]) : 1; }

  // Plain float types are decoded here; block-quantized rows go through the engine's
  // dequantizer, which has its own tests against hand-built blocks.
  Vector row(size_t index) const {
    const uint8_t* data = model_.tensor_data(info_) + index * row_bytes_;
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

std::optional<Vector> optional_vector(const gguf::File& model, const std::string& name, size_t n) {
  const gguf::TensorInfo* info = find_with_shape(model, name, {n});
  if (!info) return std::nullopt;
  return Weight(model, *info).row(0);
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

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// Rotates each head of every position by its position's angles.
void apply_rope(Matrix& projections, size_t head_count, const Hyperparameters& hp,
                const std::optional<Vector>& frequency_factors) {
  const size_t half = hp.rope_dims / 2;
  for (size_t position = 0; position < projections.size(); ++position) {
    for (size_t head = 0; head < head_count; ++head) {
      double* x = projections[position].data() + head * hp.head_dim;
      for (size_t i = 0; i < half; ++i) {
        const double inverse_frequency =
            std::pow(hp.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(hp.rope_dims));
        const double angle = static_cast<double>(position) * hp.rope_position_scale *
                             inverse_frequency / (frequency_factors ? (*frequency_factors)[i] : 1.0);
        const size_t first = hp.neox_rope ? i : 2 * i;
        const size_t second = hp.neox_rope ? i + half : 2 * i + 1;
        const double a = x[first];
        const double b = x[second];
        x[first] = a * std::cos(angle) - b * std::sin(angle);
        x[second] = a * std::sin(angle) + b * std::cos(angle);
      }
    }
  }
}

// Causal multi-head attention with grouped key/value heads.
Matrix attend(const Matrix& queries, const Matrix& keys, const Matrix& values,
              const Hyperparameters& hp) {
  const size_t group = hp.heads / hp.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hp.head_dim));
  Matrix outputs(queries.size(), Vector(hp.heads * hp.head_dim, 0.0));
  for (size_t t = 0; t < queries.size(); ++t) {
    for (size_t head = 0; head < hp.heads; ++head) {
      const size_t q_offset = head * hp.head_dim;
      const size_t kv_offset = (head / group) * hp.head_dim;
      Vector scores(t + 1);
      for (size_t j = 0; j <= t; ++j) {
        double score = 0.0;
        for (size_t d = 0; d < hp.head_dim; ++d) {
          score += queries[t][q_offset + d] * keys[j][kv_offset + d];
        }
        scores[j] = score * scale;
      }
      double max_score = -INFINITY;
      for (double s : scores) max_score = std::max(max_score, s);
      double total = 0.0;
      for (double& s : scores) total += (s = std::exp(s - max_score));
      for (size_t j = 0; j <= t; ++j) {
        for (size_t d = 0; d < hp.head_dim; ++d) {
          outputs[t][q_offset + d] += scores[j] / total * values[j][kv_offset + d];
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

}  // namespace

std::vector<std::vector<double>> forward_all(const gguf::File& model,
                                             std::span<const int32_t> tokens) {
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
  }

  const uint64_t q_size = hp.heads * hp.head_dim;
  const uint64_t kv_size = hp.kv_heads * hp.head_dim;
  // Llama 3 stores its long-context RoPE correction as per-frequency divisors.
  const std::optional<Vector> frequency_factors =
      optional_vector(model, "rope_freqs.weight", hp.rope_dims / 2);
  for (size_t layer = 0; layer < hp.layers; ++layer) {
    const std::string block = "blk." + std::to_string(layer) + ".";
    const auto norm = [&](const char* name) {
      const std::optional<Vector> weight = optional_vector(model, block + name, hp.embedding);
      if (!weight) throw gguf::Error("reference: missing tensor " + block + name);
      return *weight;
    };
    const auto bias = [&](const char* name, uint64_t size) {
      return optional_vector(model, block + name, size);
    };

    const Matrix attention_input = rms_norm(x, norm("attn_norm.weight"), hp.rms_epsilon);
    Matrix queries = project(require(model, block + "attn_q.weight", {hp.embedding, q_size}),
                             attention_input, bias("attn_q.bias", q_size));
    Matrix keys = project(require(model, block + "attn_k.weight", {hp.embedding, kv_size}),
                          attention_input, bias("attn_k.bias", kv_size));
    const Matrix values = project(require(model, block + "attn_v.weight", {hp.embedding, kv_size}),
                                  attention_input, bias("attn_v.bias", kv_size));
    apply_rope(queries, hp.heads, hp, frequency_factors);
    apply_rope(keys, hp.kv_heads, hp, frequency_factors);
    add_in_place(x, project(require(model, block + "attn_output.weight", {q_size, hp.embedding}),
                            attend(queries, keys, values, hp), bias("attn_output.bias", hp.embedding)));

    const Matrix ffn_input = rms_norm(x, norm("ffn_norm.weight"), hp.rms_epsilon);
    const Matrix gate = project(require(model, block + "ffn_gate.weight", {hp.embedding, hp.feed_forward}),
                                ffn_input, std::nullopt);
    Matrix hidden = project(require(model, block + "ffn_up.weight", {hp.embedding, hp.feed_forward}),
                            ffn_input, std::nullopt);
    for (size_t t = 0; t < hidden.size(); ++t) {
      for (size_t i = 0; i < hp.feed_forward; ++i) hidden[t][i] *= silu(gate[t][i]);
    }
    add_in_place(x, project(require(model, block + "ffn_down.weight", {hp.feed_forward, hp.embedding}),
                            hidden, std::nullopt));
  }

  const std::optional<Vector> output_norm = optional_vector(model, "output_norm.weight", hp.embedding);
  if (!output_norm) throw gguf::Error("reference: missing tensor output_norm.weight");
  const gguf::TensorInfo* output = find_with_shape(model, "output.weight", {hp.embedding, vocab});
  // Without its own output matrix the model reuses the token embeddings.
  const Weight output_weight = output ? Weight(model, *output) : embeddings;
  return project(output_weight, rms_norm(x, *output_norm, hp.rms_epsilon), std::nullopt);
}

}  // namespace strata::reference
