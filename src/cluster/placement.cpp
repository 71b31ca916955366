#include "cluster/placement.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>
#include <string_view>

#include "model/config.h"
#include "model/kv_pool.h"
#include "units/byte_size.h"

namespace strata::cluster {
namespace {

constexpr uint64_t kMaxBytes = std::numeric_limits<uint64_t>::max();

// Sums of memory saturate: a stage whose need overflows simply does not fit anywhere.
uint64_t saturating_add(uint64_t a, uint64_t b) { return a > kMaxBytes - b ? kMaxBytes : a + b; }
uint64_t saturating_mul(uint64_t a, uint64_t b) { return b != 0 && a > kMaxBytes / b ? kMaxBytes : a * b; }

std::vector<uint64_t> prefix_sums(const std::vector<uint64_t>& values) {
  std::vector<uint64_t> prefix{0};
  for (uint64_t value : values) prefix.push_back(saturating_add(prefix.back(), value));
  return prefix;
}

// The footprint with prefix sums, so that any stage's needs cost O(1).
class Layers {
 public:
  Layers(const ModelFootprint& model, uint64_t kv_tokens)
      : model_(model), kv_per_layer_(saturating_mul(kv_tokens, model.kv_bytes_per_layer_per_token)) {
    if (model.layer_count < 1) throw std::invalid_argument("the model has no layers to place");
    const auto check_count = [&](const std::vector<uint64_t>& sizes, const char* what) {
      if (sizes.size() != static_cast<size_t>(model.layer_count)) {
        throw std::invalid_argument("the footprint lists " + std::to_string(sizes.size()) + " " + what + " for " +
                                    std::to_string(model.layer_count) + " layers");
      }
    };
    check_count(model.layer_weight_bytes, "layer sizes");
    held_prefix_ = prefix_sums(model.layer_weight_bytes);
    if (model.layer_read_bytes.empty()) {
      read_prefix_ = held_prefix_;
    } else {
      check_count(model.layer_read_bytes, "sizes read per token");
      for (size_t layer = 0; layer < model.layer_read_bytes.size(); ++layer) {
        if (model.layer_read_bytes[layer] > model.layer_weight_bytes[layer]) {
          throw std::invalid_argument("layer " + std::to_string(layer) + " reads " +
                                      std::to_string(model.layer_read_bytes[layer]) + " bytes per token of the " +
                                      std::to_string(model.layer_weight_bytes[layer]) + " it holds");
        }
      }
      read_prefix_ = prefix_sums(model.layer_read_bytes);
    }
    smallest_layer_ = *std::min_element(model.layer_weight_bytes.begin(), model.layer_weight_bytes.end());
  }

  int count() const { return model_.layer_count; }

  // Weights a stage holds apart from the embedding: every byte of its layers, and the head on
  // the last stage.
  uint64_t held_bytes(int first, int last) const { return with_head(held_prefix_, first, last); }

  // Weights a stage reads for every token: its layers' (of experts only those a token runs), and
  // the head on the last stage. The embedding is not read whole: a token reads one row of it.
  uint64_t read_bytes(int first, int last) const { return with_head(read_prefix_, first, last); }

  // Every weight the model's stages hold together.
  uint64_t weight_bytes() const { return saturating_add(held_bytes(0, count()), model_.embedding_bytes); }

  // The KV `node` keeps per layer it runs, when it has no pool of a fixed size.
  uint64_t kv_per_layer(const NodeCapacity& node) const {
    return node.kv_bytes_per_layer > 0 ? node.kv_bytes_per_layer : kv_per_layer_;
  }
  // The request's share, for a node that does not say its own.
  uint64_t default_kv_per_layer() const { return kv_per_layer_; }

  // The KV a stage of `layer_count` layers on `node` keeps.
  uint64_t kv_bytes(const NodeCapacity& node, int layer_count) const {
    return node.kv_pool_bytes > 0 ? node.kv_pool_bytes : saturating_mul(kv_per_layer(node), static_cast<uint64_t>(layer_count));
  }

  // What the memory rule counts for a stage on `node`.
  uint64_t memory_bytes(const NodeCapacity& node, int first, int last) const {
    uint64_t need = saturating_add(held_bytes(first, last), kv_bytes(node, last - first));
    if (first == 0) need = saturating_add(need, model_.embedding_bytes);
    return need;
  }

  // The least `node` must hold to take part at all: one layer (the smallest) and its KV.
  uint64_t smallest_stage_bytes(const NodeCapacity& node) const {
    return saturating_add(smallest_layer_, kv_bytes(node, 1));
  }

 private:
  uint64_t with_head(const std::vector<uint64_t>& prefix, int first, int last) const {
    const uint64_t layers = prefix[static_cast<size_t>(last)] - prefix[static_cast<size_t>(first)];
    return last == count() ? saturating_add(layers, model_.head_bytes) : layers;
  }

