#include "cluster/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>

#include "cluster/stage_needs.h"
#include "units/byte_size.h"

namespace strata::cluster {
namespace {

// Nodes sorted by id: every later choice iterates in this order, so the input order never
// matters. Validates what the placement relies on.
std::vector<NodeCapacity> sorted_nodes(std::span<const NodeCapacity> nodes) {
  std::vector<NodeCapacity> sorted(nodes.begin(), nodes.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const NodeCapacity& node = sorted[i];
    if (node.id.empty()) throw std::invalid_argument("a node has an empty id");
    if (i > 0 && sorted[i - 1].id == node.id) throw std::invalid_argument("node id '" + node.id + "' appears twice");
    if (!std::isfinite(node.weight_bytes_per_second) || node.weight_bytes_per_second <= 0.0) {
      throw std::invalid_argument("node '" + node.id + "' reports a weight speed of " +
                                  std::to_string(node.weight_bytes_per_second) + " bytes/s; it must be positive");
    }
    for (double cost : {node.seconds_per_exchange, node.seconds_per_gathered_byte, node.seconds_per_step}) {
      if (!std::isfinite(cost) || cost < 0.0) {
        throw std::invalid_argument("node '" + node.id + "' reports an exchange cost of " + std::to_string(cost) +
                                    " s; it must be non-negative");
      }
    }
  }
  return sorted;
}

// A token's time on a stage: the weights it reads there, at the node's measured speed. Of a
// Mixture-of-Experts layer that is the experts it runs, not all the node holds. A group adds
// its exchanges of rows.
double stage_seconds(const NodeCapacity& node, const StageNeeds& needs, int first, int last) {
  return static_cast<double>(needs.read_bytes(first, last)) / node.weight_bytes_per_second +
         node.seconds_per_exchange * static_cast<double>(needs.gathers(first, last)) +
         node.seconds_per_gathered_byte * static_cast<double>(needs.gathered_bytes(first, last)) +
         node.seconds_per_step;
}

// Bytes of weights each node lacks, per layer and for the embedding and head, with prefix sums
// so that any stage's fetch costs O(1).
class Fetches {
 public:
  Fetches(const std::vector<NodeCapacity>& nodes, const ModelFootprint& model) : model_(model) {
    for (const NodeCapacity& node : nodes) {
      const Holdings& held = node.held;
      std::vector<uint64_t> missing;
      for (int layer = 0; layer < model.layer_count; ++layer) {
        const uint64_t size = model.layer_weight_bytes[static_cast<size_t>(layer)];
        const uint64_t have = held.everything ? size
                              : static_cast<size_t>(layer) < held.layer_bytes.size()
                                  ? std::min(size, held.layer_bytes[static_cast<size_t>(layer)])
                                  : 0;
        missing.push_back(size - have);
      }
      prefix_.push_back(prefix_sums(missing));
      lacks_embedding_.push_back(!held.everything && !held.embedding);
      lacks_head_.push_back(!held.everything && !held.head);
      any_ = any_ || prefix_.back().back() > 0 || lacks_embedding_.back() || lacks_head_.back();
    }
  }

  // Whether some node lacks something.
  bool any() const { return any_; }

  uint64_t bytes(size_t node, int first, int last) const {
    const std::vector<uint64_t>& prefix = prefix_[node];
    uint64_t bytes = prefix[static_cast<size_t>(last)] - prefix[static_cast<size_t>(first)];
    if (first == 0 && lacks_embedding_[node]) bytes = saturating_add(bytes, model_.embedding_bytes);
    if (last == model_.layer_count && lacks_head_[node]) bytes = saturating_add(bytes, model_.head_bytes);
    return bytes;
  }

