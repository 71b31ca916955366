#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numbers>
#include <stdexcept>
#include <string>
#include <thread>

#include "model/routing.h"
#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/quant.h"
#include "tensor/vector_ops.h"

namespace strata::model {
namespace {

std::string shape_text(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

uint64_t matrix_bytes(const tensor::Matrix& m) {
  return *tensor::row_bytes(m.type, static_cast<uint64_t>(m.cols)) * static_cast<uint64_t>(m.rows);
}

std::string computable_type_names() {
  std::string names;
  for (uint32_t id = 0; id < 64; ++id) {
    const auto info = tensor::dtype_info(id);
    if (info && info->computable) names += (names.empty() ? "" : ", ") + std::string(info->name);
  }
  return names;
}

class TensorBinder {
 public:
  explicit TensorBinder(const gguf::File& file) : file_(file) {}

  const gguf::TensorInfo* find(const std::string& name) const { return file_.find_tensor(name); }

  // A weight matrix of `rows` outputs by `cols` inputs (GGUF dims {cols, rows}).
  tensor::Matrix matrix(const std::string& name, int64_t cols, int64_t rows) const {
    const gguf::TensorInfo& t = computable(name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)});
    return {static_cast<tensor::DType>(t.type), rows, cols, file_.tensor_data(t)};
  }

  // A weight matrix in its kernels' layout.
  tensor::PreparedMatrix prepared(const std::string& name, int64_t cols, int64_t rows) const {
    return prepare(matrix(name, cols, rows));
  }

  // The `count` matrices of a 3-D tensor of experts (GGUF dims {cols, rows, count}), each
  // `rows` outputs by `cols` inputs, in their kernels' layout. Of each, rows `share`.
  std::vector<tensor::PreparedMatrix> experts(const std::string& name, int64_t cols, int64_t rows, int count,
                                              RowRange share) const {
    std::vector<tensor::Matrix> sources = expert_matrices(name, cols, rows, count);
    for (tensor::Matrix& expert : sources) expert = rows_of(expert, 0, share);
    std::vector<tensor::PreparedMatrix> matrices = tensor::PreparedMatrix::together(sources);
    for (const tensor::PreparedMatrix& m : matrices) release_if_copied(m);
    return matrices;
  }

  // Rows `share` of a weight matrix of `rows` outputs by `cols` inputs, in their kernels' layout.
  tensor::PreparedMatrix prepared(const std::string& name, int64_t cols, int64_t rows, RowRange share) const {
    return prepare(rows_of(matrix(name, cols, rows), 0, share));
  }

  // Columns `part` of a weight matrix of `rows` outputs by `cols` inputs, in their kernels'
  // layout (a matrix of their own unless they are all of them).
  tensor::PreparedMatrix columns(const std::string& name, int64_t cols, int64_t rows, RowRange part) const {
    const tensor::Matrix whole = matrix(name, cols, rows);
    if (part.first == 0 && part.last == cols) return prepare(whole);
    return std::move(leaf_columns({&whole, 1}, {&part, 1}).front());
  }

  // Of the experts of a 3-D tensor (as `experts`), columns `leaves`, each a matrix of its own:
  // expert e's leaf l at [e * leaves.size() + l].
  std::vector<tensor::PreparedMatrix> expert_leaves(const std::string& name, int64_t cols, int64_t rows, int count,
                                                    std::span<const RowRange> leaves) const {
    return leaf_columns(expert_matrices(name, cols, rows, count), leaves);
  }

  // Of a weight matrix, columns `leaves`, each a matrix of its own.
  std::vector<tensor::PreparedMatrix> leaves(const std::string& name, int64_t cols, int64_t rows,
                                             std::span<const RowRange> leaves) const {
    const tensor::Matrix whole = matrix(name, cols, rows);
    return leaf_columns({&whole, 1}, leaves);
  }

  // Rows first + share of `whole`, a matrix of its own: a fused attn_qkv or gate-and-up is used
  // by the kernels of its parts, as the rows of a GGUF matrix lie one after another.
  static tensor::Matrix rows_of(const tensor::Matrix& whole, int64_t first, RowRange share) {
    const uint64_t row_bytes = *tensor::row_bytes(whole.type, static_cast<uint64_t>(whole.cols));
    return {whole.type, share.size(), whole.cols,
            static_cast<const uint8_t*>(whole.data) + row_bytes * static_cast<uint64_t>(first + share.first)};
  }

  // `source` in its kernels' layout. When that is a copy, the file's pages of it are let go, so
  // that the weights are not held twice.
  tensor::PreparedMatrix prepare(const tensor::Matrix& source) const {
    tensor::PreparedMatrix prepared(source);
    release_if_copied(prepared);
    return prepared;
  }

  // Of each of `wholes`, columns `leaves`, each a matrix of its own (whole after whole, and
  // in memory so); the wholes' pages of the file are then let go.
  std::vector<tensor::PreparedMatrix> leaf_columns(std::span<const tensor::Matrix> wholes,
                                                   std::span<const RowRange> leaves) const {
    std::vector<tensor::PreparedMatrix::ColumnRange> ranges;
    for (const RowRange& leaf : leaves) ranges.push_back({leaf.first, leaf.size()});
    std::vector<tensor::PreparedMatrix> matrices = tensor::PreparedMatrix::columns(wholes, ranges);
    for (const tensor::Matrix& whole : wholes) {
      file_.release_pages(static_cast<const uint8_t*>(whole.data), matrix_bytes(whole));
    }
    return matrices;
  }

  void release_if_copied(const tensor::PreparedMatrix& prepared) const {
    if (prepared.interleaved() != nullptr) {
      file_.release_pages(static_cast<const uint8_t*>(prepared.source().data), matrix_bytes(prepared.source()));
    }
  }

  // A small F32 vector (norm weights, biases, rope factors).
  const float* vector(const std::string& name, int64_t length) const {
    return floats(name, {static_cast<uint64_t>(length)});
  }
  // `count` F32 vectors of `length` (GGUF dims {length, count}): one bias per expert.
  const float* vectors(const std::string& name, int64_t length, int count) const {
    return floats(name, {static_cast<uint64_t>(length), static_cast<uint64_t>(count)});
  }

 private:
  // Each expert's whole matrix in the file.
  std::vector<tensor::Matrix> expert_matrices(const std::string& name, int64_t cols, int64_t rows, int count) const {
    const gguf::TensorInfo& t =
        computable(name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), static_cast<uint64_t>(count)});
    const auto type = static_cast<tensor::DType>(t.type);
    const uint64_t expert_bytes = *tensor::row_bytes(type, static_cast<uint64_t>(cols)) * static_cast<uint64_t>(rows);
    std::vector<tensor::Matrix> matrices;
    for (int e = 0; e < count; ++e) {
      matrices.push_back({type, rows, cols, file_.tensor_data(t) + expert_bytes * static_cast<uint64_t>(e)});
    }
    return matrices;
  }

  const float* floats(const std::string& name, const std::vector<uint64_t>& dims) const {
    const gguf::TensorInfo& t = require(name, dims);
    if (t.type != static_cast<uint32_t>(tensor::DType::F32)) {
      throw std::runtime_error("tensor '" + name + "' must be F32");
    }
    return reinterpret_cast<const float*>(file_.tensor_data(t));
  }

  const gguf::TensorInfo& computable(const std::string& name, const std::vector<uint64_t>& dims) const {
    const gguf::TensorInfo* found = file_.find_tensor(name);
    if (found == nullptr) throw std::runtime_error("model lacks tensor '" + name + "'");
    const auto info = tensor::dtype_info(found->type);
    if (!info || !info->computable) {
      throw std::runtime_error("tensor '" + name + "' has type " +
                               (info ? std::string(info->name) : std::to_string(found->type)) +
                               ", which Strata cannot compute (supported: " + computable_type_names() + ")");
    }
    return require(name, dims);
  }

  const gguf::TensorInfo& require(const std::string& name, const std::vector<uint64_t>& dims) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (t == nullptr) throw std::runtime_error("model lacks tensor '" + name + "'");
    if (t->dims != dims) {
      throw std::runtime_error("tensor '" + name + "' has shape " + shape_text(t->dims) +
                               ", expected " + shape_text(dims));
    }
    return *t;
  }

  const gguf::File& file_;
};

