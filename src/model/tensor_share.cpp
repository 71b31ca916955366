#include "model/tensor_share.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::model {
namespace {

// `units` shared out in proportion to `weights`: each member its ideal share rounded down (at
// least one), then units taken from those furthest above their ideal or given to those furthest
// below it, ties to the lower member, until they add up.
std::vector<int> split_units(int units, std::span<const double> weights, const char* what) {
  const size_t members = weights.size();
  if (static_cast<size_t>(units) < members) {
    throw std::invalid_argument("a group of " + std::to_string(members) + " members cannot share " +
                                std::to_string(units) + " " + what + ": each member needs at least one");
  }
  double total = 0.0;
  for (const double w : weights) total += w;
  std::vector<double> ideal(members);
  std::vector<int> counts(members);
  int given = 0;
  for (size_t m = 0; m < members; ++m) {
    ideal[m] = units * weights[m] / total;
    counts[m] = std::max(1, static_cast<int>(std::floor(ideal[m])));
    given += counts[m];
  }
  while (given != units) {
    const int step = given > units ? -1 : 1;
    size_t chosen = members;
    double chosen_gap = 0.0;
    for (size_t m = 0; m < members; ++m) {
      if (step < 0 && counts[m] == 1) continue;
      const double gap = step < 0 ? counts[m] - ideal[m] : ideal[m] - counts[m];
      if (chosen == members || gap > chosen_gap) {
        chosen = m;
        chosen_gap = gap;
      }
    }
    counts[chosen] += step;
    given += step;
  }
  return counts;
}

// Consecutive ranges of a dimension of `rows` rows, in units of `unit` rows (the last unit the rest).
std::vector<RowRange> split_rows(int rows, int unit, std::span<const double> weights, const char* what) {
  const std::vector<int> counts = split_units((rows + unit - 1) / unit, weights, what);
  std::vector<RowRange> ranges;
  int first = 0;
  for (const int count : counts) {
    const int last = std::min(rows, first + count * unit);
    ranges.push_back({first, last});
    first = last;
  }
  return ranges;
}

// The rows of a leaf of a down's input of `rows` rows, whole `block`s: at most `most` leaves,
// else of `least_rows` rows or more where that leaves `fewest` or more; of one size where a
// size up to twice the least allowed divides the rows, else with a shorter last leaf.
int leaf_rows(int rows, int block, int most, int least_rows, int fewest) {
  const int units = std::max(1, (rows + block - 1) / block);
  const int least = std::min(units, std::max((units + most - 1) / most,
                                             std::min((least_rows + block - 1) / block, std::max(1, units / fewest))));
  int blocks_per_leaf = least;
  while (blocks_per_leaf < 2 * least && units % blocks_per_leaf != 0) ++blocks_per_leaf;
  if (units % blocks_per_leaf != 0) blocks_per_leaf = least;
  return blocks_per_leaf * block;
}

}  // namespace

ProjectionLeaves projection_leaves(const Config& config) {
  ProjectionLeaves leaves;
  const int block = std::max(1, config.projection_block);
  const int kv_heads = std::max(1, config.kv_head_count);
  const int head_values = config.has_latent_attention() ? 0 : config.head_count / kv_heads * config.head_dim;
  leaves.kv_heads = kv_heads;
  for (int k = 1; k <= kv_heads && head_values > 0; ++k) {
    if (k * head_values % block == 0) {
      leaves.kv_heads = k;
      break;
    }
  }
  leaves.ffn_rows = leaf_rows(config.ffn_dim, block, 32, 256, 8);
  const int expert_block = std::max(1, config.expert_down_block);
  leaves.expert_rows = leaf_rows(config.expert_ffn_dim, expert_block, 8, 128, 4);
  leaves.shared_expert_rows = leaf_rows(config.shared_expert_ffn_dim, expert_block, 8, 128, 4);
  return leaves;
}

std::vector<TensorShare> plan_tensor_shares(const Config& config, std::span<const double> weights) {
  if (weights.empty()) throw std::invalid_argument("a tensor-parallel group needs at least one member");
  for (size_t m = 0; m < weights.size(); ++m) {
    if (!std::isfinite(weights[m]) || weights[m] <= 0.0) {
      std::ostringstream message;
      message << "member " << m << "'s weight " << weights[m]
              << " is not a positive number: every member of a group computes a share";
      throw std::invalid_argument(message.str());
    }
  }
  if (config.has_latent_attention()) {
    throw std::invalid_argument("tensor parallelism cannot split " + config.arch_name +
                                "'s latent attention, whose heads all read one latent KV head");
  }
  const ProjectionLeaves leaves = projection_leaves(config);
  const auto kv_heads = split_rows(config.kv_head_count, leaves.kv_heads, weights, "leaves of KV heads");
  const std::vector<RowRange> none(weights.size());
  const auto ffn_rows = config.dense_ffn_dim() > 0
                            ? split_rows(config.dense_ffn_dim(), leaves.ffn_rows, weights, "leaves of FFN rows")
                            : none;
  const auto vocab_rows = split_rows(config.vocab_size, kShareRowUnit, weights, "units of vocabulary rows");
  const auto expert_rows =
      config.has_experts() ? split_rows(config.expert_ffn_dim, leaves.expert_rows, weights, "leaves of expert rows")
                           : none;
  const auto shared_expert_rows = config.shared_expert_ffn_dim > 0
                                      ? split_rows(config.shared_expert_ffn_dim, leaves.shared_expert_rows, weights,
                                                   "leaves of shared expert rows")
                                      : none;
  std::vector<TensorShare> shares;
  for (size_t m = 0; m < weights.size(); ++m) {
    shares.push_back({kv_heads[m], ffn_rows[m], vocab_rows[m], expert_rows[m], shared_expert_rows[m]});
  }
  return shares;
}

}  // namespace strata::model