 private:
  const ModelFootprint& model_;
  std::vector<std::vector<uint64_t>> prefix_;  // per node: missing bytes of layers [0, i)
  std::vector<bool> lacks_embedding_;
  std::vector<bool> lacks_head_;
  bool any_ = false;
};

// A candidate split's merit, lower is better: `total` and `then` are summed over stages (and
// skipped nodes), `worst` is the largest single stage's share. Compared lexicographically,
// the sums with a relative tolerance so that rounding noise never decides between equal splits.
struct Score {
  double total = 0.0;
  double then = 0.0;
  double worst = 0.0;
  Score plus(Score stage) const { return {total + stage.total, then + stage.then, std::max(worst, stage.worst)}; }
};

// a < b beyond rounding noise.
bool less(double a, double b) { return a < b - 1e-9 * std::max({std::abs(a), std::abs(b), 1e-12}); }

bool better(const Score& a, const Score& b) {
  if (less(a.total, b.total)) return true;
  if (less(b.total, a.total)) return false;
  if (less(a.then, b.then)) return true;
  if (less(b.then, a.then)) return false;
  return less(a.worst, b.worst);
}

struct PlannedStage {
  size_t node;  // index into the sorted nodes
  int first;
  int last;
};

struct Split {
  Score score;
  std::vector<PlannedStage> stages;
};

// The best split of all layers over the nodes in `order`, each node used for one contiguous
// stage or skipped, stages following `order`. DP over (nodes of the order considered, layers
// covered): cell (i, k) holds the best score for layers [0, k) on the first i nodes; node i
// either is skipped or takes [k, e) for every e its memory allows. Because a score combines
// by sum and max, both monotone, the best prefix is part of a best whole. O(n · L²).
// `stage_score(node, first, last)` is only asked about stages that obey the memory rule.
template <typename StageScore, typename SkipScore>
std::optional<Split> best_split(std::span<const size_t> order, const std::vector<NodeCapacity>& nodes,
                                const StageNeeds& needs, const StageScore& stage_score,
                                const SkipScore& skip_score) {
  const int layer_count = needs.count();
  struct Cell {
    bool reached = false;
    Score score;
    int from = -1;  // where this node's stage starts; -1: the node was skipped
  };
  const size_t width = static_cast<size_t>(layer_count) + 1;
  std::vector<Cell> table((order.size() + 1) * width);
  auto cell = [&](size_t i, int k) -> Cell& { return table[i * width + static_cast<size_t>(k)]; };
  auto offer = [](Cell& target, Score score, int from) {
    if (!target.reached || better(score, target.score)) target = {true, score, from};
  };
  cell(0, 0).reached = true;
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t node = order[i];
    const uint64_t memory = nodes[node].memory_bytes;
    for (int k = 0; k <= layer_count; ++k) {
      const Cell here = cell(i, k);
      if (!here.reached) continue;
      offer(cell(i + 1, k), here.score.plus(skip_score(node)), -1);
      for (int e = k + 1; e <= layer_count; ++e) {
        if (needs.memory_bytes(nodes[node], k, e) > memory) {
          // Before the last layer a longer stage only needs more; the last adds the head.
          if (e < layer_count) break;
          continue;
        }
        offer(cell(i + 1, e), here.score.plus(stage_score(node, k, e)), k);
      }
    }
  }
  if (!cell(order.size(), layer_count).reached) return std::nullopt;