// Latent attention's matrices (Layer). Files converted before llama.cpp split attn_kv_b hold,
// per head, the rows that give the key's part without RoPE from the latent, then those that
// give the value: k_b is the former transposed, v_b the latter, both as floats.
template <typename Layer>
void bind_latent_attention(const TensorBinder& bind, const std::string& p, const Config& c, Layer& l) {
  const LatentAttention& mla = c.mla;
  const int heads = c.head_count;
  const int query_dim = mla.nope_dim + c.rope_dim;
  if (mla.q_rank > 0) {
    l.q_a = bind.prepared(p + "attn_q_a.weight", c.embedding_dim, mla.q_rank);
    l.q_a_norm = bind.vector(p + "attn_q_a_norm.weight", mla.q_rank);
    l.q_b = bind.prepared(p + "attn_q_b.weight", mla.q_rank, heads * query_dim);
  } else {
    l.q = bind.prepared(p + "attn_q.weight", c.embedding_dim, heads * query_dim);
  }
  l.kv_a = bind.prepared(p + "attn_kv_a_mqa.weight", c.embedding_dim, mla.kv_rank + c.rope_dim);
  l.kv_a_norm = bind.vector(p + "attn_kv_a_norm.weight", mla.kv_rank);
  if (bind.find(p + "attn_k_b.weight") != nullptr) {
    l.k_b = bind.experts(p + "attn_k_b.weight", mla.nope_dim, mla.kv_rank, heads, {0, mla.kv_rank});
    l.v_b = bind.experts(p + "attn_v_b.weight", mla.kv_rank, mla.value_dim, heads, {0, mla.value_dim});
    return;
  }
  const size_t per_head = static_cast<size_t>(mla.nope_dim + mla.value_dim);
  const size_t latent = static_cast<size_t>(mla.kv_rank);
  const tensor::Matrix kv_b = bind.matrix(p + "attn_kv_b.weight", mla.kv_rank, heads * static_cast<int64_t>(per_head));
  const uint64_t row_bytes = *tensor::row_bytes(kv_b.type, latent);
  const size_t k_b_elements = static_cast<size_t>(mla.nope_dim) * latent;
  const size_t head_elements = per_head * latent;
  l.split_kv_b.resize(static_cast<size_t>(heads) * head_elements);
  std::vector<float> row(latent);
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h) {
    float* k_b = l.split_kv_b.data() + h * head_elements;
    float* v_b = k_b + k_b_elements;
    for (size_t i = 0; i < per_head; ++i) {
      const auto* source = static_cast<const uint8_t*>(kv_b.data) + row_bytes * (h * per_head + i);
      tensor::dequantize_row(kv_b.type, source, row.data(), mla.kv_rank);
      if (i < static_cast<size_t>(mla.nope_dim)) {
        for (size_t j = 0; j < latent; ++j) k_b[j * mla.nope_dim + i] = row[j];
      } else {
        std::copy(row.begin(), row.end(), v_b + (i - mla.nope_dim) * latent);
      }
    }
  }
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h) {
    const float* k_b = l.split_kv_b.data() + h * head_elements;
    l.k_b.emplace_back(tensor::Matrix{tensor::DType::F32, mla.kv_rank, mla.nope_dim, k_b});
    l.v_b.emplace_back(tensor::Matrix{tensor::DType::F32, mla.value_dim, mla.kv_rank, k_b + k_b_elements});
  }
}

void rms_norm(const float* x, const float* weight, int dim, float epsilon, float* out) {
  double sum_squares = 0.0;
  for (int i = 0; i < dim; ++i) sum_squares += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum_squares / dim + epsilon));
  for (int i = 0; i < dim; ++i) out[i] = x[i] * scale * weight[i];
}

void rms_norm_rows(const float* x, const float* weight, int rows, int dim, float epsilon, float* out,
                   tensor::ThreadPool& pool) {
  tensor::for_rows(rows, pool, [&](int64_t begin, int64_t end) {
    for (auto r = static_cast<size_t>(begin); r < static_cast<size_t>(end); ++r) {
      rms_norm(x + r * static_cast<size_t>(dim), weight, dim, epsilon, out + r * static_cast<size_t>(dim));
    }
  });
}

void add_bias(float* rows, const float* bias, int row_count, int dim) {
  if (bias == nullptr) return;
  for (int r = 0; r < row_count; ++r) {
    for (int i = 0; i < dim; ++i) rows[static_cast<size_t>(r) * dim + i] += bias[i];
  }
}

}  // namespace