  const ModelFootprint& model_;
  uint64_t kv_per_layer_;
  uint64_t smallest_layer_;
  std::vector<uint64_t> held_prefix_;  // held_prefix_[i]: bytes of layers [0, i)
  std::vector<uint64_t> read_prefix_;  // read_prefix_[i]: bytes of layers [0, i) a token reads
};

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
  }
  return sorted;
}

// A token's time on a stage: the weights it reads there, at the node's measured speed. Of a
// Mixture-of-Experts layer that is the experts it runs, not all the node holds.
double stage_seconds(const NodeCapacity& node, const Layers& layers, int first, int last) {
  return static_cast<double>(layers.read_bytes(first, last)) / node.weight_bytes_per_second;
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
                                const Layers& layers, const StageScore& stage_score,
                                const SkipScore& skip_score) {
  const int layer_count = layers.count();
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
        if (layers.memory_bytes(nodes[node], k, e) > memory) {
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
// nodes and 200 layers.
template <typename StageScore, typename SkipScore>
std::optional<Split> best_split_over_orders(const std::vector<size_t>& candidates,
                                            const std::vector<NodeCapacity>& nodes, const Layers& layers,
                                            const StageScore& stage_score, const SkipScore& skip_score) {
  std::optional<Split> best;
  auto consider = [&](const std::vector<size_t>& order) {
    std::optional<Split> split = best_split(order, nodes, layers, stage_score, skip_score);
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
                         const Layers& layers, double hop_seconds) {
  double seconds = hop_seconds * static_cast<double>(stages.size() - 1);
  for (const PlannedStage& s : stages) seconds += stage_seconds(nodes[s.node], layers, s.first, s.last);
  return seconds;
}

bool holds_a_layer(const NodeCapacity& node, const Layers& layers) {
  return node.memory_bytes >= layers.smallest_stage_bytes(node);
}

std::string too_small(const NodeCapacity& node, const Layers& layers) {
  return "too small for one layer and its KV (needs " + units::describe_bytes(layers.smallest_stage_bytes(node)) + ")";
}

[[noreturn]] void throw_does_not_fit(const std::vector<NodeCapacity>& nodes, const Layers& layers) {
  // Nodes with a KV pool of their own (--kv-memory) keep it whatever their layers: it leaves
  // their memory. The others keep KV per layer, each as it sizes its pool: the reserve counts
  // every layer at the largest such share, an upper bound when the nodes differ.
  uint64_t usable = 0, pools = 0, per_layer = 0;
  bool reserve = false, any = false, differ = false;
  for (const NodeCapacity& node : nodes) {
    if (!holds_a_layer(node, layers)) continue;
    any = true;
    usable = saturating_add(usable, node.memory_bytes - std::min(node.memory_bytes, node.kv_pool_bytes));
    pools = saturating_add(pools, node.kv_pool_bytes);
    if (node.kv_pool_bytes > 0) continue;
    differ = differ || (reserve && layers.kv_per_layer(node) != per_layer);
    per_layer = std::max(per_layer, layers.kv_per_layer(node));
    reserve = true;
  }
  if (!any) {  // no node holds a layer: what the model needs on nodes as the request sizes them
    reserve = true;
    per_layer = layers.default_kv_per_layer();
  }
  const uint64_t kv = saturating_mul(per_layer, static_cast<uint64_t>(layers.count()));
  const uint64_t needed = saturating_add(layers.weight_bytes(), reserve ? kv : 0);
  std::string message = "the model needs " + units::describe_bytes(needed) +
                        (reserve ? " with a KV reserve of " + units::describe_bytes(kv) + " (" +
                                       units::describe_bytes(per_layer) + " per layer" +
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
    if (!holds_a_layer(node, layers)) {
      message += "; node '" + node.id + "' (" + units::describe_bytes(node.memory_bytes) + ") is " + too_small(node, layers);
    }
  }
  throw DoesNotFit(message, missing);
}

// The placement's reason: the strategy and prediction, then a line per node.
std::string explain(const Split& split, const std::vector<NodeCapacity>& nodes, const Layers& layers,
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
              ", " + units::describe_bytes(layers.memory_bytes(nodes[s.node], s.first, s.last)) + " of " + units::describe_bytes(nodes[s.node].memory_bytes) +
              " usable, " + milliseconds(stage_seconds(nodes[s.node], layers, s.first, s.last)) + " per token";
    if (const uint64_t fetch = fetches.bytes(s.node, s.first, s.last); fetch > 0) {
      reason += ", " + units::describe_bytes(fetch) + " to fetch from peers";
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (used.contains(i)) continue;
    reason += "\n  " + nodes[i].id + " (" + units::describe_bytes(nodes[i].memory_bytes) + "): left out, ";
    if (!holds_a_layer(nodes[i], layers)) {
      reason += too_small(nodes[i], layers);
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

TensorRole role_of_tensor(std::string_view name, int layer_count, int skipped_layer_count) {
  if (name == "token_embd.weight") return {TensorRole::Embedding};
  if (name == "output.weight") return {TensorRole::OutputMatrix};
  if (name == "output_norm.weight") return {TensorRole::OutputNorm};
  if (!name.starts_with("blk.")) return {TensorRole::Shared};
  int layer = -1;
  const auto [end, error] = std::from_chars(name.data() + 4, name.data() + name.size(), layer);
  if (error != std::errc{} || end == name.data() + name.size() || *end != '.' || layer < 0 ||
      layer >= layer_count + skipped_layer_count) {
    const std::string skipped = skipped_layer_count > 0 ? " and " + std::to_string(skipped_layer_count) + " skipped" : "";
    throw std::runtime_error("tensor '" + std::string(name) + "' names no layer of the model's " +
                             std::to_string(layer_count) + skipped);
  }
  if (layer >= layer_count) return {TensorRole::Unused, layer};
  // llama.cpp names a layer's tensors of experts "<part>_exps.weight" (and ".bias"); a shared
  // expert ("_shexp") is read by every token, as the router ("ffn_gate_inp") is.
  const std::string_view part = name.substr(static_cast<size_t>(end - name.data()) + 1);
  return {TensorRole::Layer, layer, part.substr(0, part.find('.')).ends_with("_exps")};
}

ModelFootprint footprint_of(const gguf::File& file) {
  const model::Config config = model::Config::from_gguf(file);
  ModelFootprint footprint;
  footprint.layer_count = config.layer_count;
  footprint.layer_weight_bytes.assign(static_cast<size_t>(config.layer_count), 0);
  footprint.layer_read_bytes.assign(static_cast<size_t>(config.layer_count), 0);
  // As the KV pool lays a position out (latent attention keeps one latent row and no values).
  const model::KvLayout one_layer(config, 1, model::KvType::F32);
  footprint.kv_bytes_per_layer_per_token =
      (one_layer.key_row_elements() + one_layer.value_row_elements()) * one_layer.element_bytes;
  // What a token reads of a tensor of experts: the experts it runs, each of the same size.
  const auto read_of_experts = [&](const gguf::TensorInfo& t) {
    if (!config.has_experts()) {
      throw std::runtime_error("tensor '" + t.name + "' holds experts, but the model's metadata counts none");
    }
    if (t.dims.empty() || t.dims.back() != static_cast<uint64_t>(config.expert_count)) {
      throw std::runtime_error("tensor '" + t.name + "' holds experts, but its last dimension is not the model's " +
                               std::to_string(config.expert_count) + " experts");
    }
    return config.expert_bytes_read(t.size_bytes);
  };
  // The reader sized every tensor from its dtype's block layout. Tensors outside the layers,
  // embedding and head (rope_freqs) are a few kilobytes and ignored.
  const gguf::TensorInfo* output = nullptr;
  const gguf::TensorInfo* embedding = nullptr;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const TensorRole role = role_of_tensor(t.name, config.layer_count, config.skipped_layer_count);
    switch (role.kind) {
      case TensorRole::Layer:
        footprint.layer_weight_bytes[static_cast<size_t>(role.layer)] += t.size_bytes;
        footprint.layer_read_bytes[static_cast<size_t>(role.layer)] += role.experts ? read_of_experts(t) : t.size_bytes;
        break;
      case TensorRole::Embedding: embedding = &t; break;
      case TensorRole::OutputMatrix: output = &t; break;
      case TensorRole::OutputNorm: footprint.head_bytes += t.size_bytes; break;
      case TensorRole::Shared:
      case TensorRole::Unused: break;
    }
  }
  if (embedding == nullptr) throw std::runtime_error("model lacks tensor 'token_embd.weight'");
  footprint.embedding_bytes = embedding->size_bytes;
  // A tied head reads token_embd as its output matrix: the last stage holds it too.
  footprint.head_bytes += (output != nullptr ? output : embedding)->size_bytes;
  for (int layer = 0; layer < config.layer_count; ++layer) {
    if (footprint.layer_weight_bytes[static_cast<size_t>(layer)] == 0) {
      throw std::runtime_error("model lacks the tensors of layer " + std::to_string(layer));
    }
  }
  return footprint;
}

Placement place_layers(std::span<const NodeCapacity> input_nodes, const ModelFootprint& model,
                       const PlacementRequest& request) {
  check_request(request);
  const std::vector<NodeCapacity> nodes = sorted_nodes(input_nodes);
  const Layers layers(model, request.kv_tokens);
  const int layer_count = layers.count();

  std::vector<size_t> candidates;  // nodes that can hold at least one layer, in id order
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (holds_a_layer(nodes[i], layers)) candidates.push_back(i);
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
      return stage_seconds(nodes[node], layers, first, last) + (first > 0 ? request.hop_seconds : 0.0);
    };
    split = best_split_over_orders(
        candidates, nodes, layers,
        [&](size_t node, int first, int last) {
          return Score{seconds(node, first, last), fetch(node, first, last), stage_seconds(nodes[node], layers, first, last)};
        },
        [](size_t) { return Score{}; });
    // The fewest bytes to fetch, then the fastest: taken when it is nearly as fast. (Moving
    // the weights costs minutes; a few percent per token is what measured speeds vary by.)
    if (split && fetches.any() && split->score.then > 0) {
      std::optional<Split> keeping = best_split_over_orders(
          candidates, nodes, layers,
          [&](size_t node, int first, int last) {
            return Score{fetch(node, first, last), seconds(node, first, last), stage_seconds(nodes[node], layers, first, last)};
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
        candidates, nodes, layers,
        [&](size_t node, int first, int last) {
          const double deviation = std::abs(last - first - target[node]);
          return Score{deviation, fetch(node, first, last), deviation};
        },
        [&](size_t) { return Score{leave_out_penalty, 0.0, 0.0}; });
  }

  if (!split) throw_does_not_fit(nodes, layers);

  Placement placement;
  placement.predicted_seconds_per_token = predicted_seconds(split->stages, nodes, layers, request.hop_seconds);
  for (const PlannedStage& s : split->stages) {
    placement.stages.push_back({nodes[s.node].id, s.first, s.last});
    placement.fetch_bytes += fetches.bytes(s.node, s.first, s.last);
  }
  placement.reason = explain(*split, nodes, layers, fetches, request, placement.predicted_seconds_per_token, kept);
  return placement;
}

void check_placement(const Placement& placement, std::span<const NodeCapacity> nodes,
                     const ModelFootprint& model, uint64_t kv_tokens) {
  const Layers layers(model, kv_tokens);
  if (placement.stages.empty()) throw std::invalid_argument("the placement has no stages");
  std::set<std::string> seen;
  int expected_first = 0;
  for (const Stage& stage : placement.stages) {
    const std::string name = "stage on node '" + stage.node_id + "' (layers [" + std::to_string(stage.first_layer) +
                             ", " + std::to_string(stage.last_layer) + "))";
    if (stage.first_layer != expected_first) {
      throw std::invalid_argument(name + " should start at layer " + std::to_string(expected_first) +
                                  (stage.first_layer > expected_first ? ": layers are left out" : ": layers overlap"));
    }
    if (stage.last_layer <= stage.first_layer) throw std::invalid_argument(name + " holds no layers");
    if (stage.last_layer > layers.count()) {
      throw std::invalid_argument(name + " goes past the model's " + std::to_string(layers.count()) + " layers");
    }
    const auto node = std::find_if(nodes.begin(), nodes.end(), [&](const auto& n) { return n.id == stage.node_id; });
    if (node == nodes.end()) throw std::invalid_argument(name + ": no such node");
    if (!seen.insert(stage.node_id).second) throw std::invalid_argument(name + ": the node already has a stage");
    const uint64_t need = layers.memory_bytes(*node, stage.first_layer, stage.last_layer);
    if (need > node->memory_bytes) {
      throw std::invalid_argument(name + " needs " + units::describe_bytes(need) + " but the node has " +
                                  units::describe_bytes(node->memory_bytes) + " usable");
    }
    expected_first = stage.last_layer;
  }
  if (expected_first != layers.count()) {
    throw std::invalid_argument("the stages end at layer " + std::to_string(expected_first) + " of " +
                                std::to_string(layers.count()) + ": layers are left out");
  }
}

std::optional<Placement> repair_placement(const Placement& current, std::span<const std::string> members,
                                          std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                                          uint64_t kv_tokens) {
  Placement repaired;
  std::optional<int> orphaned_from;  // first layer of gone stages at the front
  for (const Stage& s : current.stages) {
    if (std::find(members.begin(), members.end(), s.node_id) == members.end()) {
      if (!repaired.stages.empty()) {
        repaired.stages.back().last_layer = s.last_layer;
      } else if (!orphaned_from) {
        orphaned_from = s.first_layer;
      }
      continue;
    }
    repaired.stages.push_back({s.node_id, orphaned_from.value_or(s.first_layer), s.last_layer});
    orphaned_from.reset();
  }
  if (repaired.stages.empty()) return std::nullopt;
  try {
    check_placement(repaired, nodes, model, kv_tokens);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  repaired.reason = "repaired: the nodes left keep their layers, and those of the nodes gone go to their neighbours "
                    "in the pipeline (a placement from scratch follows the next change of members)";
  return repaired;
}

}  // namespace strata::cluster
