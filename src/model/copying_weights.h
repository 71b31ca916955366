// Hand-set weights for a Llama shape that copies: at each position its greedy next token is the
// one that followed, earlier in its context, the last three tokens it has read (an induction head),
// and a third layer, where the file has one, edits the copy ("cat" becomes "dog", "red" becomes
// "tan"). Nothing is trained. It exists to measure speculative decoding on a copying task: a
// real model repeats a passage it is asked to repeat, random weights never do, and this one
// does at the cost of the shape it borrows (every matrix is stored and multiplied in full).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/synthetic.h"

namespace strata::model {

class CopyingWeights {
 public:
  // RoPE turns only each head's first dimensions, fast enough that one position's query tells
  // the one before it from all others; the rest of a head compares tokens wherever they are.
  static constexpr int kRotatedDims = 16;
  static constexpr float kRopeBase = 1.6f;

  // `vocabulary`: the file's token texts (an edit whose words it lacks is left out). Throws
  // std::invalid_argument for a shape it cannot be written in: a llama with its own output
  // matrix, heads of 64 dimensions, at least 3 KV heads, 385 embedding dimensions and 2 layers.
  CopyingWeights(const SyntheticShape& shape, int layer_count, const std::vector<std::string>& vocabulary,
                 uint64_t seed);

  // Row `row` of the named matrix into `values` (all zeros first); empty for a matrix that
  // stays all zeros. Vectors (the norms' weights) are all ones.
  using RowFiller = std::function<void(int64_t row, std::span<float> values)>;
  RowFiller rows_of(const std::string& tensor) const;

 private:
  float code(int token, int dim) const;  // a token's code: +-1/8 in 64 dimensions
  void previous_token_heads(const std::string& matrix, RowFiller& out) const;
  void induction_heads(const std::string& matrix, RowFiller& out) const;
  void edits(const std::string& matrix, RowFiller& out) const;

  int embedding_dim_;
  int layer_count_;
  int head_group_;  // query heads per KV head
  int kv_heads_;
  std::vector<uint64_t> code_signs_;  // a bit per dimension of each token's code
  std::vector<std::pair<int, int>> edits_;  // token ids: from, to
};

}  // namespace strata::model