Model::Rope Model::rope_table(const Config& c, float base, const float* freq_factors, bool scaled) {
  Rope rope;
  const Yarn yarn = scaled ? c.yarn : Yarn{};
  const float linear_scale = scaled ? c.rope_linear_scale : 1.0f;
  const int pairs = c.rope_dim / 2;
  // YaRN's ramp runs between the pairs that turn beta_fast and beta_slow times within the
  // original context, rounded outwards as llama.cpp rounds them.
  double low = 0.0, high = 0.0;
  if (yarn.factor > 0.0f) {
    const auto pair_of = [&](double turns) {
      return c.rope_dim * std::log(yarn.original_context / (turns * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
    };
    low = std::max(0.0, std::floor(pair_of(yarn.beta_fast)));
    high = std::min(c.rope_dim - 1.0, std::ceil(pair_of(yarn.beta_slow)));
    // DeepSeek's YaRN puts its magnitude into the attention scale instead (Config).
    if (yarn.log_multiplier == 0.0f) {
      rope.magnitude = static_cast<float>(1.0 + 0.1 * std::log(static_cast<double>(yarn.factor)));
    }
  }
  rope.magnitude *= c.rope_attention_factor;
  rope.inverse_freq.resize(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) {
    double inv = std::pow(static_cast<double>(base), -2.0 * i / c.rope_dim);
    if (freq_factors != nullptr) inv /= freq_factors[i];
    inv /= linear_scale;
    if (yarn.factor > 0.0f) {
      // 1 keeps the original frequency (fast pairs), 0 takes the interpolated one.
      const double extrapolation = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
      inv *= extrapolation + (1.0 - extrapolation) / yarn.factor;
    }
    rope.inverse_freq[static_cast<size_t>(i)] = static_cast<float>(inv);
  }
  return rope;
}

namespace {

void add_in_place(std::vector<float>& x, const std::vector<float>& delta, size_t count) {
  for (size_t i = 0; i < count; ++i) x[i] += delta[i];
}

// Refuses shares that do not cover each dimension, in member order, with a part for every
// member, shares of o's and the downs' inputs that are not whole leaves, and models whose layers a
// share cannot hold.
void check_shares(const Config& c, std::span<const TensorShare> shares) {
  if (c.has_latent_attention()) {
    throw std::runtime_error("tensor parallelism cannot split " + c.arch_name +
                             "'s latent attention, whose heads all read one latent KV head");
  }
  // A dimension of no rows (the experts' in a dense model) has an empty part in every share.
  const auto check = [&](RowRange TensorShare::*dimension, int rows, const char* what, int leaf = 1) {
    int next = 0;
    bool in_order = true;
    for (const TensorShare& share : shares) {
      const RowRange part = share.*dimension;
      in_order = in_order && part.first == next && (part.last > part.first || rows == 0);
      next = part.last;
    }
    if (!in_order || next != rows) {
      throw std::runtime_error(std::string("the group's shares do not cover the ") + what + " in member order");
    }
    for (const TensorShare& share : shares) {
      if ((share.*dimension).first % leaf != 0) {
        throw std::runtime_error(std::string("the group's shares of the ") + what + " are not whole leaves of " +
                                 std::to_string(leaf));
      }
    }
  };
  const ProjectionLeaves leaves = projection_leaves(c);
  check(&TensorShare::kv_heads, c.kv_head_count, "KV heads", leaves.kv_heads);
  check(&TensorShare::ffn_rows, c.dense_ffn_dim(), "FFN rows", leaves.ffn_rows);
  check(&TensorShare::vocab_rows, c.vocab_size, "vocabulary rows");
  check(&TensorShare::expert_rows, c.has_experts() ? c.expert_ffn_dim : 0, "expert rows", leaves.expert_rows);
  check(&TensorShare::shared_expert_rows, c.has_experts() ? c.shared_expert_ffn_dim : 0, "shared expert rows",
        leaves.shared_expert_rows);
}

}  // namespace

std::unique_ptr<Model> Model::load(std::shared_ptr<const gguf::File> file) {
  const Config config = Config::from_gguf(*file);
  return load(std::move(file), LayerRange{0, config.layer_count});
}

std::unique_ptr<Model> Model::load(std::shared_ptr<const gguf::File> file, LayerRange range,
                                   const std::function<void(double)>& progress, const Model* reuse) {
  return bind_weights(std::move(file), range, progress, reuse, {}, nullptr);
}

std::unique_ptr<Model> Model::load_share(std::shared_ptr<const gguf::File> file, LayerRange range,
                                         std::span<const TensorShare> shares, Exchange& exchange) {
  if (shares.size() != static_cast<size_t>(exchange.size())) {
    throw std::runtime_error(std::to_string(shares.size()) + " shares for a group of " +
                             std::to_string(exchange.size()) + " members");
  }
  return bind_weights(std::move(file), range, {}, nullptr, shares, &exchange);
}

std::unique_ptr<Model> Model::bind_weights(std::shared_ptr<const gguf::File> file, LayerRange range,
                                           const std::function<void(double)>& progress, const Model* reuse,
                                           std::span<const TensorShare> shares, Exchange* exchange) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = Config::from_gguf(*file);
  const Config& c = m->config_;
  if (range.first < 0 || range.first >= range.last || range.last > c.layer_count) {
    throw std::runtime_error("layer range [" + std::to_string(range.first) + ", " +
                             std::to_string(range.last) + ") is not within the model's " +
                             std::to_string(c.layer_count) + " layers");
  }
  m->range_ = range;
  if (exchange != nullptr) check_shares(c, shares);
  const TensorShare whole{
      {0, c.kv_head_count}, {0, c.ffn_dim}, {0, c.vocab_size}, {0, c.expert_ffn_dim}, {0, c.shared_expert_ffn_dim}};
  if (shares.empty()) shares = {&whole, 1};
  const TensorShare& share = shares[static_cast<size_t>(exchange != nullptr ? exchange->member() : 0)];
  // A query head reads KV head (its index / group): a share's KV heads come with their groups.
  const int group = c.head_count / c.kv_head_count;
  const RowRange q_rows{share.kv_heads.first * group * c.head_dim, share.kv_heads.last * group * c.head_dim};
  const RowRange kv_rows{share.kv_heads.first * c.head_dim, share.kv_heads.last * c.head_dim};
  m->exchange_ = exchange;
  m->vocab_share_ = share.vocab_rows;
  m->share_config_ = c;
  m->share_config_.head_count = share.kv_heads.size() * group;
  m->share_config_.kv_head_count = share.kv_heads.size();
  m->share_config_.ffn_dim = share.ffn_rows.size();
  m->share_config_.expert_ffn_dim = share.expert_rows.size();
  m->share_config_.shared_expert_ffn_dim = share.shared_expert_rows.size();
  // The heads' values: with latent attention each head's after attn_v_b.
  const int head_values = c.has_latent_attention() ? c.head_count * c.mla.value_dim : c.q_dim();
  const ProjectionLeaves leaves = projection_leaves(c);
  m->o_sums_.count = leaves.o_count(c);
  m->o_sums_.cols = m->o_sums_.count == 1 ? head_values : leaves.kv_heads * group * c.head_dim;
  m->down_sums_.count = leaves.down_count(c);
  m->down_sums_.cols = leaves.ffn_rows;
  m->expert_sums_.count = leaves.expert_count(c);
  m->expert_sums_.cols = leaves.expert_rows;
  m->shared_sums_.count = leaves.shared_expert_count(c);
  m->shared_sums_.cols = leaves.shared_expert_rows;
  const auto leaves_of = [](RowRange part, int unit) { return RowRange{part.first / unit, (part.last + unit - 1) / unit}; };
  const int dim = c.embedding_dim;
  const auto columns_of = [](const LeafSums& sums, int cols) {
    return RowRange{sums.mine.first * sums.cols, std::min(cols, sums.mine.last * sums.cols)};
  };
  for (const TensorShare& member : shares) {
    for (auto [sums, part] : {std::pair{&m->o_sums_, leaves_of(member.kv_heads, leaves.kv_heads)},
                              std::pair{&m->down_sums_, leaves_of(member.ffn_rows, leaves.ffn_rows)},
                              std::pair{&m->expert_sums_, leaves_of(member.expert_rows, leaves.expert_rows)},
                              std::pair{&m->shared_sums_,
                                        leaves_of(member.shared_expert_rows, leaves.shared_expert_rows)}}) {
      const std::vector<LeafNode> cover =
          sums->count > 0 ? leaf_cover(sums->count, part.first, part.last) : std::vector<LeafNode>{};
      if (&member == &share) {
        sums->mine = part;
        sums->own = cover;
        if (sums == &m->o_sums_ || sums == &m->down_sums_) {
          sums->steps = leaf_steps(sums->count, part.first, part.last);
        }
      }
      sums->all.insert(sums->all.end(), cover.begin(), cover.end());
      sums->widths.push_back(static_cast<int>(cover.size()) * dim);
    }
    m->vocab_widths_.push_back(member.vocab_rows.size());
    m->expert_layer_widths_.push_back(m->expert_sums_.widths.back() + m->shared_sums_.widths.back());
  }
  // The experts' downs and the shared expert's hold this member's leaves as matrices of their
  // own (whole blocks of the weights, finer than a leaf program's units).
  for (auto [sums, cols] : {std::pair{&m->expert_sums_, c.expert_ffn_dim},
                            std::pair{&m->shared_sums_, c.shared_expert_ffn_dim}}) {
    for (int leaf = sums->mine.first; leaf < sums->mine.last; ++leaf) {
      sums->leaf_columns.push_back({leaf * sums->cols, std::min(cols, (leaf + 1) * sums->cols)});
      sums->leaf_nodes.push_back({leaf, leaf + 1});
    }
  }
  // Layers are shared only between whole models: a member's are its share's alone.
  if (reuse != nullptr && (reuse->file_ != file || reuse->exchange_ != nullptr || exchange != nullptr)) reuse = nullptr;
  TensorBinder bind(*file);

  const gguf::TensorInfo* embd = bind.find("token_embd.weight");
  if (embd == nullptr) throw std::runtime_error("model lacks tensor 'token_embd.weight'");
  if (embd->dims.size() != 2 || embd->dims[1] != static_cast<uint64_t>(c.vocab_size)) {
    throw std::runtime_error("token_embd.weight shape " + shape_text(embd->dims) +
                             " does not match the vocabulary of " + std::to_string(c.vocab_size));
  }
  if (range.has_embedding()) {
    m->embedding_ = bind.matrix("token_embd.weight", c.embedding_dim, c.vocab_size);
  }
  if (range.has_head(c)) m->output_norm_ = bind.vector("output_norm.weight", c.embedding_dim);
  // Repacking the weights is most of a load, and most of that is the kernel handing out fresh
  // pages, which scales with cores: the layers (and the head, the last item) are bound in
  // parallel on every core the machine has.
  m->layers_.resize(static_cast<size_t>(range.size()));
  tensor::ThreadPool load_pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const auto bind_item = [&](int64_t item) {
    if (item == range.size()) {
      if (!range.has_head(c)) return;
      if (reuse != nullptr && reuse->output_) {
        m->output_ = reuse->output_;
        return;
      }
      m->output_ = std::make_shared<const tensor::PreparedMatrix>(
          bind.prepared(bind.find("output.weight") ? "output.weight" : "token_embd.weight", c.embedding_dim,
                        c.vocab_size, share.vocab_rows));
      return;
    }
    const int global = range.first + static_cast<int>(item);
    if (reuse != nullptr && global >= reuse->range_.first && global < reuse->range_.last) {
      m->layers_[static_cast<size_t>(item)] = reuse->layers_[static_cast<size_t>(global - reuse->range_.first)];
      return;
    }
    const std::string p = "blk." + std::to_string(global) + ".";
    auto layer = std::make_shared<Layer>();
    Layer& l = *layer;
    m->layers_[static_cast<size_t>(item)] = layer;
    l.attn_norm = bind.vector(p + "attn_norm.weight", c.embedding_dim);
    // Phi-3's converter keeps Q, K and V as one matrix (attn_qkv), in that order.
    const bool fused_qkv = bind.find(p + "attn_qkv.weight") != nullptr;
    if (c.has_latent_attention()) {
      bind_latent_attention(bind, p, c, l);
    } else if (fused_qkv) {
      const tensor::Matrix qkv = bind.matrix(p + "attn_qkv.weight", c.embedding_dim, c.q_dim() + 2 * c.kv_dim());
      l.q = bind.prepare(TensorBinder::rows_of(qkv, 0, q_rows));
      l.k = bind.prepare(TensorBinder::rows_of(qkv, c.q_dim(), kv_rows));
      l.v = bind.prepare(TensorBinder::rows_of(qkv, c.q_dim() + c.kv_dim(), kv_rows));
    } else {
      l.q = bind.prepared(p + "attn_q.weight", c.embedding_dim, c.q_dim(), q_rows);
      l.k = bind.prepared(p + "attn_k.weight", c.embedding_dim, c.kv_dim(), kv_rows);
      l.v = bind.prepared(p + "attn_v.weight", c.embedding_dim, c.kv_dim(), kv_rows);
    }
    l.o = bind.columns(p + "attn_output.weight", head_values, c.embedding_dim, columns_of(m->o_sums_, head_values));
    // o's bias joins its output once the members' sums are added up.
    if (c.has_output_bias) l.o_bias = bind.vector(p + "attn_output.bias", c.embedding_dim);
    if (c.has_attention_sinks) {
      l.sinks = bind.vector(p + "attn_sinks.weight", c.head_count) + share.kv_heads.first * group;
    }
    if (c.has_post_norms) {
      l.post_attention_norm = bind.vector(p + "post_attention_norm.weight", c.embedding_dim);
      l.post_ffn_norm = bind.vector(p + "post_ffw_norm.weight", c.embedding_dim);
    }
    if (c.has_qkv_bias && fused_qkv) {
      const float* qkv_bias = bind.vector(p + "attn_qkv.bias", c.q_dim() + 2 * c.kv_dim());
      l.q_bias = qkv_bias + q_rows.first;
      l.k_bias = qkv_bias + c.q_dim() + kv_rows.first;
      l.v_bias = qkv_bias + c.q_dim() + c.kv_dim() + kv_rows.first;
    } else if (c.has_qkv_bias) {
      l.q_bias = bind.vector(p + "attn_q.bias", c.q_dim()) + q_rows.first;
      l.k_bias = bind.vector(p + "attn_k.bias", c.kv_dim()) + kv_rows.first;
      l.v_bias = bind.vector(p + "attn_v.bias", c.kv_dim()) + kv_rows.first;
    }
    if (c.has_qk_norm) {
      l.q_norm = bind.vector(p + "attn_q_norm.weight", c.head_dim);
      l.k_norm = bind.vector(p + "attn_k_norm.weight", c.head_dim);
    }
    l.ffn_norm = bind.vector(p + c.ffn_norm_name + ".weight", c.embedding_dim);
    if (c.layer_has_experts(global)) {
      l.router = bind.prepared(p + "ffn_gate_inp.weight", c.embedding_dim, c.expert_count);
      if (c.expert_selection_bias) l.selection_bias = bind.vector(p + "exp_probs_b.bias", c.expert_count);
      l.expert_gate = bind.experts(p + "ffn_gate_exps.weight", c.embedding_dim, c.expert_ffn_dim, c.expert_count,
                                   share.expert_rows);
      l.expert_up = bind.experts(p + "ffn_up_exps.weight", c.embedding_dim, c.expert_ffn_dim, c.expert_count,
                                 share.expert_rows);
      l.expert_down = bind.expert_leaves(p + "ffn_down_exps.weight", c.expert_ffn_dim, c.embedding_dim,
                                         c.expert_count, m->expert_sums_.leaf_columns);
      if (c.has_expert_biases) {
        // Gate's and up's biases from this member's first expert row; down's whole, as every
        // member adds them once the sums are added up.
        l.router_bias = bind.vector(p + "ffn_gate_inp.bias", c.expert_count);
        l.expert_gate_bias =
            bind.vectors(p + "ffn_gate_exps.bias", c.expert_ffn_dim, c.expert_count) + share.expert_rows.first;
        l.expert_up_bias =
            bind.vectors(p + "ffn_up_exps.bias", c.expert_ffn_dim, c.expert_count) + share.expert_rows.first;
        l.expert_down_bias = bind.vectors(p + "ffn_down_exps.bias", c.embedding_dim, c.expert_count);
      }
      if (c.shared_expert_ffn_dim > 0) {
        l.shared_gate = bind.prepared(p + "ffn_gate_shexp.weight", c.embedding_dim, c.shared_expert_ffn_dim,
                                      share.shared_expert_rows);
        l.shared_up = bind.prepared(p + "ffn_up_shexp.weight", c.embedding_dim, c.shared_expert_ffn_dim,
                                    share.shared_expert_rows);
        l.shared_down = bind.leaves(p + "ffn_down_shexp.weight", c.shared_expert_ffn_dim, c.embedding_dim,
                                    m->shared_sums_.leaf_columns);
      }
    } else if (c.fused_gate_up) {
      const tensor::Matrix gate_up = bind.matrix(p + "ffn_up.weight", c.embedding_dim, 2 * c.ffn_dim);
      l.gate = bind.prepare(TensorBinder::rows_of(gate_up, 0, share.ffn_rows));
      l.up = bind.prepare(TensorBinder::rows_of(gate_up, c.ffn_dim, share.ffn_rows));
      l.down = bind.columns(p + "ffn_down.weight", c.ffn_dim, c.embedding_dim, columns_of(m->down_sums_, c.ffn_dim));
    } else {
      l.gate = bind.prepared(p + "ffn_gate.weight", c.embedding_dim, c.ffn_dim, share.ffn_rows);
      l.up = bind.prepared(p + "ffn_up.weight", c.embedding_dim, c.ffn_dim, share.ffn_rows);
      l.down = bind.columns(p + "ffn_down.weight", c.ffn_dim, c.embedding_dim, columns_of(m->down_sums_, c.ffn_dim));
    }
  };
  const int64_t items = range.size() + 1;
  std::atomic<int64_t> bound{0};
  load_pool.parallel_for(items, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      bind_item(item);
      if (progress) progress(static_cast<double>(++bound) / static_cast<double>(items));
    }
  });

  // Llama 3.1-style scaling and LongRoPE ship per-pair frequency divisors as tensors.
  const char* factors_name = c.rope_factors == Config::RopeFactors::Freqs   ? "rope_freqs.weight"
                             : c.rope_factors == Config::RopeFactors::Long  ? "rope_factors_long.weight"
                             : c.rope_factors == Config::RopeFactors::Short ? "rope_factors_short.weight"
                                                                            : nullptr;
  const float* freq_factors = factors_name ? bind.vector(factors_name, c.rope_dim / 2) : nullptr;
  m->ropes_.push_back(rope_table(c, c.rope_freq_base, freq_factors, true));
  if (c.sliding_window > 0 && (c.rope_freq_base_sliding != c.rope_freq_base || !c.sliding_rope_scaled)) {
    m->ropes_.push_back(rope_table(c, c.rope_freq_base_sliding, freq_factors, c.sliding_rope_scaled));
  }
  for (int l = range.first; l < range.last; ++l) {
    m->layer_rope_.push_back(c.is_sliding(l) && m->ropes_.size() > 1 ? 1 : 0);
  }
  m->file_ = std::move(file);
  return m;
}