  Split split{cell(order.size(), layer_count).score, {}};
  int k = layer_count;
  for (size_t i = order.size(); i > 0; --i) {
    const Cell& c = cell(i, k);
    if (c.from < 0) continue;
    split.stages.push_back({order[i - 1], c.from, k});
    k = c.from;
  }
  std::reverse(split.stages.begin(), split.stages.end());
  return split;
}

// The search behind both strategies. Only the first stage (embedding) and the last (head)
// differ from the others, so a pipeline order matters mostly through which nodes are first and
// last: best_split runs for every (first, last) pair of nodes with the others between them in
// id order, the plain id order first so that it wins ties; the lowest score wins. When the
// layers have equal sizes this is the optimum over every order and every subset of nodes: a
// middle stage's time and memory depend only on its node and its layer count, not on its
// position. With unequal layers (mixes such as Q4_K_M) another order of the middle nodes could
// fit a little differently; that is not searched. O(n³ · L²) at worst: about 0.3 s for 16
// nodes and 200 needs.
template <typename StageScore, typename SkipScore>
std::optional<Split> best_split_over_orders(const std::vector<size_t>& candidates,
                                            const std::vector<NodeCapacity>& nodes, const StageNeeds& needs,
                                            const StageScore& stage_score, const SkipScore& skip_score) {
  std::optional<Split> best;
  auto consider = [&](const std::vector<size_t>& order) {
    std::optional<Split> split = best_split(order, nodes, needs, stage_score, skip_score);
    if (split && (!best || better(split->score, best->score))) best = std::move(split);
  };
  consider(candidates);
  const size_t n = candidates.size();
  for (size_t first = 0; first < n; ++first) {
    for (size_t last = 0; last < n; ++last) {
      if (first == last || (first == 0 && last == n - 1)) continue;
      std::vector<size_t> order{candidates[first]};
      for (size_t i = 0; i < n; ++i) {
        if (i != first && i != last) order.push_back(candidates[i]);
      }
      order.push_back(candidates[last]);
      consider(order);
    }
  }
  return best;
}

// Layers per node in proportion to memory, floors first, then the remaining layers one each to
// the largest remainders (ties to the earlier node in id order).
std::vector<int> memory_weighted_counts(const std::vector<size_t>& candidates,
                                        const std::vector<NodeCapacity>& nodes, int layer_count) {
  long double total_memory = 0;
  for (size_t node : candidates) total_memory += static_cast<long double>(nodes[node].memory_bytes);
  std::vector<int> counts(nodes.size(), 0);
  std::vector<std::pair<long double, size_t>> remainders;
  int assigned = 0;
  for (size_t node : candidates) {
    const long double share = layer_count * static_cast<long double>(nodes[node].memory_bytes) / total_memory;
    counts[node] = static_cast<int>(std::floor(share));
    assigned += counts[node];
    remainders.emplace_back(share - counts[node], node);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; assigned < layer_count; ++i, ++assigned) ++counts[remainders[i % remainders.size()].second];
  return counts;
}

std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f ms", seconds * 1000.0);
  return text;
}

double predicted_seconds(const std::vector<PlannedStage>& stages, const std::vector<NodeCapacity>& nodes,
                         const StageNeeds& needs, double hop_seconds) {
  double seconds = hop_seconds * static_cast<double>(stages.size() - 1);
  for (const PlannedStage& s : stages) seconds += stage_seconds(nodes[s.node], needs, s.first, s.last);
  return seconds;
}

bool holds_a_layer(const NodeCapacity& node, const StageNeeds& needs) {
  return node.memory_bytes >= needs.smallest_stage_bytes(node);
}

std::string too_small(const NodeCapacity& node, const StageNeeds& needs) {
  return "too small for one layer and its KV (needs " + units::describe_bytes(needs.smallest_stage_bytes(node)) + ")";
}

[[noreturn]] void throw_does_not_fit(const std::vector<NodeCapacity>& nodes, const StageNeeds& needs) {
  // Nodes with a KV pool of their own (--kv-memory) keep it whatever their layers: it leaves
  // their memory. The others keep KV per layer, each as it sizes its pool: the reserve counts
  // every layer at the largest such share, an upper bound when the nodes differ.
  uint64_t usable = 0, pools = 0, per_layer = 0, per_window_layer = 0, kv = 0;
  bool reserve = false, any = false, differ = false;
  for (const NodeCapacity& node : nodes) {
    if (!holds_a_layer(node, needs)) continue;
    any = true;
    usable = saturating_add(usable, node.memory_bytes - std::min(node.memory_bytes, node.kv_pool_bytes));
    pools = saturating_add(pools, node.kv_pool_bytes);
    if (node.kv_pool_bytes > 0) continue;
    const uint64_t all_layers = needs.kv_of_layers(node, 0, needs.count());
    differ = differ || (reserve && all_layers != kv);
    kv = std::max(kv, all_layers);
    per_layer = std::max(per_layer, needs.kv_per_layer(node));
    per_window_layer = std::max(per_window_layer, needs.kv_per_window_layer(node));
    reserve = true;
  }
  if (!any) {  // no node holds a layer: what the model needs on nodes as the request sizes them
    reserve = true;
    per_layer = needs.default_kv_per_layer();
    per_window_layer = needs.default_kv_per_window_layer();
    kv = needs.kv_of_layers(NodeCapacity{}, 0, needs.count());
  }
  const uint64_t needed = saturating_add(needs.weight_bytes(), reserve ? kv : 0);
  std::string message = "the model needs " + units::describe_bytes(needed) +
                        (reserve ? " with a KV reserve of " + units::describe_bytes(kv) + " (" +
                                       units::describe_bytes(per_layer) + " per layer" +
                                       (needs.has_window_layers()
                                            ? ", " + units::describe_bytes(per_window_layer) + " per sliding-window layer"
                                            : "") +
                                       (pools > 0 || differ ? ", at most: its nodes keep different shares" : "") + ")"
                                 : " of weights") +
                        "; the cluster has " + units::describe_bytes(usable) + " usable" +
                        (pools > 0 ? " besides its nodes' own KV pools of " + units::describe_bytes(pools) : "");
  uint64_t missing = 0;
  if (needed > usable) {
    missing = needed - usable;
    message += ": " + units::describe_bytes(missing) + " missing";
  } else {
    message += ", but no split into whole layers fits its nodes";
  }
  for (const NodeCapacity& node : nodes) {
    if (!holds_a_layer(node, needs)) {
      message += "; node '" + node.id + "' (" + units::describe_bytes(node.memory_bytes) + ") is " + too_small(node, needs);
    }
  }
  throw DoesNotFit(message, missing);
}

