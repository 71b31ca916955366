#include "model/copying_weights.h"

#include <cmath>
#include <random>
#include <stdexcept>
#include <string_view>

namespace strata::model {
namespace {

// The residual stream carries, in 64 dimensions each, the code of the token at its position,
// of the three tokens before it (written by layer 0), and of the token to say next (written by
// layer 1, changed by layer 2's edits); then, for a token an edit changes, the code of what it
// becomes (its "edited" code). Layer 0 copies a token's code and edited code together, so
// that a copy resumes after an edit as it would without it. The last dimension is 1 in every
// position.
constexpr int kCodeDims = 64;
constexpr int kCurrent = 0;
constexpr int kBack[] = {64, 128, 192};  // the previous token's, the one's before, ...
constexpr int kNext = 256;
constexpr int kEdited = 320;
constexpr int kUsedDims = 384;  // and the constant
constexpr int kLookBacks = static_cast<int>(std::size(kBack));  // layer 0's heads, one per KV head
constexpr int kInductionHeads = 4;  // each compares other dimensions of the codes; their answers are averaged
constexpr int kSpans[] = {24, 12, 12};  // how many dimensions of each of three codes a query compares

// Attention logits, before softmax, where a head finds what it looks for: large enough that
// the rest get no weight. Layer 0's heads find the position 1, 2 or 3 back at this score and
// the strongest rival among 2,048 positions at 0.71 of it; layer 1's find three matching
// tokens at this score, the nearest two at three quarters of it.
constexpr double kOffsetScore = 200.0;
constexpr double kMatchScore = 100.0;

// The edit layer's units: a unit sees the code to be said next and fires when it is `from`'s.
constexpr double kEditSensitivity = 4.0;  // times the code's dot product, which is 1 for a match
constexpr double kEditThreshold = 2.5;    // a wrong code's dot product (sd 1/8) stays far below
constexpr double kEditStrength = 1.5;     // the code becomes 1.5 to's minus 0.5 from's

constexpr std::pair<std::string_view, std::string_view> kEdits[] = {
    {"\xE2\x96\x81" "cat", "\xE2\x96\x81" "dog"},
    {"\xE2\x96\x81" "red", "\xE2\x96\x81" "tan"},
};

// What RMS normalization multiplies the residual by where it holds `codes` unit codes and the 1.
double norm_factor(int embedding_dim, int codes) { return std::sqrt(embedding_dim / (codes + 1.0)); }

bool is(const std::string& tensor, int layer, std::string_view matrix) {
  return tensor == "blk." + std::to_string(layer) + "." + std::string(matrix) + ".weight";
}

}  // namespace

CopyingWeights::CopyingWeights(const SyntheticShape& shape, int layer_count,
                               const std::vector<std::string>& vocabulary, uint64_t seed)
    : embedding_dim_(shape.embedding_dim), layer_count_(layer_count) {
  const int head_dim = shape.head_dim > 0 ? shape.head_dim : shape.embedding_dim / shape.head_count;
  const std::string arch = shape.arch;
  if (arch != "llama" || shape.tied_output || shape.expert_count > 0 || head_dim != kCodeDims ||
      shape.kv_head_count < kLookBacks || shape.embedding_dim <= kUsedDims || layer_count < 2) {
    throw std::invalid_argument(std::string("copying weights need a dense llama with its own output matrix, heads of ") +
                                std::to_string(kCodeDims) + " dimensions, " + std::to_string(kLookBacks) +
                                " KV heads or more, " + std::to_string(kUsedDims + 1) +
                                " embedding dimensions or more and 2 layers or more; " + shape.name + " is not one");
  }
  kv_heads_ = shape.kv_head_count;
  head_group_ = shape.head_count / shape.kv_head_count;
  std::mt19937_64 random(seed);
  code_signs_.resize(vocabulary.size());
  for (uint64_t& signs : code_signs_) signs = random();
  auto id_of = [&](std::string_view text) {
    for (size_t id = 0; id < vocabulary.size(); ++id) {
      if (vocabulary[id] == text) return static_cast<int>(id);
    }
    return -1;
  };
  for (const auto& [from, to] : kEdits) {
    const int from_id = id_of(from), to_id = id_of(to);
    if (from_id >= 0 && to_id >= 0 && static_cast<int>(edits_.size()) < shape.ffn_dim) {
      edits_.emplace_back(from_id, to_id);
    }
  }
}

float CopyingWeights::code(int token, int dim) const {
  return (code_signs_[static_cast<size_t>(token)] >> dim & 1) != 0 ? 0.125f : -0.125f;
}

CopyingWeights::RowFiller CopyingWeights::rows_of(const std::string& tensor) const {
  const int constant = embedding_dim_ - 1;
  RowFiller out;
  if (tensor == "token_embd.weight") {
    out = [this, constant](int64_t token, std::span<float> row) {
      for (int d = 0; d < kCodeDims; ++d) row[kCurrent + d] = code(static_cast<int>(token), d);
      for (const auto& [from, to] : edits_) {
        if (from != token) continue;
        for (int d = 0; d < kCodeDims; ++d) row[kEdited + d] = code(to, d);
      }
      row[static_cast<size_t>(constant)] = 1.0f;
    };
  } else if (tensor == "output.weight") {
    out = [this](int64_t token, std::span<float> row) {
      for (int d = 0; d < kCodeDims; ++d) row[kNext + d] = code(static_cast<int>(token), d);
    };
  } else {
    previous_token_heads(tensor, out);
    induction_heads(tensor, out);
    if (layer_count_ > 2) edits(tensor, out);
  }
  return out;
}

// Layer 0: the first query head of KV head h looks h + 1 positions back and writes the code
// and edited code it reads there to kBack[h]. Their queries and keys come from the constant
// dimension alone, in the rotated pairs: the key turned back by h + 1 positions' angle meets
// the query where it stands that far back.
void CopyingWeights::previous_token_heads(const std::string& matrix, RowFiller& out) const {
  constexpr int kLayer = 0;
  const int constant = embedding_dim_ - 1;
  const double f = norm_factor(embedding_dim_, 1);
  // A logit is (1/8) x the pairs' sum of query x key, each of weight x f.
  const float weight = static_cast<float>(std::sqrt(kOffsetScore) / f);
  if (is(matrix, kLayer, "attn_q")) {
    out = [=, this](int64_t row, std::span<float> values) {
      const int head = static_cast<int>(row / kCodeDims), dim = static_cast<int>(row % kCodeDims);
      if (head % head_group_ == 0 && head / head_group_ < kLookBacks && dim < kRotatedDims && dim % 2 == 0) {
        values[static_cast<size_t>(constant)] = weight;
      }
    };
  } else if (is(matrix, kLayer, "attn_k")) {
    out = [=](int64_t row, std::span<float> values) {
      const int kv_head = static_cast<int>(row / kCodeDims), dim = static_cast<int>(row % kCodeDims);
      if (kv_head >= kLookBacks || dim >= kRotatedDims) return;
      const double angle = (kv_head + 1) * std::pow(static_cast<double>(kRopeBase), -2.0 * (dim / 2) / kRotatedDims);
      values[static_cast<size_t>(constant)] =
          static_cast<float>(weight * (dim % 2 == 0 ? std::cos(angle) : std::sin(angle)));
    };
  } else if (is(matrix, kLayer, "attn_v")) {
    out = [=](int64_t row, std::span<float> values) {
      const int kv_head = static_cast<int>(row / kCodeDims), dim = static_cast<int>(row % kCodeDims);
      if (kv_head >= kLookBacks) return;
      values[static_cast<size_t>(kCurrent + dim)] = static_cast<float>(1.0 / f);
      values[static_cast<size_t>(kEdited + dim)] = static_cast<float>(1.0 / f);
    };
  } else if (is(matrix, kLayer, "attn_output")) {
    out = [this](int64_t row, std::span<float> values) {
      for (int head = 0; head < kLookBacks; ++head) {
        if (row >= kBack[head] && row < kBack[head] + kCodeDims) {
          values[static_cast<size_t>(head * head_group_ * kCodeDims + (row - kBack[head]))] = 1.0f;
        }
      }
    };
  }
}

// Layer 1: the induction heads. A position's query holds its own code and the previous two
// positions'; a key holds the codes of the three tokens before its position (with their edited
// codes); the value is its position's code. So a position attends where the three tokens it
// ends with stood before, or what they were edited from, and reads what came next. Each head
// compares other dimensions of the codes (24 of the nearest, 12 of each other), away from the
// rotated ones; their values are averaged into the code to say next.
void CopyingWeights::induction_heads(const std::string& matrix, RowFiller& out) const {
  constexpr int kLayer = 1;
  const int heads = std::min(kInductionHeads, kv_heads_);
  const double f = norm_factor(embedding_dim_, 4);
  const float weight = static_cast<float>(std::sqrt(kMatchScore * 8.0 * kCodeDims / (kCodeDims - kRotatedDims)) / f);
  // Head h's `dim` (past the rotated ones) reads this dimension of the code `back` tokens before
  // the query's position (0: its own) or the key's (0: the one before it).
  auto source = [](int head, int dim, bool key) {
    int at = dim - kRotatedDims, span = 0;
    while (at >= kSpans[span]) at -= kSpans[span++];
    const int code_dim = (16 * head + at + 24 * span) % kCodeDims;
    return (key ? kBack[span] : span == 0 ? kCurrent : kBack[span - 1]) + code_dim;
  };
  if (is(matrix, kLayer, "attn_q")) {
    out = [=, this](int64_t row, std::span<float> values) {
      const int head = static_cast<int>(row / kCodeDims), dim = static_cast<int>(row % kCodeDims);
      if (head % head_group_ != 0 || head / head_group_ >= heads || dim < kRotatedDims) return;
      values[static_cast<size_t>(source(head / head_group_, dim, false))] = weight;
    };
  } else if (is(matrix, kLayer, "attn_k")) {
    out = [=](int64_t row, std::span<float> values) {
      const int kv_head = static_cast<int>(row / kCodeDims), dim = static_cast<int>(row % kCodeDims);
      if (kv_head < heads && dim >= kRotatedDims) values[static_cast<size_t>(source(kv_head, dim, true))] = weight;
    };
  } else if (is(matrix, kLayer, "attn_v")) {
    out = [=](int64_t row, std::span<float> values) {
      const int kv_head = static_cast<int>(row / kCodeDims), dim = static_cast<int>(row % kCodeDims);
      if (kv_head < heads) values[static_cast<size_t>(kCurrent + dim)] = static_cast<float>(1.0 / f);
    };
  } else if (is(matrix, kLayer, "attn_output")) {
    out = [=, this](int64_t row, std::span<float> values) {
      if (row < kNext || row >= kNext + kCodeDims) return;
      for (int head = 0; head < heads; ++head) {
        values[static_cast<size_t>(head * head_group_ * kCodeDims + (row - kNext))] = 1.0f / static_cast<float>(heads);
      }
    };
  }
}

// Layer 2's feed-forward: a unit per edit, whose gate opens when the code to say next is its
// `from` (the constant holds it shut otherwise) and whose output turns that code into `to`'s.
void CopyingWeights::edits(const std::string& matrix, RowFiller& out) const {
  constexpr int kLayer = 2;
  const int constant = embedding_dim_ - 1;
  const double f = norm_factor(embedding_dim_, 5);
  const int units = static_cast<int>(edits_.size());
  if (is(matrix, kLayer, "ffn_gate")) {
    out = [=, this](int64_t row, std::span<float> values) {
      if (row >= units) return;
      for (int d = 0; d < kCodeDims; ++d) {
        values[static_cast<size_t>(kNext + d)] =
            static_cast<float>(kEditSensitivity * code(edits_[static_cast<size_t>(row)].first, d));
      }
      values[static_cast<size_t>(constant)] = static_cast<float>(-kEditThreshold);
    };
  } else if (is(matrix, kLayer, "ffn_up")) {
    out = [=](int64_t row, std::span<float> values) {
      if (row < units) values[static_cast<size_t>(constant)] = static_cast<float>(1.0 / f);
    };
  } else if (is(matrix, kLayer, "ffn_down")) {
    // A unit's output: its gate, about (sensitivity x 0.9 - threshold) x f for a match (the
    // code read back is a little short of the written one), times up's 1.
    const double open = (kEditSensitivity * 0.9 - kEditThreshold) * f;
    out = [=, this](int64_t row, std::span<float> values) {
      if (row < kNext || row >= kNext + kCodeDims) return;
      const int d = static_cast<int>(row - kNext);
      for (int unit = 0; unit < units; ++unit) {
        const auto [from, to] = edits_[static_cast<size_t>(unit)];
        values[static_cast<size_t>(unit)] = static_cast<float>(kEditStrength * (code(to, d) - code(from, d)) / open);
      }
    };
  }
}

}  // namespace strata::model