std::shared_ptr<KvMemory> Model::new_kv_memory(KvBlockCounts blocks, KvType type) const {
  return std::make_shared<KvMemory>(share_config_, range_, blocks, type);
}

std::unique_ptr<KvState> Model::new_sequence(int capacity, KvType type) const {
  const int blocks = (capacity + kKvBlock - 1) / kKvBlock;
  return std::make_unique<KvState>(new_kv_memory({blocks, blocks}, type), capacity);
}

uint64_t Model::weight_bytes() const {
  uint64_t total = 0;
  for (const auto& l : layers_) {
    for (const tensor::PreparedMatrix* m : {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down, &l->router,
                                            &l->shared_gate, &l->shared_up, &l->q_a, &l->q_b,
                                            &l->kv_a}) {
      total += matrix_bytes(m->source());
    }
    for (const auto* heads : {&l->k_b, &l->v_b}) {
      for (const tensor::PreparedMatrix& m : *heads) total += matrix_bytes(m.source());
    }
    for (const auto* experts : {&l->expert_gate, &l->expert_up, &l->expert_down}) {
      uint64_t all = 0;
      for (const tensor::PreparedMatrix& m : *experts) all += matrix_bytes(m.source());
      if (all > 0) total += config_.expert_bytes_read(all);
    }
    for (const tensor::PreparedMatrix& m : l->shared_down) total += matrix_bytes(m.source());
  }
  if (output_) total += matrix_bytes(output_->source());
  return total;
}

void Model::embed(std::span<const Token> tokens, float* out) const {
  const uint64_t row = *tensor::row_bytes(embedding_.type, static_cast<uint64_t>(config_.embedding_dim));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " is outside the vocabulary");
    }
    const auto* src = static_cast<const uint8_t*>(embedding_.data) + row * static_cast<uint64_t>(tokens[i]);
    float* row = out + i * static_cast<size_t>(config_.embedding_dim);
    tensor::dequantize_row(embedding_.type, src, row, config_.embedding_dim);
    if (config_.scales_embeddings) {
      const float scale = std::sqrt(static_cast<float>(config_.embedding_dim));
      for (int d = 0; d < config_.embedding_dim; ++d) row[d] *= scale;
    }
  }
}

void Model::prepare_rope(std::span<const int> positions) {
  for (Rope& rope : ropes_) {
    const size_t pairs = rope.inverse_freq.size();
    rope.cos.resize(positions.size() * pairs);
    rope.sin.resize(positions.size() * pairs);
    for (size_t r = 0; r < positions.size(); ++r) {
      for (size_t i = 0; i < pairs; ++i) {
        const float angle = static_cast<float>(positions[r]) * rope.inverse_freq[i];
        rope.cos[r * pairs + i] = std::cos(angle) * rope.magnitude;
        rope.sin[r * pairs + i] = std::sin(angle) * rope.magnitude;
      }
    }
  }
}

void Model::rope(const Rope& table, float* rows, int row_count, int heads, int head_stride) const {
  const size_t pairs = table.inverse_freq.size();
  // Adjacent pairs rotate (2i, 2i+1); halves rotate (i, i + rope_dim/2).
  const bool adjacent = config_.rope_style == RopeStyle::AdjacentPairs;
  for (int r = 0; r < row_count; ++r) {
    const float* cos_row = table.cos.data() + static_cast<size_t>(r) * pairs;
    const float* sin_row = table.sin.data() + static_cast<size_t>(r) * pairs;
    for (int h = 0; h < heads; ++h) {
      float* head = rows + (static_cast<size_t>(r) * heads + h) * head_stride;
      for (size_t i = 0; i < pairs; ++i) {
        float& a = head[adjacent ? 2 * i : i];
        float& b = head[adjacent ? 2 * i + 1 : i + pairs];
        const float a0 = a;
        const float b0 = b;
        a = a0 * cos_row[i] - b0 * sin_row[i];
        b = a0 * sin_row[i] + b0 * cos_row[i];
      }
    }
  }
}