// The placement's reason: the strategy and prediction, then a line per node.
std::string explain(const Split& split, const std::vector<NodeCapacity>& nodes, const StageNeeds& needs,
                    const Fetches& fetches, const PlacementRequest& request, double predicted,
                    const std::string& note) {
  std::string reason = std::string(request.strategy == Strategy::Speed
                                       ? "speed strategy (fastest pipeline for one stream)"
                                       : "memory strategy (layers in proportion to usable memory)") +
                       ": " + std::to_string(split.stages.size()) + " of " + std::to_string(nodes.size()) +
                       " nodes, predicted " + milliseconds(predicted) + " per token with " +
                       milliseconds(request.hop_seconds) + " per hop" + note;
  std::set<size_t> used;
  for (const PlannedStage& s : split.stages) {
    used.insert(s.node);
    reason += "\n  " + nodes[s.node].id + ": layers " + std::to_string(s.first) + ".." + std::to_string(s.last - 1) +
              ", " + units::describe_bytes(needs.memory_bytes(nodes[s.node], s.first, s.last)) + " of " + units::describe_bytes(nodes[s.node].memory_bytes) +
              " usable, " + milliseconds(stage_seconds(nodes[s.node], needs, s.first, s.last)) + " per token";
    if (const uint64_t fetch = fetches.bytes(s.node, s.first, s.last); fetch > 0) {
      reason += ", " + units::describe_bytes(fetch) + " to fetch from peers";
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (used.contains(i)) continue;
    reason += "\n  " + nodes[i].id + " (" + units::describe_bytes(nodes[i].memory_bytes) + "): left out, ";
    if (!holds_a_layer(nodes[i], needs)) {
      reason += too_small(nodes[i], needs);
    } else if (request.strategy == Strategy::Speed) {
      reason += "not needed: the pipeline is faster without it";
    } else {
      reason += "no split that includes it obeys the memory rule";
    }
  }
  return reason;
}

void check_request(const PlacementRequest& request) {
  if (!std::isfinite(request.hop_seconds) || request.hop_seconds < 0.0) {
    throw std::invalid_argument("the hop cost must be a non-negative number of seconds, not " +
                                std::to_string(request.hop_seconds));
  }
  if (!std::isfinite(request.keep_tolerance) || request.keep_tolerance < 0.0) {
    throw std::invalid_argument("the keep tolerance must be a non-negative share, not " +
                                std::to_string(request.keep_tolerance));
  }
}

}  // namespace

double predicted_seconds_per_token(std::span<const Stage> stages, std::span<const NodeCapacity> stage_nodes,
                                   const ModelFootprint& model, const PlacementRequest& request) {
  if (stages.size() != stage_nodes.size()) throw std::invalid_argument("a node is needed for every stage predicted");
  const StageNeeds needs(model, request.kv_tokens);
  double seconds = 0.0;
  for (size_t i = 0; i < stages.size(); ++i) {
    seconds += stage_seconds(stage_nodes[i], needs, stages[i].first_layer, stages[i].last_layer) +
               (stages[i].first_layer > 0 ? request.hop_seconds : 0.0);
  }
  return seconds;
}

