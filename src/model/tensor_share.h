// Tensor parallelism: a group of members each hold a share of every layer of a range and
// compute their share of each step at the same time, gathering the rows the others computed.
// q, k, v, the FFN's gate and up and the head are split by their output rows and read their
// whole input, so each member runs, per output row, the arithmetic one Model runs. o and down
// are split by their input's columns instead: each member adds up its leaves of them and the
// members finish one fixed tree of sums (leaf_tree.h), which one Model adds in too. Either
// way the group's results are bit-identical to one Model's, whatever the group size and shares.
#pragma once

#include <span>
#include <vector>

#include "model/config.h"

namespace strata::model {

// Rows [first, last) of a dimension.
struct RowRange {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
  bool operator==(const RowRange&) const = default;
};

// One member's share of every layer and of the output head. A member's attention covers its
// KV heads and the query heads that read them; it computes its rows of each projection's output:
// of q, k and v its heads', of the FFN's gate and up its ffn_rows, of each expert's gate and up
// its expert_rows and of the shared expert's its shared_expert_rows (empty ranges in a model
// without them), of the head its vocab_rows; of o and of every down, the sums of its columns:
// its heads' values, its ffn_rows, expert_rows and shared_expert_rows. The routing is every
// member's.
struct TensorShare {
  RowRange kv_heads;
  RowRange ffn_rows;
  RowRange vocab_rows;
  RowRange expert_rows;
  RowRange shared_expert_rows;
  bool operator==(const TensorShare&) const = default;
};

// Row dimensions are shared out in units of this many rows (a dimension's last unit may be
// shorter): the kernels compute rows in interleaved groups of 16, which a share that ends
// inside a group would pad with rows of zeros (computed and thrown away).
constexpr int kShareRowUnit = 16;

// The leaves o's and the downs' inputs are added up in (leaf_tree.h), the same for one Model and
// for any group, each whole units of the weights' layout (Config::projection_block; the
// experts' whole blocks, expert_down_block): o's of `kv_heads` KV heads' query heads' values,
// down's of `ffn_rows` of the FFN's rows, an expert's down's of `expert_rows` of its rows and the
// shared expert's of `shared_expert_rows`; the last leaf of each may be shorter. Down's leaves
// are at most 32, of 256 rows or more where that leaves 8 or more; an expert's at most 8 (a step
// keeps each chosen expert's product of each leaf until it weighs them), of 128 rows or more
// where that leaves 4 or more; each of one size where a size up to twice the least allowed does.
struct ProjectionLeaves {
  int kv_heads = 1;
  int ffn_rows = 1;
  int expert_rows = 1;
  int shared_expert_rows = 1;
  int o_count(const Config& config) const { return (config.kv_head_count + kv_heads - 1) / kv_heads; }
  int down_count(const Config& config) const { return (config.ffn_dim + ffn_rows - 1) / ffn_rows; }
  int expert_count(const Config& config) const { return (config.expert_ffn_dim + expert_rows - 1) / expert_rows; }
  int shared_expert_count(const Config& config) const {
    return (config.shared_expert_ffn_dim + shared_expert_rows - 1) / shared_expert_rows;
  }
};
ProjectionLeaves projection_leaves(const Config& config);

// The members' shares, in member order, each dimension shared out in proportion to `weights`
// (e.g. the members' measured speeds) by largest remainders, every member getting at least one
// unit of each. The KV heads and the FFN's, experts' and shared expert's rows go in whole leaves
// of o and of their down. Throws std::invalid_argument naming the reason for a weight that is
// not positive and finite, more members than the model has leaves (or units of a dimension),
// and latent attention, whose heads share one latent KV head.
std::vector<TensorShare> plan_tensor_shares(const Config& config, std::span<const double> weights);

}  // namespace strata::model