void Model::attention(int layer_index, const Layer& layer, tensor::ThreadPool& pool) {
  const Config& c = share_config_;
  const bool sliding = c.is_sliding(range_.first + layer_index);
  const int heads = c.head_count;
  const int kv_heads = c.kv_head_count;
  const int group = heads / kv_heads;
  const int key_dim = c.head_dim;
  // With latent attention the values are the keys' leading kv_rank dimensions (the latent).
  const bool values_in_keys = c.has_latent_attention();
  const int value_dim = values_in_keys ? c.mla.kv_rank : c.cached_value_dim();
  const float scale = c.attention_scale > 0.0f ? c.attention_scale : 1.0f / std::sqrt(static_cast<float>(key_dim));
  // An item takes every query head that shares a KV head, so that each block of the cache is
  // read (and, stored as f16, widened) once for all of them; when that leaves threads idle
  // (a lone token), items of four heads. A head's arithmetic is the same either way.
  constexpr int kQueriesPerSplitItem = 4;
  const int64_t rows = static_cast<int64_t>(row_kv_.size());
  const int heads_per_item = rows * kv_heads >= pool.size() ? group : std::min(group, kQueriesPerSplitItem);
  const int items_per_kv_head = (group + heads_per_item - 1) / heads_per_item;
  const int64_t items = rows * kv_heads * items_per_kv_head;
  pool.parallel_for(items, [&](int64_t begin, int64_t end) {
    // Kept by the pool's threads: no allocation per call.
    thread_local std::vector<float> weights, widened, totals, head_weights, head_sums;
    for (int64_t item = begin; item < end; ++item) {
      const size_t row = static_cast<size_t>(item / (kv_heads * items_per_kv_head));
      const int kv_head = static_cast<int>(item / items_per_kv_head % kv_heads);
      const int first_head = kv_head * group + static_cast<int>(item % items_per_kv_head) * heads_per_item;
      const int n_heads = std::min(heads_per_item, (kv_head + 1) * group - first_head);
      const KvState& kv = *row_kv_[row];
      const KvLayout& layout = kv.layout(layer_index);
      const bool halves = layout.type == KvType::F16;
      const int slot = kv.memory_->slot(layer_index);
      const size_t key_offset = layout.key_offset(slot, kv_head);
      const size_t value_offset = layout.value_offset(slot, kv_head);
      widened.resize(std::max(layout.key_elements, layout.value_elements));
      // A block's keys or values (`elements` of them) as floats: in place, or widened exactly
      // from f16 (so the sums below are those of fp32 storage holding the same values).
      const auto floats = [&](int block, size_t offset, size_t elements) {
        const std::byte* p = kv.block_data(layer_index, block) + offset;
        if (!halves) return reinterpret_cast<const float*>(p);
        tensor::fp16_to_fp32(reinterpret_cast<const uint16_t*>(p), widened.data(), static_cast<int64_t>(elements));
        return static_cast<const float*>(widened.data());
      };
      // Keys [first_key, span) are visible; they are scored from the start of first_key's
      // block, the keys before it in that block left out of the softmax. With sinks, each
      // head's scores end with its sink, divided by the scale that the softmax multiplies in.
      const int64_t span = positions_[row] + 1;
      const int64_t first_key = sliding ? std::max<int64_t>(0, span - c.sliding_window) : 0;
      const int64_t scored_from = first_key / kKvBlock * kKvBlock;
      const int64_t scored = span - scored_from;
      const int64_t stride = scored + (layer.sinks != nullptr ? 1 : 0);
      weights.resize(static_cast<size_t>(n_heads * stride));
      const float* q = q_.data() + (row * heads + static_cast<size_t>(first_head)) * key_dim;
      for (int64_t first = scored_from; first < span; first += kKvBlock) {
        const int64_t count = std::min<int64_t>(kKvBlock, span - first);
        tensor::key_scores(q, key_dim, n_heads, floats(static_cast<int>(first / kKvBlock), key_offset, layout.key_elements),
                           0, key_dim, count, weights.data() + (first - scored_from), stride);
      }
      totals.resize(static_cast<size_t>(n_heads));
      float* out = attn_out_.data() + (row * heads + static_cast<size_t>(first_head)) * value_dim;
      const int64_t skipped = first_key - scored_from;
      for (int j = 0; j < n_heads; ++j) {
        if (layer.sinks != nullptr) weights[j * stride + scored] = layer.sinks[first_head + j] / scale;
        totals[j] = tensor::softmax_numerators(weights.data() + j * stride + skipped, stride - skipped, scale);
      }
      std::fill(out, out + n_heads * value_dim, 0.0f);
      // Block by block, so that the heads after the first read its values from L1.
      for (int64_t first = scored_from; first < span; first += kKvBlock) {
        const int64_t from = std::max(first, first_key);
        const int64_t count = std::min<int64_t>(first + kKvBlock, span) - from;
        const int block = static_cast<int>(first / kKvBlock);
        if (values_in_keys) {
          // The values lie dimension-major, as keys: a head's sum over the block is, per
          // dimension, the dot product of that dimension's positions with the head's weights,
          // which is key_scores with the dimensions as queries and up to kKvBlock heads'
          // weights as keys (one a lane). Each lane's chain is its head's alone, so the heads
          // that share a call change no bit; the blocks' sums add in block order.
          const float* keys = floats(block, key_offset, layout.key_elements) + (from - first);
          for (int j0 = 0; j0 < n_heads; j0 += kKvBlock) {
            const int lanes = std::min(kKvBlock, n_heads - j0);
            head_weights.assign(static_cast<size_t>(count) * kKvBlock, 0.0f);
            for (int64_t i = 0; i < count; ++i) {
              for (int j = 0; j < lanes; ++j) {
                head_weights[static_cast<size_t>(i * kKvBlock + j)] = weights[(j0 + j) * stride + (from - scored_from) + i];
              }
            }
            head_sums.resize(static_cast<size_t>(value_dim) * kKvBlock);
            tensor::key_scores(keys, kKvBlock, value_dim, head_weights.data(), 0, count, lanes, head_sums.data(),
                               kKvBlock);
            for (int j = 0; j < lanes; ++j) {
              float* head_out = out + (j0 + j) * value_dim;
              for (int d = 0; d < value_dim; ++d) head_out[d] += head_sums[static_cast<size_t>(d * kKvBlock + j)];
            }
          }
          continue;
        }
        const float* values = floats(block, value_offset, layout.value_elements) + (from - first) * value_dim;
        for (int j = 0; j < n_heads; ++j) {
          tensor::add_scaled_rows(weights.data() + j * stride + (from - scored_from), values, value_dim, count,
                                  value_dim, out + j * value_dim);
        }
      }
      for (int j = 0; j < n_heads; ++j) {
        const float inv_total = 1.0f / totals[j];
        for (int d = 0; d < value_dim; ++d) out[j * value_dim + d] *= inv_total;
      }
    }
  });
}

void Model::per_head_products(const std::vector<tensor::PreparedMatrix>& heads, HeadParts in, HeadParts out,
                              int rows, tensor::ThreadPool& pool) {
  const size_t n = static_cast<size_t>(rows);
  const size_t head_count = heads.size();
  const size_t in_dim = static_cast<size_t>(in.dim);
  const size_t out_dim = static_cast<size_t>(out.dim);
  head_in_.resize(head_count * n * in_dim);
  head_out_.resize(head_count * n * out_dim);
  for (size_t h = 0; h < head_count; ++h) {
    for (size_t r = 0; r < n; ++r) {
      const float* from = in.data + r * in.row_stride + h * in.head_stride;
      std::copy(from, from + in_dim, head_in_.data() + (h * n + r) * in_dim);
    }
  }
  // Every head's product in one parallel loop; a row's output is the same whichever rows share it.
  expert_jobs_.clear();
  for (size_t h = 0; h < head_count; ++h) {
    expert_jobs_.push_back({{heads[h], head_out_.data() + h * n * out_dim}, head_in_.data() + h * n * in_dim, rows});
  }
  tensor::matmul(expert_jobs_, pool);
  for (size_t h = 0; h < head_count; ++h) {
    for (size_t r = 0; r < n; ++r) {
      const float* from = head_out_.data() + (h * n + r) * out_dim;
      std::copy(from, from + out_dim, out.data + r * out.row_stride + h * out.head_stride);
    }
  }
}

void Model::latent_queries_and_keys(const Layer& layer, const Rope& table, int rows, tensor::ThreadPool& pool) {
  const Config& c = config_;
  const LatentAttention& mla = c.mla;
  const size_t n = static_cast<size_t>(rows);
  const int heads = c.head_count;
  const int query_dim = mla.nope_dim + c.rope_dim;  // of a head, as q_b gives it
  head_queries_.resize(n * heads * query_dim);
  if (mla.q_rank > 0) {
    q_compressed_.resize(n * mla.q_rank);
    tensor::matmul({{layer.q_a, q_compressed_.data()}, {layer.kv_a, k_.data()}}, normed_.data(), rows, pool);
    rms_norm_rows(q_compressed_.data(), layer.q_a_norm, rows, mla.q_rank, c.rms_epsilon, q_compressed_.data(), pool);
    tensor::matmul(layer.q_b, q_compressed_.data(), rows, head_queries_.data(), pool);
  } else {
    tensor::matmul({{layer.q, head_queries_.data()}, {layer.kv_a, k_.data()}}, normed_.data(), rows, pool);
  }
  for (size_t r = 0; r < n; ++r) {
    float* latent = k_.data() + r * c.head_dim;
    rms_norm(latent, layer.kv_a_norm, mla.kv_rank, c.rms_epsilon, latent);
  }
  rope(table, k_.data() + mla.kv_rank, rows, 1, c.head_dim);
  // Each head's query part without RoPE meets the latent through k_b: q k = (k_b^T q) . latent.
  const size_t head_count = static_cast<size_t>(heads);
  per_head_products(layer.k_b,
                    {head_queries_.data(), head_count * query_dim, static_cast<size_t>(query_dim), mla.nope_dim},
                    {q_.data(), head_count * c.head_dim, static_cast<size_t>(c.head_dim), mla.kv_rank}, rows, pool);
  for (size_t r = 0; r < n; ++r) {
    for (int h = 0; h < heads; ++h) {
      const float* rotated = head_queries_.data() + (r * heads + h) * query_dim + mla.nope_dim;
      std::copy(rotated, rotated + c.rope_dim, q_.data() + (r * heads + h) * c.head_dim + mla.kv_rank);
    }
  }
  rope(table, q_.data() + mla.kv_rank, rows, heads, c.head_dim);
}