Placement place_layers(std::span<const NodeCapacity> input_nodes, const ModelFootprint& model,
                       const PlacementRequest& request) {
  check_request(request);
  const std::vector<NodeCapacity> nodes = sorted_nodes(input_nodes);
  const StageNeeds needs(model, request.kv_tokens);
  const int layer_count = needs.count();

  std::vector<size_t> candidates;  // nodes that can hold at least one layer, in id order
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (holds_a_layer(nodes[i], needs)) candidates.push_back(i);
  }

  const Fetches fetches(nodes, model);
  const auto fetch = [&](size_t node, int first, int last) {
    return static_cast<double>(fetches.bytes(node, first, last));
  };
  std::optional<Split> split;
  std::string kept;  // why a slower placement that keeps more weights won, if one did
  if (!candidates.empty() && request.strategy == Strategy::Speed) {
    // Time per token of one stream: each stage reads its weights at its node's speed, and
    // every stage after the first waits one hop. Equal times go to the fewest bytes to fetch,
    // then to the faster slowest stage.
    const auto seconds = [&](size_t node, int first, int last) {
      return stage_seconds(nodes[node], needs, first, last) + (first > 0 ? request.hop_seconds : 0.0);
    };
    split = best_split_over_orders(
        candidates, nodes, needs,
        [&](size_t node, int first, int last) {
          return Score{seconds(node, first, last), fetch(node, first, last), stage_seconds(nodes[node], needs, first, last)};
        },
        [](size_t) { return Score{}; });
    // The fewest bytes to fetch, then the fastest: taken when it is nearly as fast. (Moving
    // the weights costs minutes; a few percent per token is what measured speeds vary by.)
    if (split && fetches.any() && split->score.then > 0) {
      std::optional<Split> keeping = best_split_over_orders(
          candidates, nodes, needs,
          [&](size_t node, int first, int last) {
            return Score{fetch(node, first, last), seconds(node, first, last), stage_seconds(nodes[node], needs, first, last)};
          },
          [](size_t) { return Score{}; });
      if (keeping && less(keeping->score.total, split->score.then) &&
          keeping->score.then <= split->score.total * (1.0 + request.keep_tolerance)) {
        char text[160];
        std::snprintf(text, sizeof text, "; it keeps the weights nodes hold: %s to fetch instead of %s, %.1f%% slower",
                      units::describe_bytes(static_cast<uint64_t>(keeping->score.total)).c_str(),
                      units::describe_bytes(static_cast<uint64_t>(split->score.then)).c_str(),
                      100.0 * (keeping->score.then / split->score.total - 1.0));
        kept = text;
        split = std::move(keeping);
      }
    }
  } else if (!candidates.empty()) {
    // Repair of the proportional counts: the split that obeys the memory rule with the least
    // total deviation from them (then the least deviation of any one node). Leaving a node
    // out costs more than any deviation, so every node takes part when a split with all fits.
    const std::vector<int> target = memory_weighted_counts(candidates, nodes, layer_count);
    const double leave_out_penalty = 2.0 * layer_count + 1.0;
    split = best_split_over_orders(
        candidates, nodes, needs,
        [&](size_t node, int first, int last) {
          const double deviation = std::abs(last - first - target[node]);
          return Score{deviation, fetch(node, first, last), deviation};
        },
        [&](size_t) { return Score{leave_out_penalty, 0.0, 0.0}; });
  }

  if (!split) throw_does_not_fit(nodes, needs);

  Placement placement;
  placement.predicted_seconds_per_token = predicted_seconds(split->stages, nodes, needs, request.hop_seconds);
  for (const PlannedStage& s : split->stages) {
    placement.stages.push_back({nodes[s.node].id, s.first, s.last});
    placement.fetch_bytes += fetches.bytes(s.node, s.first, s.last);
  }
  placement.reason = explain(*split, nodes, needs, fetches, request, placement.predicted_seconds_per_token, kept);
  return placement;
}

}  // namespace strata::cluster