void Model::latent_values(const Layer& layer, int rows, tensor::ThreadPool& pool) {
  const Config& c = config_;
  const int heads = c.head_count;
  head_values_.resize(static_cast<size_t>(rows) * heads * c.mla.value_dim);
  const size_t h = static_cast<size_t>(heads);
  const size_t latent = static_cast<size_t>(c.mla.kv_rank);
  const size_t value = static_cast<size_t>(c.mla.value_dim);
  per_head_products(layer.v_b, {attn_out_.data(), h * latent, latent, c.mla.kv_rank},
                    {head_values_.data(), h * value, value, c.mla.value_dim}, rows, pool);
}

void Model::activate(float* gate, const float* up, size_t rows, size_t width, tensor::ThreadPool& pool) const {
  tensor::for_rows(static_cast<int64_t>(rows), pool, [&](int64_t begin, int64_t end) {
    float* g = gate + static_cast<size_t>(begin) * width;
    const float* u = up + static_cast<size_t>(begin) * width;
    const auto n = static_cast<int64_t>(static_cast<size_t>(end - begin) * width);
    switch (config_.activation) {
      case Activation::Silu: tensor::silu_times(g, u, n); return;
      case Activation::ClampedSwiglu: tensor::clamped_swiglu_times(g, u, n, 1.702f, 7.0f); return;
      case Activation::Gelu: tensor::gelu_times(g, u, n); return;
    }
  });
}

void Model::experts_ffn(const Layer& layer, int rows, tensor::ThreadPool& pool) {
  const Config& c = config_;
  const size_t dim = static_cast<size_t>(c.embedding_dim);
  const size_t n = static_cast<size_t>(rows);
  const size_t k = static_cast<size_t>(c.experts_per_token);
  const size_t experts = static_cast<size_t>(c.expert_count);
  router_scores_.resize(n * experts);
  tensor::matmul(layer.router, normed_.data(), rows, router_scores_.data(), pool);
  add_bias(router_scores_.data(), layer.router_bias, rows, c.expert_count);
  // Each row's choice depends on its own scores only: its probabilities (plus the selection
  // bias), the k largest (ties to the lower expert index) of its groups; their weights the probabilities,
  // normalized to add up to 1 in that order and scaled as the config says.
  chosen_experts_.resize(n * k);
  chosen_weights_.resize(n * k);
  selection_.resize(experts);
  std::vector<int>& order = expert_order_;
  for (size_t r = 0; r < n; ++r) {
    float* p = router_scores_.data() + r * experts;
    // The kernels' exponential, the same bits on every path and architecture.
    if (c.expert_gating == ExpertGating::Softmax) {
      const float total = tensor::softmax_numerators(p, static_cast<int64_t>(experts), 1.0f);
      for (size_t e = 0; e < experts; ++e) p[e] /= total;
    } else {
      // sigmoid(s) = e^s / (e^s + e^0), the softmax of {s, 0}.
      for (size_t e = 0; e < experts; ++e) {
        float pair[2] = {p[e], 0.0f};
        const float total = tensor::softmax_numerators(pair, 2, 1.0f);
        p[e] = pair[0] / total;
      }
    }
    const float* ranked = p;
    if (layer.selection_bias != nullptr) {
      for (size_t e = 0; e < experts; ++e) selection_[e] = p[e] + layer.selection_bias[e];
      ranked = selection_.data();
    }
    int* chosen = chosen_experts_.data() + r * k;
    choose_experts({ranked, experts}, c.expert_group_count, c.expert_groups_used, {chosen, k}, order);
    float chosen_total = 0.0f;
    for (size_t j = 0; j < k; ++j) chosen_total += p[chosen[j]];
    // llama.cpp's floor under the sum (the smallest normal half): sigmoids of very negative
    // scores would otherwise divide by almost nothing. A softmax's k largest never sum below it.
    const float divisor = c.expert_weights_norm ? std::max(chosen_total, 6.103515625e-5f) : 1.0f;
    for (size_t j = 0; j < k; ++j) chosen_weights_[r * k + j] = p[chosen[j]] / divisor * c.expert_weights_scale;
  }
  // Each expert runs once over the rows that chose it, so its weights are read once a batch;
  // a row's output from it is the same whichever rows share the call.
  // The slots (row * k + j) that chose each expert, in ascending order, by a counting sort:
  // expert e's are expert_slots_[expert_starts_[e] .. expert_starts_[e + 1]).
  expert_starts_.assign(experts + 1, 0);
  for (const int e : chosen_experts_) ++expert_starts_[static_cast<size_t>(e) + 1];
  for (size_t e = 0; e < experts; ++e) expert_starts_[e + 1] += expert_starts_[e];
  expert_slots_.resize(n * k);
  expert_fill_.assign(expert_starts_.begin(), expert_starts_.end() - 1);
  for (size_t s = 0; s < n * k; ++s) expert_slots_[expert_fill_[static_cast<size_t>(chosen_experts_[s])]++] = s;
  // The slots' rows gathered in that order, so that expert e's are rows expert_starts_[e] ..
  // of expert_in_; all experts' gate and up products (and the shared expert's, over every row)
  // then run in one parallel loop, and all their down products in another (two thread waits a
  // layer, not two an expert). `ffn` and `shared_ffn` are this member's rows of an expert's
  // and the shared expert's activations: its columns of their down.
  const size_t ffn = static_cast<size_t>(share_config_.expert_ffn_dim);
  const size_t shared_ffn = static_cast<size_t>(share_config_.shared_expert_ffn_dim);
  gate_.resize(n * shared_ffn);
  up_.resize(n * shared_ffn);
  const size_t slot_count = n * k;
  expert_in_.resize(slot_count * dim);
  expert_gate_.resize(slot_count * ffn);
  expert_up_.resize(slot_count * ffn);
  tensor::for_rows(static_cast<int64_t>(slot_count), pool, [&](int64_t begin, int64_t end) {
    for (auto i = static_cast<size_t>(begin); i < static_cast<size_t>(end); ++i) {
      const float* row = normed_.data() + expert_slots_[i] / k * dim;
      std::copy(row, row + dim, expert_in_.data() + i * dim);
    }
  });
  const auto each_expert = [&](const auto& run) {
    for (size_t e = 0; e < experts; ++e) {
      const size_t first = expert_starts_[e];
      const auto count = static_cast<int64_t>(expert_starts_[e + 1] - first);
      if (count > 0) run(e, first, count);
    }
  };
  expert_jobs_.clear();
  each_expert([&](size_t e, size_t first, int64_t count) {
    const float* in = expert_in_.data() + first * dim;
    expert_jobs_.push_back({{layer.expert_gate[e], expert_gate_.data() + first * ffn}, in, count});
    expert_jobs_.push_back({{layer.expert_up[e], expert_up_.data() + first * ffn}, in, count});
  });
  if (shared_ffn > 0) {
    expert_jobs_.push_back({{layer.shared_gate, gate_.data()}, normed_.data(), rows});
    expert_jobs_.push_back({{layer.shared_up, up_.data()}, normed_.data(), rows});
  }
  tensor::matmul(expert_jobs_, pool);
  if (layer.expert_gate_bias != nullptr) {
    each_expert([&](size_t e, size_t first, int64_t count) {
      const size_t bias_offset = e * static_cast<size_t>(c.expert_ffn_dim);
      add_bias(expert_gate_.data() + first * ffn, layer.expert_gate_bias + bias_offset, static_cast<int>(count),
               static_cast<int>(ffn));
      add_bias(expert_up_.data() + first * ffn, layer.expert_up_bias + bias_offset, static_cast<int>(count),
               static_cast<int>(ffn));
    });
  }
  activate(expert_gate_.data(), expert_up_.data(), slot_count, ffn, pool);
  activate(gate_.data(), up_.data(), n, shared_ffn, pool);
  // Each down adds up in leaves (leaf_tree.h), as the dense down does, of this member's leaves
  // alone, each leaf's product a matmul of its own: of an expert, a leaf's value is the row's
  // chosen experts' products of it weighed (a chain of fused multiply-adds in the row's order of
  // choices) before the tree adds the leaves; of the shared expert, its product. The inputs lie
  // leaf after leaf; the leaves' products, slot after slot (or row after row), as many leaves
  // at a time as kLeafProducts floats hold (all of them for a few tokens: one thread wait), each
  // weighed before the next leaves run, so that a long prompt's products need not all be held.
  // Every step that goes row by row runs on all threads: each row's result is its own.
  const size_t leaves = expert_sums_.leaf_columns.size();
  const size_t shared_leaves = shared_sums_.leaf_columns.size();
  split_into_leaves(expert_gate_, slot_count, expert_sums_.leaf_columns, expert_leaf_in_, pool);
  split_into_leaves(gate_, n, shared_sums_.leaf_columns, shared_leaf_in_, pool);
  // Each leaf's region is as wide as the first leaf's (the last leaf's may be narrower).
  const size_t expert_stride = leaves > 0 ? static_cast<size_t>(expert_sums_.leaf_columns[0].size()) : 0;
  const size_t shared_stride = shared_leaves > 0 ? static_cast<size_t>(shared_sums_.leaf_columns[0].size()) : 0;
  constexpr size_t kLeafProducts = size_t{1} << 24;
  const size_t leaves_at_once = std::clamp<size_t>(kLeafProducts / (slot_count * dim), 1, leaves);
  expert_leaves_.resize(leaves_at_once * slot_count * dim);
  shared_leaves_.resize(shared_leaves * n * dim);
  weighed_leaves_.resize(n * leaves * dim);  // row after row, leaf after leaf
  slot_positions_.resize(slot_count);
  for (size_t i = 0; i < slot_count; ++i) slot_positions_[expert_slots_[i]] = i;
  for (size_t begin = 0; begin < leaves; begin += leaves_at_once) {  // every member has a leaf
    const size_t end = std::min(leaves, begin + leaves_at_once);
    expert_jobs_.clear();
    each_expert([&](size_t e, size_t first, int64_t count) {
      for (size_t leaf = begin; leaf < end; ++leaf) {
        const auto width = static_cast<size_t>(expert_sums_.leaf_columns[leaf].size());
        float* out = expert_leaves_.data() + ((leaf - begin) * slot_count + first) * dim;
        expert_jobs_.push_back({{layer.expert_down[e * leaves + leaf], out},
                                expert_leaf_in_.data() + leaf * slot_count * expert_stride + first * width, count});
      }
    });
    for (size_t leaf = 0; leaf < shared_leaves && begin == 0; ++leaf) {
      expert_jobs_.push_back({{layer.shared_down[leaf], shared_leaves_.data() + leaf * n * dim},
                              shared_leaf_in_.data() + leaf * n * shared_stride, rows});
    }
    tensor::matmul(expert_jobs_, pool);
    tensor::for_rows(static_cast<int64_t>(n), pool, [&](int64_t first_row, int64_t end_row) {
      for (auto r = static_cast<size_t>(first_row); r < static_cast<size_t>(end_row); ++r) {
        for (size_t leaf = begin; leaf < end; ++leaf) {
          const float* products = expert_leaves_.data() + (leaf - begin) * slot_count * dim;
          float* weighed = weighed_leaves_.data() + (r * leaves + leaf) * dim;
          std::fill_n(weighed, dim, 0.0f);
          for (size_t j = 0; j < k; ++j) {
            tensor::add_scaled_rows(chosen_weights_.data() + r * k + j, products + slot_positions_[r * k + j] * dim,
                                    0, 1, static_cast<int64_t>(dim), weighed);
          }
        }
      }
    });
  }
  // This member's sums of each row: its cover of the experts' leaves, then of the shared one's.
  const size_t own_width = (expert_sums_.own.size() + shared_sums_.own.size()) * dim;
  leaf_sums_.resize(n * own_width);
  tensor::for_rows(static_cast<int64_t>(n), pool, [&](int64_t begin, int64_t end) {
    std::vector<const float*> leaf_values(leaves);
    std::vector<const float*> shared_values(shared_leaves);
    for (auto r = static_cast<size_t>(begin); r < static_cast<size_t>(end); ++r) {
      for (size_t leaf = 0; leaf < leaves; ++leaf) {
        leaf_values[leaf] = weighed_leaves_.data() + (r * leaves + leaf) * dim;
      }
      for (size_t leaf = 0; leaf < shared_leaves; ++leaf) {
        shared_values[leaf] = shared_leaves_.data() + (leaf * n + r) * dim;
      }
      float* sums = leaf_sums_.data() + r * own_width;
      for (const LeafNode& node : expert_sums_.own) {
        add_leaf_tree(node, expert_sums_.leaf_nodes, leaf_values, dim, sums);
        sums += dim;
      }
      for (const LeafNode& node : shared_sums_.own) {
        add_leaf_tree(node, shared_sums_.leaf_nodes, shared_values, dim, sums);
        sums += dim;
      }
    }
  });
  read_next(after_ffn_);
  gather(leaf_sums_, expert_layer_widths_, n, all_leaf_sums_);
  // Every member's sums added up: the experts' tree, their biases weighed in the same order,
  // then the shared expert's tree.
  size_t row_width = 0;
  for (const int width : expert_layer_widths_) row_width += static_cast<size_t>(width);
  const size_t expert_all = expert_sums_.all.size();
  const size_t shared_all = shared_sums_.all.size();
  proj_.resize(n * dim);
  tensor::for_rows(static_cast<int64_t>(n), pool, [&](int64_t begin, int64_t end) {
    std::vector<const float*> leaf_values;
    std::vector<const float*> shared_values;
    std::vector<float> row_total(dim);
    for (auto r = static_cast<size_t>(begin); r < static_cast<size_t>(end); ++r) {
      const float* row = all_leaf_sums_.data() + r * row_width;
      leaf_values.clear();
      shared_values.clear();
      for (size_t m = 0; m < expert_layer_widths_.size(); ++m) {
        for (int i = 0; i < expert_sums_.widths[m]; i += static_cast<int>(dim), row += dim) {
          leaf_values.push_back(row);
        }
        for (int i = 0; i < shared_sums_.widths[m]; i += static_cast<int>(dim), row += dim) {
          shared_values.push_back(row);
        }
      }
      float* out = proj_.data() + r * dim;
      add_leaf_tree(leaf_root(expert_sums_.count), expert_sums_.all, {leaf_values.data(), expert_all}, dim, out);
      if (layer.expert_down_bias != nullptr) {
        std::fill(row_total.begin(), row_total.end(), 0.0f);
        for (size_t j = 0; j < k; ++j) {
          const float* expert_bias = layer.expert_down_bias + static_cast<size_t>(chosen_experts_[r * k + j]) * dim;
          tensor::add_scaled_rows(chosen_weights_.data() + r * k + j, expert_bias, 0, 1, static_cast<int64_t>(dim),
                                  row_total.data());
        }
        for (size_t d = 0; d < dim; ++d) out[d] += row_total[d];
      }
      if (shared_all > 0) {
        add_leaf_tree(leaf_root(shared_sums_.count), shared_sums_.all, {shared_values.data(), shared_all}, dim,
                      row_total.data());
        for (size_t d = 0; d < dim; ++d) out[d] += row_total[d];
      }
    }
  });
}

void Model::split_into_leaves(const std::vector<float>& in, size_t rows, std::span<const RowRange> leaves,
                              std::vector<float>& out, tensor::ThreadPool& pool) {
  if (leaves.empty()) return;
  const size_t width = static_cast<size_t>(leaves.back().last - leaves.front().first);
  const size_t stride = static_cast<size_t>(leaves.front().size());
  out.resize(leaves.size() * rows * stride);
  tensor::for_rows(static_cast<int64_t>(rows), pool, [&](int64_t begin, int64_t end) {
    for (size_t leaf = 0; leaf < leaves.size(); ++leaf) {
      const size_t first = static_cast<size_t>(leaves[leaf].first - leaves.front().first);
      const auto cols = static_cast<size_t>(leaves[leaf].size());
      float* region = out.data() + leaf * rows * stride;
      for (auto r = static_cast<size_t>(begin); r < static_cast<size_t>(end); ++r) {
        std::copy_n(in.data() + r * width + first, cols, region + r * cols);
      }
    }
  });
}

void Model::dense_ffn(const Layer& layer, int rows, tensor::ThreadPool& pool) {
  gate_.resize(static_cast<size_t>(rows) * static_cast<size_t>(share_config_.ffn_dim));
  up_.resize(gate_.size());
  tensor::matmul({{layer.gate, gate_.data()}, {layer.up, up_.data()}}, normed_.data(), rows, pool);
  activate(gate_.data(), up_.data(), static_cast<size_t>(rows), static_cast<size_t>(share_config_.ffn_dim), pool);
  read_next(after_ffn_);
  add_up_leaves(layer.down, down_sums_, gate_.data(), rows, pool);
}

void Model::add_up_leaves(const tensor::PreparedMatrix& w, const LeafSums& sums, const float* in, int rows,
                          tensor::ThreadPool& pool) {
  const size_t dim = static_cast<size_t>(config_.embedding_dim);
  const size_t n = static_cast<size_t>(rows);
  const tensor::LeafProgram program{sums.cols, sums.steps, static_cast<int>(sums.own.size())};
  // A whole model's one sum is the root: its row of the projection.
  std::vector<float>& own_sums = exchange_ == nullptr ? proj_ : leaf_sums_;
  own_sums.resize(n * sums.own.size() * dim);
  const tensor::MatmulJob job{{w, own_sums.data()}, in, rows, &program};
  tensor::matmul(std::span(&job, 1), pool);
  if (exchange_ == nullptr) return;
  gather(leaf_sums_, sums.widths, n, all_leaf_sums_);
  const size_t all = sums.all.size();
  proj_.resize(n * dim);
  tensor::for_rows(static_cast<int64_t>(n), pool, [&](int64_t begin, int64_t end) {
    std::vector<const float*> values(all);
    for (auto r = static_cast<size_t>(begin); r < static_cast<size_t>(end); ++r) {
      for (size_t i = 0; i < all; ++i) values[i] = all_leaf_sums_.data() + (r * all + i) * dim;
      add_leaf_tree(leaf_root(sums.count), sums.all, values, dim, proj_.data() + r * dim);
    }
  });
}

void Model::read_next(std::span<const tensor::PreparedMatrix* const> matrices) {
  if (exchange_ == nullptr) return;
  next_reads_.clear();
  for (const tensor::PreparedMatrix* m : matrices) {
    if (m != nullptr && m->interleaved() != nullptr) next_reads_.push_back(m->interleaved_region());
  }
  exchange_->read_next(next_reads_);
}

void Model::gather(std::vector<float>& mine, std::span<const int> widths, size_t rows, std::vector<float>& full) {
  if (exchange_ == nullptr) {
    std::swap(mine, full);
    return;
  }
  size_t row_width = 0;
  for (const int w : widths) row_width += static_cast<size_t>(w);
  full.resize(rows * row_width);
  exchange_->all_gather(mine, widths, rows, full);
}

std::vector<std::byte> Model::gather_from_members(std::span<const std::byte> mine) const {
  if (exchange_ == nullptr) return {mine.begin(), mine.end()};
  const std::vector<size_t> widths(static_cast<size_t>(exchange_->size()), mine.size());
  std::vector<std::byte> all(mine.size() * widths.size());
  exchange_->all_gather_bytes(mine, widths, 1, all);
  return all;
}

std::vector<float> Model::forward(std::span<const SequenceSlice> slices, std::span<const Token> tokens,
                                  std::span<const float> hidden, tensor::ThreadPool& pool, HeadRows head) {
  std::vector<float> out;
  forward(slices, tokens, hidden, pool, head, out);
  return out;
}

void Model::forward(std::span<const SequenceSlice> slices, std::span<const Token> tokens,
                    std::span<const float> hidden, tensor::ThreadPool& pool, HeadRows head, std::vector<float>& out) {
  const Config& c = config_;
  const int dim = c.embedding_dim;
  int rows = 0;
  positions_.clear();
  row_kv_.clear();
  for (const SequenceSlice& s : slices) {
    if (s.kv == nullptr || s.token_count <= 0) throw std::invalid_argument("empty sequence slice");
    if (s.kv->size() + s.token_count > s.kv->capacity()) {
      throw std::invalid_argument("sequence of " + std::to_string(s.kv->size() + s.token_count) +
                                  " tokens exceeds its context of " + std::to_string(s.kv->capacity()));
    }
    for (int j = 0; j < s.token_count; ++j) {
      positions_.push_back(s.kv->size() + j);
      row_kv_.push_back(s.kv);
    }
    rows += s.token_count;
  }
  const size_t n = static_cast<size_t>(rows);
  prepare_rope(positions_);
  x_.resize(n * dim);
  if (range_.has_embedding()) {
    if (tokens.size() != n) throw std::invalid_argument("token count does not match the slices");
    if (!hidden.empty()) throw std::invalid_argument("hidden rows sent to the range that embeds tokens");
    embed(tokens, x_.data());
  } else {
    if (hidden.size() != n * dim) throw std::invalid_argument("hidden rows do not match the slices");
    std::copy(hidden.begin(), hidden.end(), x_.begin());
  }

  // The attention's sizes are this model's share's; the residual stream's, and o's and down's
  // outputs once gathered, are the model's.
  const Config& own = share_config_;
  normed_.resize(n * dim);
  q_.resize(n * own.q_dim());
  k_.resize(n * own.kv_dim());
  v_.resize(n * own.kv_dim());
  proj_.resize(n * dim);
  for (const SequenceSlice& s : slices) {
    if (!s.kv->reserve_step(s.token_count)) {
      throw KvPoolFull("the KV pool has no free block for a sequence of " +
                       std::to_string(s.kv->size() + s.token_count) + " positions");
    }
  }

  for (int l = 0; l < range_.size(); ++l) {
    const Layer& layer = *layers_[static_cast<size_t>(l)];
    rms_norm_rows(x_.data(), layer.attn_norm, rows, dim, c.rms_epsilon, normed_.data(), pool);
    const Rope& table = ropes_[layer_rope_[static_cast<size_t>(l)]];
    // Sized each layer: the last one's gather may have swapped it for a buffer of another size.
    attn_out_.resize(n * own.q_dim());
    if (c.has_latent_attention()) {
      latent_queries_and_keys(layer, table, rows, pool);
      // No values are stored: they are the keys' leading kv_rank, the latent.
      for (size_t row = 0; row < n; ++row) row_kv_[row]->store(l, positions_[row], k_.data() + row * c.kv_dim(), nullptr);
      attention(l, layer, pool);
      latent_values(layer, rows, pool);
      add_up_leaves(layer.o, o_sums_, head_values_.data(), rows, pool);
    } else {
      tensor::matmul({{layer.q, q_.data()}, {layer.k, k_.data()}, {layer.v, v_.data()}}, normed_.data(), rows, pool);
      add_bias(q_.data(), layer.q_bias, rows, own.q_dim());
      add_bias(k_.data(), layer.k_bias, rows, own.kv_dim());
      add_bias(v_.data(), layer.v_bias, rows, own.kv_dim());
      if (c.has_qk_norm) {
        rms_norm_rows(q_.data(), layer.q_norm, rows * own.head_count, c.head_dim, c.rms_epsilon, q_.data(), pool);
        rms_norm_rows(k_.data(), layer.k_norm, rows * own.kv_head_count, c.head_dim, c.rms_epsilon, k_.data(), pool);
      }
      rope(table, q_.data(), rows, own.head_count, c.head_dim);
      rope(table, k_.data(), rows, own.kv_head_count, c.head_dim);
      for (size_t row = 0; row < n; ++row) {
        row_kv_[row]->store(l, positions_[row], k_.data() + row * own.kv_dim(), v_.data() + row * own.kv_dim());
      }
      attention(l, layer, pool);
      const bool experts = c.layer_has_experts(range_.first + l);
      read_next(experts ? std::initializer_list<const tensor::PreparedMatrix*>{&layer.router, &layer.shared_gate,
                                                                               &layer.shared_up}
                        : std::initializer_list<const tensor::PreparedMatrix*>{&layer.gate, &layer.up});
      add_up_leaves(layer.o, o_sums_, attn_out_.data(), rows, pool);
    }
    add_bias(proj_.data(), layer.o_bias, rows, dim);
    if (layer.post_attention_norm != nullptr) {
      rms_norm_rows(proj_.data(), layer.post_attention_norm, rows, dim, c.rms_epsilon, proj_.data(), pool);
    }
    add_in_place(x_, proj_, n * dim);

    rms_norm_rows(x_.data(), layer.ffn_norm, rows, dim, c.rms_epsilon, normed_.data(), pool);
    after_ffn_.clear();
    if (l + 1 < range_.size()) {
      const Layer& next = *layers_[static_cast<size_t>(l + 1)];
      after_ffn_ = {&next.q, &next.k, &next.v};
    } else if (range_.has_head(c)) {
      after_ffn_ = {output_.get()};
    }
    if (c.layer_has_experts(range_.first + l)) {
      experts_ffn(layer, rows, pool);
    } else {
      dense_ffn(layer, rows, pool);
    }
    if (layer.post_ffn_norm != nullptr) {
      rms_norm_rows(proj_.data(), layer.post_ffn_norm, rows, dim, c.rms_epsilon, proj_.data(), pool);
    }
    add_in_place(x_, proj_, n * dim);
  }
  for (const SequenceSlice& s : slices) s.kv->size_ += s.token_count;

  if (!range_.has_head(c)) {
    out.assign(x_.begin(), x_.end());
    return;
  }

  // Only the rows whose logits are wanted go through the (large) output head; embedding rows
  // stop at its norm.
  std::vector<float> selected;
  std::vector<float> embeddings;
  size_t first_row = 0;
  for (const SequenceSlice& s : slices) {
    const size_t count = static_cast<size_t>(s.token_count);
    const size_t to = first_row + count;
    const size_t from = s.output == SliceOutput::Nothing      ? to
                        : s.output == SliceOutput::LastLogits ? to - 1
                                                              : first_row;
    std::vector<float>& into = s.output == SliceOutput::AllEmbeddings ? embeddings : selected;
    for (size_t r = from; r < to; ++r) {
      into.resize(into.size() + dim);
      rms_norm(x_.data() + r * dim, output_norm_, dim, c.rms_epsilon, into.data() + into.size() - dim);
    }
    first_row = to;
  }
  const int64_t selected_rows = static_cast<int64_t>(selected.size() / dim);
  const size_t head_values = static_cast<size_t>(selected_rows * output_->source().rows);
  // The logits go straight into `out`, but for a group's member that gathers whole rows.
  const bool gathers = exchange_ != nullptr && head == HeadRows::Whole;
  std::vector<float>& logits = gathers ? head_share_ : out;
  logits.resize(head_values);
  if (gathers) out.clear();
  if (selected_rows > 0) {
    tensor::matmul(*output_, selected.data(), selected_rows, logits.data(), pool);
    if (gathers) gather(head_share_, vocab_widths_, static_cast<size_t>(selected_rows), out);
  }
  if (c.logit_softcap > 0.0f) {
    for (float& logit : out) logit = c.logit_softcap * std::tanh(logit / c.logit_softcap);
  }
  if (embeddings.empty()) return;
  if (selected_rows == 0) {
    out = std::move(embeddings);
    return;
  }
  // Both kinds in one batch: each slice's rows in slice order.
  const std::vector<float> logits_rows = std::move(out);
  const size_t row_values = static_cast<size_t>(head == HeadRows::Share ? vocab_share_.size() : c.vocab_size);
  out.clear();
  out.reserve(logits_rows.size() + embeddings.size());
  size_t next_logits = 0;
  size_t next_embedding = 0;
  for (const SequenceSlice& s : slices) {
    const size_t count = static_cast<size_t>(s.token_count);
    if (s.output == SliceOutput::AllEmbeddings) {
      out.insert(out.end(), embeddings.begin() + next_embedding, embeddings.begin() + next_embedding + count * dim);
      next_embedding += count * dim;
    } else if (s.output != SliceOutput::Nothing) {
      const size_t values = (s.output == SliceOutput::AllLogits ? count : 1) * row_values;
      out.insert(out.end(), logits_rows.begin() + next_logits, logits_rows.begin() + next_logits + values);
      next_logits += values;
    }
  }
}

}  // namespace strata::model
