// The placement's promises, checked against computations made here, apart from its code: the
// memory rule, contiguity, fewest and fastest stages, order independence, and the true optimum
// of the speed strategy found by enumerating every pipeline of small clusters.
#include "cluster/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>

#include "gguf_variant.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "units/byte_size.h"

namespace strata::cluster {
namespace {

constexpr uint64_t kGB = 1'000'000'000;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

ModelFootprint uniform_model(int layers, uint64_t layer_bytes, uint64_t embedding_bytes, uint64_t head_bytes,
                             uint64_t kv_bytes_per_layer_per_token) {
  return {layers, std::vector<uint64_t>(static_cast<size_t>(layers), layer_bytes), embedding_bytes, head_bytes,
          kv_bytes_per_layer_per_token};
}

// A 70B model in Q4_K_M: 80 layers of 490 MB, embedding and head of 0.5 GB each, kv_dim 1024.
const ModelFootprint k70B = uniform_model(80, 490'000'000, 500'000'000, 500'000'000, 2 * 1024 * sizeof(float));
constexpr uint64_t kContext4096 = 4096;

// The memory rule, written out again; a node's fixed KV pool replaces the per-layer reserve,
// and its own per-layer share replaces the request's.
uint64_t stage_need(const ModelFootprint& m, uint64_t kv_tokens, int first, int last, uint64_t kv_pool_bytes = 0,
                    uint64_t kv_bytes_per_layer = 0) {
  const uint64_t per_layer = kv_bytes_per_layer > 0 ? kv_bytes_per_layer : kv_tokens * m.kv_bytes_per_layer_per_token;
  uint64_t need = kv_pool_bytes;
  for (int layer = first; layer < last; ++layer) {
    need += m.layer_weight_bytes[static_cast<size_t>(layer)] + (kv_pool_bytes > 0 ? 0 : per_layer);
  }
  if (first == 0) need += m.embedding_bytes;
  if (last == m.layer_count) need += m.head_bytes;
  return need;
}

const NodeCapacity& node_named(const std::vector<NodeCapacity>& nodes, const std::string& id) {
  return *std::find_if(nodes.begin(), nodes.end(), [&](const auto& n) { return n.id == id; });
}

// Contiguous, complete, each node once, memory rule: checked here without check_placement.
void expect_valid(const Placement& p, const std::vector<NodeCapacity>& nodes, const ModelFootprint& m,
                  uint64_t kv_tokens) {
  ASSERT_FALSE(p.stages.empty());
  EXPECT_EQ(p.epoch, 0u);
  int next = 0;
  std::map<std::string, int> uses;
  for (const Stage& s : p.stages) {
    EXPECT_EQ(s.first_layer, next);
    EXPECT_LT(s.first_layer, s.last_layer);
    const NodeCapacity& node = node_named(nodes, s.node_id);
    EXPECT_LE(stage_need(m, kv_tokens, s.first_layer, s.last_layer, node.kv_pool_bytes, node.kv_bytes_per_layer),
              node.memory_bytes)
        << s.node_id;
    EXPECT_EQ(++uses[s.node_id], 1) << s.node_id;
    next = s.last_layer;
  }
  EXPECT_EQ(next, m.layer_count);
  EXPECT_NO_THROW(check_placement(p, nodes, m, kv_tokens));
}

std::map<std::string, int> layers_per_node(const Placement& p) {
  std::map<std::string, int> counts;
  for (const Stage& s : p.stages) counts[s.node_id] = s.last_layer - s.first_layer;
  return counts;
}

// What a token reads of a layer: all of it, unless the footprint says less (experts).
uint64_t layer_read(const ModelFootprint& m, int layer) {
  return m.layer_read_bytes.empty() ? m.layer_weight_bytes[static_cast<size_t>(layer)]
                                    : m.layer_read_bytes[static_cast<size_t>(layer)];
}

// What a token reads on a stage: its layers' share, and the head on the last.
uint64_t stage_read(const ModelFootprint& m, const Stage& s) {
  uint64_t bytes = 0;
  for (int layer = s.first_layer; layer < s.last_layer; ++layer) bytes += layer_read(m, layer);
  return s.last_layer == m.layer_count ? bytes + m.head_bytes : bytes;
}

// Predicted time of a pipeline, from the definition: the bytes a token reads on each stage at
// its node's speed, and a hop per hand-over.
double pipeline_seconds(const std::vector<Stage>& stages, const std::vector<NodeCapacity>& nodes,
                        const ModelFootprint& m, double hop_seconds) {
  double seconds = hop_seconds * static_cast<double>(stages.size() - 1);
  for (const Stage& s : stages) {
    seconds += static_cast<double>(stage_read(m, s)) / node_named(nodes, s.node_id).weight_bytes_per_second;
  }
  return seconds;
}

std::vector<NodeCapacity> seed_cluster() {
  return {{"a", 16 * kGB, 20e9}, {"b", 16 * kGB, 20e9}, {"c", 32 * kGB, 20e9}, {"d", 32 * kGB, 20e9}};
}

TEST(Placement, EqualNodesSplitEvenlyInBothStrategies) {
  // Each node holds at most 12 of the 30 layers: every strategy needs all three.
  const ModelFootprint m = uniform_model(30, 100 * kMiB, 10 * kMiB, 10 * kMiB, 1024);
  const std::vector<NodeCapacity> nodes = {{"x", 1300 * kMiB, 10e9}, {"y", 1300 * kMiB, 10e9}, {"z", 1300 * kMiB, 10e9}};
  for (Strategy strategy : {Strategy::Memory, Strategy::Speed}) {
    const Placement p = place_layers(nodes, m, {1000, strategy});
    expect_valid(p, nodes, m, 1000);
    ASSERT_EQ(p.stages.size(), 3u);
    for (const auto& [id, count] : layers_per_node(p)) {
      EXPECT_GE(count, 9) << id;
      EXPECT_LE(count, 11) << id;
    }
  }
}

TEST(Placement, SeedClusterMemoryStrategyIsMemoryWeighted) {
  const auto nodes = seed_cluster();
  const Placement p = place_layers(nodes, k70B, {kContext4096, Strategy::Memory});
  expect_valid(p, nodes, k70B, kContext4096);
  auto counts = layers_per_node(p);
  ASSERT_EQ(counts.size(), 4u);
  // 80 layers over 16:16:32:32 is 13.3 : 13.3 : 26.7 : 26.7.
  for (const char* small : {"a", "b"}) {
    EXPECT_GE(counts[small], 13);
    EXPECT_LE(counts[small], 14);
  }
  for (const char* big : {"c", "d"}) {
    EXPECT_GE(counts[big], 26);
    EXPECT_LE(counts[big], 27);
  }
  EXPECT_NEAR(p.predicted_seconds_per_token, pipeline_seconds(p.stages, nodes, k70B, kDefaultHopSeconds), 1e-12);
}

TEST(Placement, MemoryStrategyMovesLayersOnlyAsFarAsTheMemoryRuleNeeds) {
  // Proportionally 5 and 5 layers, but whichever node is first also holds the 150 B embedding:
  // with 600 B it takes at most 4 layers, and the other takes 6.
  const ModelFootprint m = uniform_model(10, 100, 150, 0, 0);
  const std::vector<NodeCapacity> nodes = {{"a", 600, 1e9}, {"b", 600, 1e9}};
  const Placement p = place_layers(nodes, m, {0, Strategy::Memory});
  expect_valid(p, nodes, m, 0);
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].last_layer, 4);
}

TEST(Placement, SeedClusterSpeedStrategyUsesFewestStagesThatFit) {
  const auto nodes = seed_cluster();
  const uint64_t total = stage_need(k70B, kContext4096, 0, 80);
  ASSERT_GT(total, 32 * kGB) << "no node holds the model alone";
  const Placement p = place_layers(nodes, k70B, {kContext4096, Strategy::Speed});
  expect_valid(p, nodes, k70B, kContext4096);
  // Equal speeds stream the same bytes whatever the split, so only hops differ: two stages.
  ASSERT_EQ(p.stages.size(), 2u);
  // Among two-stage splits the tie goes to the lowest slowest stage: the two big nodes, the
  // head (about one layer) on the one with fewer layers.
  auto counts = layers_per_node(p);
  EXPECT_EQ(counts.count("c") + counts.count("d"), 2u);
  auto slowest_stage_bytes = [&](int split) {
    return std::max(split * k70B.layer_weight_bytes[0], (80 - split) * k70B.layer_weight_bytes[0] + k70B.head_bytes);
  };
  uint64_t best_slowest = std::numeric_limits<uint64_t>::max();
  for (int split = 1; split < 80; ++split) {
    if (stage_need(k70B, kContext4096, 0, split) <= 32 * kGB && stage_need(k70B, kContext4096, split, 80) <= 32 * kGB) {
      best_slowest = std::min(best_slowest, slowest_stage_bytes(split));
    }
  }
  EXPECT_EQ(slowest_stage_bytes(p.stages[0].last_layer), best_slowest);
  EXPECT_NEAR(p.predicted_seconds_per_token, pipeline_seconds(p.stages, nodes, k70B, kDefaultHopSeconds), 1e-12);
  EXPECT_NE(p.reason.find("not needed"), std::string::npos) << p.reason;
}

TEST(Placement, SpeedPutsMoreLayersOnTheFastNode) {
  const std::vector<NodeCapacity> nodes = {{"fast", 32 * kGB, 40e9}, {"slow", 32 * kGB, 10e9}};
  const Placement p = place_layers(nodes, k70B, {kContext4096, Strategy::Speed});
  expect_valid(p, nodes, k70B, kContext4096);
  auto counts = layers_per_node(p);
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_GT(counts["fast"], counts["slow"]);
  // The fast node is full: one more layer on it would break the memory rule.
  const Stage& fast = p.stages[0].node_id == "fast" ? p.stages[0] : p.stages[1];
  const Stage grown = fast.first_layer == 0 ? Stage{"fast", 0, fast.last_layer + 1}
                                            : Stage{"fast", fast.first_layer - 1, 80};
  EXPECT_GT(stage_need(k70B, kContext4096, grown.first_layer, grown.last_layer), 32 * kGB);
}

// A node started with --kv-memory keeps a pool of that size whatever its layers: the placement
// counts it instead of the per-layer reserve, both where it is larger and where it is smaller.
TEST(Placement, ANodesFixedKvPoolReplacesThePerLayerReserve) {
  const ModelFootprint m = uniform_model(8, 1'000, 100, 100, 1);
  const uint64_t kv_tokens = 100;  // per-layer reserve: 100 B, so 1 100 B a layer
  // Without a fixed pool, "a" holds every layer: 8 × 1 100 + 200 = 9 000 B; "b" at most 4.
  const std::vector<NodeCapacity> plain = {{"a", 9'000, 40e9}, {"b", 5'000, 10e9}};
  EXPECT_EQ(place_layers(plain, m, {kv_tokens, Strategy::Speed}).stages.size(), 1u);
  // A 4 000 B pool on "a" leaves room for 4 layers and the embedding (4 × 1 000 + 100 + 4 000).
  std::vector<NodeCapacity> big_pool = plain;
  big_pool[0].kv_pool_bytes = 4'000;
  const Placement split = place_layers(big_pool, m, {kv_tokens, Strategy::Speed});
  expect_valid(split, big_pool, m, kv_tokens);
  EXPECT_EQ(layers_per_node(split), (std::map<std::string, int>{{"a", 4}, {"b", 4}})) << split.reason;
  EXPECT_THROW(check_placement(place_layers(plain, m, {kv_tokens, Strategy::Speed}), big_pool, m, kv_tokens),
               std::invalid_argument);
  // A pool smaller than the reserve lets a node too small for a layer, its reserve and the
  // embedding (1 200 B) take part: 1 000 + 100 + 40 B.
  const std::vector<NodeCapacity> small = {{"a", 1'150, 40e9}, {"b", 100'000, 10e9}};
  EXPECT_EQ(layers_per_node(place_layers(small, m, {kv_tokens, Strategy::Memory})).count("a"), 0u);
  std::vector<NodeCapacity> small_pool = small;
  small_pool[0].kv_pool_bytes = 40;
  const Placement with_a = place_layers(small_pool, m, {kv_tokens, Strategy::Memory});
  expect_valid(with_a, small_pool, m, kv_tokens);
  EXPECT_EQ(layers_per_node(with_a).count("a"), 1u) << with_a.reason;
  // Where every node keeps a pool of its own, the model needs its weights (8 200 B) in what the
  // pools leave: 2 × (5 000 − 1 000) = 8 000 B, 200 B missing.
  const std::vector<NodeCapacity> pooled = {{"a", 5'000, 40e9, {}, 1'000}, {"b", 5'000, 10e9, {}, 1'000}};
  try {
    place_layers(pooled, m, {kv_tokens, Strategy::Memory});
    ADD_FAILURE() << "placed";
  } catch (const DoesNotFit& e) {
    EXPECT_EQ(e.missing_bytes(), 200u) << e.what();
    EXPECT_NE(std::string(e.what()).find("KV pools of 2.0 KiB"), std::string::npos) << e.what();
  }
}

// A node started with a larger --ctx-size × --parallel (or f32 keys and values) than the
// leader's keeps more KV per layer: the placement counts its own share.
TEST(Placement, ANodesOwnKvShareReplacesTheRequestsPerLayer) {
  const ModelFootprint m = uniform_model(8, 1'000, 100, 100, 1);
  const uint64_t kv_tokens = 100;  // the request's share: 100 B a layer
  std::vector<NodeCapacity> nodes = {{"a", 9'000, 40e9}, {"b", 5'000, 10e9}};
  EXPECT_EQ(layers_per_node(place_layers(nodes, m, {kv_tokens, Strategy::Speed})), (std::map<std::string, int>{{"a", 8}}));
  nodes[0].kv_bytes_per_layer = 600;  // 1 600 B a layer on "a": 5 fit beside the head
  const Placement p = place_layers(nodes, m, {kv_tokens, Strategy::Speed});
  expect_valid(p, nodes, m, kv_tokens);
  EXPECT_EQ(layers_per_node(p), (std::map<std::string, int>{{"a", 5}, {"b", 3}})) << p.reason;
  nodes[1].kv_bytes_per_layer = 2'000;  // 3 000 B a layer on "b": 1 fits; "a" cannot take 7
  try {
    place_layers(nodes, m, {kv_tokens, Strategy::Speed});
    ADD_FAILURE() << "placed";
  } catch (const DoesNotFit& e) {
    EXPECT_NE(std::string(e.what()).find("2.0 KiB per layer, at most"), std::string::npos) << e.what();
  }
}

// A sliding-window layer keeps its sequences' windows, not the whole context: the memory rule
// counts it at the window's share (the footprint's, or the node's own), the others at kv_tokens.
TEST(Placement, ASlidingWindowLayerReservesItsWindowNotTheWholeContext) {
  ModelFootprint m = uniform_model(6, 1'000, 100, 100, 1);
  m.sliding_layers = {true, true, true, true, true, false};  // Gemma 3's five local to one global
  m.window_kv_tokens = 100;
  const uint64_t kv_tokens = 1'000;
  // 6 000 B of layers, 200 of embedding and head, and KV of 1 000 for the global layer and
  // 100 for each local one: 7 700 B. Every layer at the whole context would need 12 200.
  std::vector<NodeCapacity> nodes = {{"a", 7'700, 40e9}};
  const Placement whole = place_layers(nodes, m, {kv_tokens, Strategy::Speed});
  EXPECT_EQ(layers_per_node(whole), (std::map<std::string, int>{{"a", 6}})) << whole.reason;
  nodes[0].memory_bytes = 7'699;
  EXPECT_THROW(place_layers(nodes, m, {kv_tokens, Strategy::Speed}), DoesNotFit);
  ModelFootprint without_windows = m;
  without_windows.sliding_layers.clear();
  nodes[0].memory_bytes = 12'199;
  EXPECT_THROW(place_layers(nodes, without_windows, {kv_tokens, Strategy::Speed}), DoesNotFit);

  // A node that keeps more windows (its own --parallel) says so: 500 B a local layer.
  nodes = {{"a", 9'000, 40e9}, {"b", 9'000, 10e9}};
  nodes[0].kv_bytes_per_window_layer = 500;
  const Placement shared = place_layers(nodes, m, {kv_tokens, Strategy::Memory});
  for (const Stage& stage : shared.stages) {
    const NodeCapacity& node = node_named(nodes, stage.node_id);
    uint64_t need = stage.first_layer == 0 ? 100 : 0;
    need += stage.last_layer == 6 ? 100 : 0;
    for (int layer = stage.first_layer; layer < stage.last_layer; ++layer) {
      need += 1'000 + (layer == 5 ? 1'000 : node.id == "a" ? 500 : 100);
    }
    EXPECT_LE(need, node.memory_bytes) << stage.node_id << ": " << shared.reason;
  }
  // On "a" alone: 6 000 + 200 + 1 000 + 5 × 500 = 9 700 B.
  const Placement on_a{0, {{"a", 0, 6}}};
  EXPECT_THROW(check_placement(on_a, nodes, m, kv_tokens), std::invalid_argument);
  nodes[0].memory_bytes = 9'700;
  EXPECT_NO_THROW(check_placement(on_a, nodes, m, kv_tokens));
  nodes = {{"a", 5'000, 40e9}};
  try {
    place_layers(nodes, m, {kv_tokens, Strategy::Speed});
    ADD_FAILURE() << "placed";
  } catch (const DoesNotFit& e) {
    EXPECT_NE(std::string(e.what()).find("with a KV reserve of 1.5 KiB"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("per sliding-window layer"), std::string::npos) << e.what();
  }
}

TEST(Placement, SlowNodeStaysOutWhenTheFastOneHoldsEverything) {
  const ModelFootprint small = uniform_model(32, 200'000'000, 250'000'000, 250'000'000, 8192);
  const std::vector<NodeCapacity> nodes = {{"slow", 32 * kGB, 10e9}, {"fast", 32 * kGB, 40e9}};
  const Placement p = place_layers(nodes, small, {kContext4096, Strategy::Speed});
  expect_valid(p, nodes, small, kContext4096);
  ASSERT_EQ(p.stages.size(), 1u);
  EXPECT_EQ(p.stages[0].node_id, "fast");
  EXPECT_NE(p.reason.find("slow"), std::string::npos) << p.reason;
}

TEST(Placement, NodeTooSmallForOneLayerIsLeftOutAndNamed) {
  auto nodes = seed_cluster();
  // One layer and its KV share is 490 MB + 32 MiB.
  nodes.push_back({"tiny", 500'000'000, 80e9});
  for (Strategy strategy : {Strategy::Memory, Strategy::Speed}) {
    const Placement p = place_layers(nodes, k70B, {kContext4096, strategy});
    expect_valid(p, nodes, k70B, kContext4096);
    EXPECT_EQ(layers_per_node(p).count("tiny"), 0u);
    const size_t line = p.reason.find("tiny");
    ASSERT_NE(line, std::string::npos) << p.reason;
    EXPECT_NE(p.reason.find("too small for one layer", line), std::string::npos) << p.reason;
  }
}

TEST(Placement, ModelThatDoesNotFitReportsTheMissingBytes) {
  const std::vector<NodeCapacity> nodes = {{"a", 16 * kGB, 20e9}, {"b", 16 * kGB, 20e9}};
  uint64_t needed = k70B.embedding_bytes + k70B.head_bytes;
  for (uint64_t layer : k70B.layer_weight_bytes) needed += layer + kContext4096 * k70B.kv_bytes_per_layer_per_token;
  const uint64_t missing = needed - 32 * kGB;
  for (Strategy strategy : {Strategy::Memory, Strategy::Speed}) {
    try {
      place_layers(nodes, k70B, {kContext4096, strategy});
      FAIL() << "a 43 GB model does not fit in 32 GB";
    } catch (const DoesNotFit& e) {
      EXPECT_EQ(e.missing_bytes(), missing);
      EXPECT_NE(std::string(e.what()).find(units::describe_bytes(missing) + " missing"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(units::describe_bytes(needed)), std::string::npos) << e.what();
    }
  }
}

TEST(Placement, EnoughMemoryInTotalButNoWholeLayerSplitFits) {
  // 3 layers of 600: two nodes of 1000 hold 1 layer each, so 2000 does not hold 1800.
  const ModelFootprint m = uniform_model(3, 600, 0, 0, 0);
  const std::vector<NodeCapacity> nodes = {{"a", 1000, 1e9}, {"b", 1000, 1e9}};
  try {
    place_layers(nodes, m, {0, Strategy::Speed});
    FAIL() << "no split fits";
  } catch (const DoesNotFit& e) {
    EXPECT_EQ(e.missing_bytes(), 0u);
    EXPECT_NE(std::string(e.what()).find("no split into whole layers"), std::string::npos) << e.what();
  }
}

TEST(Placement, InputOrderDoesNotMatter) {
  auto nodes = seed_cluster();
  nodes.push_back({"e", 24 * kGB, 35e9});
  std::sort(nodes.begin(), nodes.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
  for (Strategy strategy : {Strategy::Memory, Strategy::Speed}) {
    const Placement first = place_layers(nodes, k70B, {kContext4096, strategy});
    auto shuffled = nodes;
    while (std::next_permutation(shuffled.begin(), shuffled.end(),
                                 [](const auto& x, const auto& y) { return x.id < y.id; })) {
      const Placement p = place_layers(shuffled, k70B, {kContext4096, strategy});
      EXPECT_EQ(p.stages, first.stages);
      EXPECT_EQ(p.reason, first.reason);
      EXPECT_EQ(p.predicted_seconds_per_token, first.predicted_seconds_per_token);
    }
  }
}

// The least predicted time over every pipeline: each ordered choice of distinct nodes and each
// split of the layers into that many non-empty contiguous stages. nullopt when none fits.
std::optional<double> brute_force_fastest(const std::vector<NodeCapacity>& nodes, const ModelFootprint& m,
                                          uint64_t kv_tokens, double hop_seconds) {
  std::optional<double> best;
  std::vector<Stage> stages;
  std::vector<bool> used(nodes.size(), false);
  std::function<void(int)> extend = [&](int first) {
    if (first == m.layer_count) {
      const double seconds = pipeline_seconds(stages, nodes, m, hop_seconds);
      if (!best || seconds < *best) best = seconds;
      return;
    }
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (used[n]) continue;
      for (int last = first + 1; last <= m.layer_count; ++last) {
        if (stage_need(m, kv_tokens, first, last) > nodes[n].memory_bytes) continue;
        used[n] = true;
        stages.push_back({nodes[n].id, first, last});
        extend(last);
        stages.pop_back();
        used[n] = false;
      }
    }
  };
  extend(0);
  return best;
}

void expect_speed_matches_brute_force(const std::vector<NodeCapacity>& nodes, const ModelFootprint& m,
                                      uint64_t kv_tokens, double hop_seconds) {
  const std::optional<double> fastest = brute_force_fastest(nodes, m, kv_tokens, hop_seconds);
  if (!fastest) {
    EXPECT_THROW(place_layers(nodes, m, {kv_tokens, Strategy::Speed, hop_seconds}), DoesNotFit);
    return;
  }
  const Placement p = place_layers(nodes, m, {kv_tokens, Strategy::Speed, hop_seconds});
  expect_valid(p, nodes, m, kv_tokens);
  EXPECT_NEAR(p.predicted_seconds_per_token, pipeline_seconds(p.stages, nodes, m, hop_seconds), 1e-12);
  EXPECT_NEAR(p.predicted_seconds_per_token, *fastest, 1e-9 * *fastest) << p.reason;
}

TEST(Placement, SpeedIsTheBruteForceOptimumForThreeNodesSixUnequalLayers) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint64_t> layer_bytes(50, 150), extra_bytes(0, 200), memory(150, 700);
  std::uniform_real_distribution<double> speed(1e3, 8e3), hop(0.0, 0.05);
  for (int scenario = 0; scenario < 300; ++scenario) {
    ModelFootprint m{6, {}, extra_bytes(rng), extra_bytes(rng), 1};
    for (int layer = 0; layer < 6; ++layer) m.layer_weight_bytes.push_back(layer_bytes(rng));
    std::vector<NodeCapacity> nodes;
    for (const char* id : {"n1", "n2", "n3"}) nodes.push_back({id, memory(rng), speed(rng)});
    SCOPED_TRACE("scenario " + std::to_string(scenario));
    expect_speed_matches_brute_force(nodes, m, 10, hop(rng));
  }
}

// Mixture-of-Experts layers: each holds more than a token reads, by a share of its own. The
// memory rule counts what a stage holds, the time what a token reads.
TEST(Placement, SpeedIsTheBruteForceOptimumWhenTokensReadPartOfEachLayer) {
  std::mt19937 rng(23);
  std::uniform_int_distribution<uint64_t> layer_bytes(50, 150), extra_bytes(0, 200), memory(150, 700);
  std::uniform_real_distribution<double> speed(1e3, 8e3), hop(0.0, 0.05), read_share(0.02, 1.0);
  for (int scenario = 0; scenario < 300; ++scenario) {
    ModelFootprint m{6, {}, extra_bytes(rng), extra_bytes(rng), 1};
    for (int layer = 0; layer < 6; ++layer) {
      m.layer_weight_bytes.push_back(layer_bytes(rng));
      m.layer_read_bytes.push_back(static_cast<uint64_t>(std::ceil(read_share(rng) * m.layer_weight_bytes.back())));
    }
    std::vector<NodeCapacity> nodes;
    for (const char* id : {"n1", "n2", "n3"}) nodes.push_back({id, memory(rng), speed(rng)});
    SCOPED_TRACE("scenario " + std::to_string(scenario));
    expect_speed_matches_brute_force(nodes, m, 10, hop(rng));
  }
}

TEST(Placement, SpeedIsTheBruteForceOptimumForFourNodesEqualLayers) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint64_t> extra_bytes(0, 300), memory(150, 900);
  std::uniform_real_distribution<double> speed(1e3, 8e3), hop(0.0, 0.05);
  for (int scenario = 0; scenario < 100; ++scenario) {
    const ModelFootprint m = uniform_model(7, 100, extra_bytes(rng), extra_bytes(rng), 2);
    std::vector<NodeCapacity> nodes;
    for (const char* id : {"p", "q", "r", "s"}) nodes.push_back({id, memory(rng), speed(rng)});
    SCOPED_TRACE("scenario " + std::to_string(scenario));
    expect_speed_matches_brute_force(nodes, m, 5, hop(rng));
  }
}

TEST(Placement, SixteenNodesAndTwoHundredLayersArePlacedQuickly) {
  const ModelFootprint m = uniform_model(200, 400'000'000, 1'000'000'000, 1'000'000'000, 16384);
  std::vector<NodeCapacity> nodes;
  for (int i = 0; i < 16; ++i) {
    nodes.push_back({"node-" + std::to_string(i), (8 + static_cast<uint64_t>(i % 5) * 4) * kGB, (10 + i) * 1e9});
  }
  const auto start = std::chrono::steady_clock::now();
  const Placement p = place_layers(nodes, m, {4096, Strategy::Speed});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_valid(p, nodes, m, 4096);
  EXPECT_LT(seconds, 10.0);
}

// What a node that fetched layers [first, last) holds: the embedding and head where they border.
Holdings holding(const ModelFootprint& m, int first, int last) {
  Holdings held{false, std::vector<uint64_t>(static_cast<size_t>(m.layer_count), 0), first == 0 && last > 0,
                last == m.layer_count && first < last};
  for (int layer = first; layer < last; ++layer) {
    held.layer_bytes[static_cast<size_t>(layer)] = m.layer_weight_bytes[static_cast<size_t>(layer)];
  }
  return held;
}

std::vector<Stage> sorted_stages(std::vector<Stage> stages) {
  std::sort(stages.begin(), stages.end(), [](const Stage& a, const Stage& b) { return a.node_id < b.node_id; });
  return stages;
}

TEST(Placement, ANodeIsGivenTheLayersItHoldsAgain) {
  // Neither node holds the model alone, and either order is as fast and as well balanced: the
  // node that fetched the first half (and the embedding) before is given it again.
  const ModelFootprint m = uniform_model(10, 100 * kMiB, 10 * kMiB, 10 * kMiB, 0);
  for (Strategy strategy : {Strategy::Memory, Strategy::Speed}) {
    const std::vector<NodeCapacity> nodes = {{"a", 700 * kMiB, 10e9}, {"b", 700 * kMiB, 10e9, holding(m, 0, 5)}};
    const Placement p = place_layers(nodes, m, {0, strategy});
    expect_valid(p, nodes, m, 0);
    EXPECT_EQ(p.stages, (std::vector<Stage>{{"b", 0, 5}, {"a", 5, 10}})) << p.reason;
    EXPECT_EQ(p.fetch_bytes, 0u);
    // Without what b holds, the id order wins the tie.
    const std::vector<NodeCapacity> fresh = {{"a", 700 * kMiB, 10e9}, {"b", 700 * kMiB, 10e9}};
    EXPECT_EQ(place_layers(fresh, m, {0, strategy}).stages, (std::vector<Stage>{{"a", 0, 5}, {"b", 5, 10}}));
  }
}

TEST(Placement, AfterANodesLossTheSurvivorsKeepTheirLayersWhenThatCostsLittleSpeed) {
  // a held layers 0..9, b 10..19 (lost), c 20..29; each survivor holds at most 22 layers. The
  // fastest split gives the faster c 22 layers (12 to fetch); keeping every held layer
  // fetches only b's 10, for 1.3% more time per token.
  const ModelFootprint m = uniform_model(30, 100 * kMiB, 10 * kMiB, 10 * kMiB, 0);
  const std::vector<NodeCapacity> nodes = {{"a", 2250 * kMiB, 10e9, holding(m, 0, 10)},
                                           {"c", 2250 * kMiB, 12e9, holding(m, 20, 30)}};
  const Placement kept = place_layers(nodes, m, {0, Strategy::Speed});
  expect_valid(kept, nodes, m, 0);
  EXPECT_EQ(kept.stages, (std::vector<Stage>{{"a", 0, 10}, {"c", 10, 30}})) << kept.reason;
  EXPECT_EQ(kept.fetch_bytes, 10 * 100 * kMiB);
  EXPECT_NE(kept.reason.find("keeps the weights nodes hold"), std::string::npos) << kept.reason;
  EXPECT_NEAR(kept.predicted_seconds_per_token, pipeline_seconds(kept.stages, nodes, m, kDefaultHopSeconds), 1e-12);

  PlacementRequest fastest{0, Strategy::Speed};
  fastest.keep_tolerance = 0.01;
  const Placement p = place_layers(nodes, m, fastest);
  EXPECT_EQ(p.stages, (std::vector<Stage>{{"a", 0, 8}, {"c", 8, 30}})) << p.reason;
  EXPECT_EQ(p.fetch_bytes, 12 * 100 * kMiB);
  EXPECT_LT(p.predicted_seconds_per_token, kept.predicted_seconds_per_token);
}

TEST(Placement, SpeedMovesTheModelWhenKeepingItIsMuchSlower) {
  // The slow node holds every layer; the fast one has just joined with nothing.
  const ModelFootprint m = uniform_model(10, 100 * kMiB, 10 * kMiB, 10 * kMiB, 0);
  const std::vector<NodeCapacity> nodes = {{"fast", 4 * kGiB, 40e9, holding(m, 0, 0)},
                                           {"slow", 4 * kGiB, 10e9, holding(m, 0, 10)}};
  const Placement p = place_layers(nodes, m, {0, Strategy::Speed});
  EXPECT_EQ(sorted_stages(p.stages), (std::vector<Stage>{{"fast", 0, 10}}));
  EXPECT_EQ(p.fetch_bytes, 10 * 100 * kMiB + 20 * kMiB);
  EXPECT_NE(p.reason.find("to fetch from peers"), std::string::npos) << p.reason;
}

TEST(Placement, HoldingsFromThePeerAreNeverTrustedBeyondTheModel) {
  // More bytes than a layer has, or more layers than the model: counted as the layer at most.
  const ModelFootprint m = uniform_model(4, 100, 10, 10, 0);
  const std::vector<NodeCapacity> nodes = {{"a", 1000, 1e9, Holdings{false, {500, 100, 100, 100, 100, 100}, false, false}}};
  const Placement p = place_layers(nodes, m, {0, Strategy::Speed});
  EXPECT_EQ(p.fetch_bytes, 20u);
}

TEST(Placement, RejectsUnusableInput) {
  const ModelFootprint m = uniform_model(4, 100, 0, 0, 0);
  const std::vector<NodeCapacity> twice = {{"a", 1000, 1e9}, {"a", 1000, 1e9}};
  EXPECT_THROW(place_layers(twice, m, {}), std::invalid_argument);
  const std::vector<NodeCapacity> no_speed = {{"a", 1000, 0.0}};
  EXPECT_THROW(place_layers(no_speed, m, {}), std::invalid_argument);
  const std::vector<NodeCapacity> fine = {{"a", 1000, 1e9}};
  EXPECT_THROW(place_layers(fine, uniform_model(0, 100, 0, 0, 0), {}), std::invalid_argument);
  EXPECT_THROW(place_layers(fine, m, {0, Strategy::Speed, -1.0}), std::invalid_argument);
  ModelFootprint reads_too_much = m;
  reads_too_much.layer_read_bytes = {100, 100, 101, 100};
  EXPECT_THROW(place_layers(fine, reads_too_much, {}), std::invalid_argument);
  ModelFootprint reads_too_few_layers = m;
  reads_too_few_layers.layer_read_bytes = {10, 10, 10};
  EXPECT_THROW(place_layers(fine, reads_too_few_layers, {}), std::invalid_argument);
}

TEST(RepairPlacement, AGoneMiddleStagesLayersGoToTheStageBeforeIt) {
  const ModelFootprint m = uniform_model(9, 100, 10, 10, 0);
  const std::vector<NodeCapacity> nodes = {{"a", 2000, 1e9}, {"c", 2000, 1e9}};
  const Placement current{7, {{"a", 0, 3}, {"b", 3, 6}, {"c", 6, 9}}};
  const std::vector<std::string> members = {"a", "c"};
  const std::optional<Placement> p = repair_placement(current, members, nodes, m, 0);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->stages, (std::vector<Stage>{{"a", 0, 6}, {"c", 6, 9}}));
  expect_valid(*p, nodes, m, 0);
  EXPECT_NE(p->reason.find("repaired"), std::string::npos) << p->reason;
}

TEST(RepairPlacement, GoneFirstStagesLayersGoToTheFirstStageLeft) {
  const ModelFootprint m = uniform_model(8, 100, 10, 10, 0);
  const std::vector<NodeCapacity> nodes = {{"c", 2000, 1e9}, {"d", 2000, 1e9}};
  const Placement current{3, {{"a", 0, 2}, {"b", 2, 4}, {"c", 4, 6}, {"d", 6, 8}}};
  const std::vector<std::string> members = {"c", "d"};
  const std::optional<Placement> p = repair_placement(current, members, nodes, m, 0);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->stages, (std::vector<Stage>{{"c", 0, 6}, {"d", 6, 8}}));
}

TEST(RepairPlacement, NothingWhenNoStageIsLeftOrTheSurvivorsCannotHoldTheLayers) {
  const ModelFootprint m = uniform_model(4, 100, 10, 10, 0);
  const Placement current{2, {{"a", 0, 2}, {"b", 2, 4}}};
  const std::vector<NodeCapacity> others = {{"c", 2000, 1e9}};
  const std::vector<std::string> only_c = {"c"};
  EXPECT_FALSE(repair_placement(current, only_c, others, m, 0));
  // a holds its two layers (220 bytes with the embedding) but not all four.
  const std::vector<NodeCapacity> small = {{"a", 300, 1e9}};
  const std::vector<std::string> only_a = {"a"};
  EXPECT_FALSE(repair_placement(current, only_a, small, m, 0));
  const std::vector<NodeCapacity> large = {{"a", 420, 1e9}};
  EXPECT_EQ(repair_placement(current, only_a, large, m, 0)->stages, (std::vector<Stage>{{"a", 0, 4}}));
}

Placement placement(std::vector<Stage> stages) { return Placement{0, std::move(stages), "", 0.0}; }

// check_placement refuses `p`, saying `says`.
void expect_refused(const Placement& p, std::span<const NodeCapacity> nodes, const ModelFootprint& m, uint64_t kv,
                    const std::string& says) {
  try {
    check_placement(p, nodes, m, kv);
    ADD_FAILURE() << "accepted; expected: " << says;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(CheckPlacement, AcceptsValidAndRejectsEachKindOfInvalid) {
  const ModelFootprint m = uniform_model(4, 100, 10, 20, 1);
  const std::vector<NodeCapacity> nodes = {{"a", 300, 1e9}, {"b", 300, 1e9}};
  const uint64_t kv = 5;  // stage [0, 2): 2 × 105 + 10; stage [2, 4): 2 × 105 + 20
  EXPECT_NO_THROW(check_placement(placement({{"a", 0, 2}, {"b", 2, 4}}), nodes, m, kv));

  const auto expect_rejected = [&](const Placement& p, const std::string& says) { expect_refused(p, nodes, m, kv, says); };
  expect_rejected(placement({}), "no stages");
  expect_rejected(placement({{"a", 0, 1}, {"b", 2, 4}}), "left out");       // gap
  expect_rejected(placement({{"a", 0, 2}, {"b", 1, 4}}), "overlap");
  expect_rejected(placement({{"a", 0, 2}, {"b", 2, 3}}), "left out");       // end not covered
  expect_rejected(placement({{"a", 1, 2}, {"b", 2, 4}}), "left out");       // start not covered
  expect_rejected(placement({{"a", 0, 2}, {"b", 2, 2}, {"b", 2, 4}}), "no layers");
  expect_rejected(placement({{"a", 0, 2}, {"b", 2, 5}}), "past the model");
  expect_rejected(placement({{"a", 0, 2}, {"zz", 2, 4}}), "no such node");
  expect_rejected(placement({{"a", 0, 2}, {"a", 2, 4}}), "already has a stage");
  expect_rejected(placement({{"a", 0, 3}, {"b", 3, 4}}), "needs 325 B");  // 3 × 105 + 10 > 300
}

// A group's member needs its share of the stage's weights and KV; every member is a node of the
// cluster, in no other stage.
TEST(CheckPlacement, AGroupsMembersEachHoldTheirShare) {
  const ModelFootprint m = uniform_model(4, 100, 10, 20, 1);
  const std::vector<NodeCapacity> nodes = {{"a", 300, 1e9}, {"b", 300, 1e9}, {"c", 300, 1e9}};
  const uint64_t kv = 5;  // all 4 layers: 4 × 105 + 10 + 20 = 450 bytes
  EXPECT_NO_THROW(check_placement(placement({{"a", 0, 4, {{"a", 0.5}, {"b", 0.5}}}}), nodes, m, kv));
  EXPECT_NO_THROW(check_placement(placement({{"a", 0, 2}, {"b", 2, 4, {{"b", 0.6}, {"c", 0.4}}}}), nodes, m, kv));
  const auto expect_rejected = [&](const Placement& p, const std::string& says) { expect_refused(p, nodes, m, kv, says); };
  expect_rejected(placement({{"a", 0, 4, {{"a", 0.75}, {"b", 0.25}}}}), "needs 337 B on node 'a'");  // 450 × 0.75
  expect_rejected(placement({{"a", 0, 4, {{"a", 0.5}, {"zz", 0.5}}}}), "no such node 'zz'");
  expect_rejected(placement({{"a", 0, 2}, {"b", 2, 4, {{"b", 0.5}, {"a", 0.5}}}}), "node 'a' already has a stage");
  expect_rejected(placement({{"a", 0, 4, {{"b", 0.5}, {"a", 0.5}}}}), "first member is not its node");
  expect_rejected(placement({{"a", 0, 4, {{"a", 0.5}, {"b", 0.0}}}}), "share that is not in (0, 1]");
}

// A group that loses members goes on with those left, sharing in the same proportions; one left
// computes the stage alone.
TEST(RepairPlacement, AGroupGoesOnWithTheMembersLeft) {
  const ModelFootprint m = uniform_model(4, 100, 10, 10, 0);
  const std::vector<NodeCapacity> nodes = {{"a", 2000, 1e9}, {"c", 2000, 1e9}, {"d", 2000, 1e9}};
  const Placement current{3, {{"a", 0, 2, {{"a", 0.5}, {"b", 0.25}, {"c", 0.25}}}, {"d", 2, 4}}};
  const std::vector<std::string> without_b = {"a", "c", "d"};
  const std::optional<Placement> p = repair_placement(current, without_b, nodes, m, 0);
  ASSERT_TRUE(p);
  const double third = 0.25 / 0.75;
  EXPECT_EQ(p->stages, (std::vector<Stage>{{"a", 0, 2, {{"a", 0.5 / 0.75}, {"c", third}}}, {"d", 2, 4}}));
  const std::vector<std::string> only_c_and_d = {"c", "d"};
  EXPECT_EQ(repair_placement(current, only_c_and_d, nodes, m, 0)->stages, (std::vector<Stage>{{"c", 0, 2}, {"d", 2, 4}}));
}

TEST(TensorRole, EachNameHasOneRole) {
  EXPECT_EQ(role_of_tensor("blk.3.attn_q.weight", 4).kind, TensorRole::Layer);
  EXPECT_EQ(role_of_tensor("blk.3.attn_q.weight", 4).layer, 3);
  EXPECT_EQ(role_of_tensor("blk.0.ffn_norm.weight", 4).layer, 0);
  EXPECT_EQ(role_of_tensor("token_embd.weight", 4).kind, TensorRole::Embedding);
  EXPECT_EQ(role_of_tensor("output.weight", 4).kind, TensorRole::OutputMatrix);
  EXPECT_EQ(role_of_tensor("output_norm.weight", 4).kind, TensorRole::OutputNorm);
  EXPECT_EQ(role_of_tensor("rope_freqs.weight", 4).kind, TensorRole::Shared);
  EXPECT_EQ(role_of_tensor("rope_freqs.weight", 4).layer, -1);
  EXPECT_THROW(role_of_tensor("blk.4.attn_q.weight", 4), std::runtime_error);
  EXPECT_THROW(role_of_tensor("blk.x.attn_q.weight", 4), std::runtime_error);
  EXPECT_THROW(role_of_tensor("blk.2", 4), std::runtime_error);
  // Blocks after the layers that inference skips (GLM's NextN layer) are no stage's.
  EXPECT_EQ(role_of_tensor("blk.4.nextn.eh_proj.weight", 4, 1).kind, TensorRole::Unused);
  EXPECT_EQ(role_of_tensor("blk.4.ffn_up_exps.weight", 4, 1).kind, TensorRole::Unused);
  EXPECT_EQ(role_of_tensor("blk.3.attn_q.weight", 4, 1).kind, TensorRole::Layer);
  EXPECT_THROW(role_of_tensor("blk.5.attn_q.weight", 4, 1), std::runtime_error);
  // Of a layer's tensors of experts a token reads only the experts it runs; everything else of
  // the layer, the router and a shared expert too, it reads whole.
  for (const char* experts : {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight",
                              "blk.1.ffn_gate_exps.bias", "blk.1.ffn_down_exps.bias"}) {
    EXPECT_TRUE(role_of_tensor(experts, 4).experts) << experts;
    EXPECT_EQ(role_of_tensor(experts, 4).layer, 1) << experts;
  }
  for (const char* whole : {"blk.1.ffn_gate_inp.weight", "blk.1.ffn_gate_shexp.weight", "blk.1.ffn_down.weight",
                            "blk.1.attn_q.weight", "blk.1.ffn_norm.weight", "token_embd.weight", "output.weight"}) {
    EXPECT_FALSE(role_of_tensor(whole, 4).experts) << whole;
  }
}

TEST(Footprint, FromTheSharedModelsTensorTable) {
  auto file = std::shared_ptr<const gguf::File>(gguf::File::open(STRATA_SHARED_DIR "/models/aidreams260K.gguf"));
  const ModelFootprint f = footprint_of(*file);
  const model::Config config = model::Config::from_gguf(*file);
  ASSERT_EQ(f.layer_count, 4);
  ASSERT_EQ(f.layer_weight_bytes.size(), 4u);
  EXPECT_EQ(f.kv_bytes_per_layer_per_token, 2u * static_cast<uint64_t>(config.kv_dim()) * sizeof(float));
  const uint64_t norm_bytes = static_cast<uint64_t>(config.embedding_dim) * sizeof(float);
  // All F32: the embedding is vocab × dim floats; the tied head is the output norm plus it.
  EXPECT_EQ(f.embedding_bytes, static_cast<uint64_t>(config.vocab_size) * norm_bytes);
  EXPECT_EQ(f.head_bytes, norm_bytes + f.embedding_bytes);
  // A layer is the matrices a one-layer Model streams, plus its two norms; the last layer's
  // Model also streams the head's matrix (token_embd, tied).
  for (int layer = 0; layer < 4; ++layer) {
    const auto one_layer = model::Model::load(file, {layer, layer + 1});
    const uint64_t head_matrix = layer == 3 ? f.embedding_bytes : 0;
    EXPECT_EQ(f.layer_weight_bytes[static_cast<size_t>(layer)] + head_matrix, one_layer->weight_bytes() + 2 * norm_bytes);
  }
  // A dense model: a token reads every byte of each layer.
  EXPECT_EQ(f.layer_read_bytes, f.layer_weight_bytes);
}

// A synthetic Qwen3-MoE of the tiny shape, in Q8_0, in the test's temporary directory.
class MoeFootprint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(
        (std::filesystem::temp_directory_path() / ("strata_placement_test_" + std::to_string(::getpid()) + "_moe.gguf"))
            .string());
    model::write_synthetic_model(shape(), model::parse_weight_types("Q8_0"), *path_, 7);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*path_);
    delete path_;
  }
  static const model::SyntheticShape& shape() { return *model::find_synthetic_shape("qwen3moe-tiny"); }
  static std::string* path_;
};
std::string* MoeFootprint::path_ = nullptr;

TEST_F(MoeFootprint, ALayerHoldsEveryExpertAndATokenReadsTheOnesItRuns) {
  auto file = std::shared_ptr<const gguf::File>(gguf::File::open(*path_));
  const ModelFootprint f = footprint_of(*file);
  // From the shape: Q8_0 stores 32 weights in 34 bytes; norms and the router stay F32.
  const model::SyntheticShape& s = shape();
  const auto q8_0 = [](uint64_t weights) { return weights / 32 * 34; };
  const uint64_t dim = static_cast<uint64_t>(s.embedding_dim), head_dim = static_cast<uint64_t>(s.head_dim);
  const uint64_t q_dim = static_cast<uint64_t>(s.head_count) * head_dim;
  const uint64_t kv_dim = static_cast<uint64_t>(s.kv_head_count) * head_dim;
  const uint64_t experts = static_cast<uint64_t>(s.expert_count);
  const uint64_t norms = (2 * dim + 2 * head_dim) * sizeof(float);  // attn, ffn; Q and K per head
  const uint64_t attention = q8_0(2 * dim * q_dim + 2 * dim * kv_dim);
  const uint64_t router = dim * experts * sizeof(float);
  const uint64_t one_expert = q8_0(3 * dim * static_cast<uint64_t>(s.expert_ffn_dim));  // gate, up, down
  const uint64_t held = norms + attention + router + experts * one_expert;
  const uint64_t read = norms + attention + router + static_cast<uint64_t>(s.experts_per_token) * one_expert;
  ASSERT_EQ(f.layer_count, s.layer_count);
  EXPECT_EQ(f.layer_weight_bytes, std::vector<uint64_t>(static_cast<size_t>(s.layer_count), held));
  EXPECT_EQ(f.layer_read_bytes, std::vector<uint64_t>(static_cast<size_t>(s.layer_count), read));
  EXPECT_LT(read, held / 2);
  // The model's own count of what a token reads through one layer agrees (its matrices, not the
  // norms; the last layer's Model also reads the head's matrix).
  for (int layer = 0; layer < s.layer_count; ++layer) {
    const auto one_layer = model::Model::load(file, {layer, layer + 1});
    const uint64_t head_matrix = layer + 1 == s.layer_count ? f.head_bytes - dim * sizeof(float) : 0;
    EXPECT_EQ(f.layer_read_bytes[static_cast<size_t>(layer)] + head_matrix, one_layer->weight_bytes() + norms);
  }
}

TEST_F(MoeFootprint, TensorsOfExpertsMustMatchTheExpertCount) {
  auto moe = gguf::File::open(*path_);
  auto dense = gguf::File::open(STRATA_SHARED_DIR "/models/aidreams260K.gguf");
  const auto footprint_with = [](const gguf::File& source, const char* name, size_t length) {
    const std::string path = *path_ + ".variant";
    model::testing::write_variant(source, path, {}, {{name, std::vector<float>(length, 0.0f)}});
    auto file = gguf::File::open(path);
    std::filesystem::remove(path);
    return footprint_of(*file);
  };
  const auto expect_refused = [&](const gguf::File& source, const char* name, size_t length, const std::string& says) {
    try {
      footprint_with(source, name, length);
      ADD_FAILURE() << name << " accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  // A dense model's metadata counts no experts; a bias of 64 is not one per each of 8 experts.
  expect_refused(*dense, "blk.0.ffn_up_exps.bias", 8, "counts none");
  expect_refused(*moe, "blk.0.ffn_up_exps.bias", 64, "not the model's 8 experts");
  // One value per expert is read as the experts a token runs: 2 of 8 floats.
  const ModelFootprint plain = footprint_of(*moe);
  const ModelFootprint with_bias = footprint_with(*moe, "blk.0.ffn_up_exps.bias", 8);
  EXPECT_EQ(with_bias.layer_weight_bytes[0], plain.layer_weight_bytes[0] + 8 * sizeof(float));
  EXPECT_EQ(with_bias.layer_read_bytes[0], plain.layer_read_bytes[0] + 2 * sizeof(float));
}

// DeepSeek's latent attention keeps one row per position and layer, of the latent and the
// rotated key part that all heads share, and no values: the footprint counts that, not per-head
// keys and values.
TEST(Footprint, LatentAttentionCachesTheLatentRow) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("strata_placement_test_" + std::to_string(::getpid()) + "_mla.gguf"))
          .string();
  model::write_synthetic_model(*model::find_synthetic_shape("deepseek2-tiny"), model::parse_weight_types("Q8_0"),
                               path, 7);
  auto file = gguf::File::open(path);
  std::filesystem::remove(path);
  const model::Config config = model::Config::from_gguf(*file);
  ASSERT_TRUE(config.has_latent_attention());
  EXPECT_EQ(footprint_of(*file).kv_bytes_per_layer_per_token,
            static_cast<uint64_t>(config.mla.kv_rank + config.rope_dim) * sizeof(float));
}

// GLM-4.5's layout in small (glm4moe-tiny, Q8_0): a dense first layer read whole; MoE layers
// whose shared expert, router and selection bias every token reads, and of whose routed
// experts it reads those it runs; and a NextN layer that no stage holds or reads.
TEST(Footprint, GlmDenseLayerSharedExpertAndNextNLayer) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("strata_placement_test_" + std::to_string(::getpid()) + "_glm.gguf"))
          .string();
  const model::SyntheticShape& s = *model::find_synthetic_shape("glm4moe-tiny");
  model::write_synthetic_model(s, model::parse_weight_types("Q8_0"), path, 7);
  auto file = std::shared_ptr<const gguf::File>(gguf::File::open(path));
  std::filesystem::remove(path);
  const ModelFootprint f = footprint_of(*file);
  ASSERT_EQ(f.layer_count, s.layer_count);
  ASSERT_EQ(s.leading_dense_layers, 1);
  EXPECT_EQ(f.layer_read_bytes[0], f.layer_weight_bytes[0]);
  // Q8_0: 32 weights in 34 bytes; an expert's gate, up and down.
  const uint64_t one_expert = 3 * static_cast<uint64_t>(s.embedding_dim * s.expert_ffn_dim) / 32 * 34;
  const uint64_t not_run = static_cast<uint64_t>(s.expert_count - s.experts_per_token) * one_expert;
  for (size_t layer = 1; layer < static_cast<size_t>(s.layer_count); ++layer) {
    EXPECT_EQ(f.layer_weight_bytes[layer] - f.layer_read_bytes[layer], not_run);
  }
  // The model's own count per layer: its matrices, beside the layer's vectors (norms, biases).
  const uint64_t head_matrix = f.head_bytes - static_cast<uint64_t>(s.embedding_dim) * sizeof(float);
  for (int layer = 0; layer < s.layer_count; ++layer) {
    uint64_t vectors = 0;
    for (const gguf::TensorInfo& t : file->tensors()) {
      if (t.dims.size() == 1 && t.name.starts_with("blk." + std::to_string(layer) + ".")) vectors += t.size_bytes;
    }
    const auto one_layer = model::Model::load(file, {layer, layer + 1});
    EXPECT_EQ(f.layer_read_bytes[static_cast<size_t>(layer)] + (layer + 1 == s.layer_count ? head_matrix : 0),
              one_layer->weight_bytes() + vectors)
        << "layer " << layer;
  }
  // A tensor-parallel group gathers, per token and layer, its members' sums of o's leaves (two
  // rows of the embedding, as in a group of two); then of a dense FFN's down's leaves, or of the
  // experts' leaves and the shared expert's (two rows each); at the head, a logits row.
  const uint64_t row = static_cast<uint64_t>(s.embedding_dim) * sizeof(float);
  EXPECT_EQ(f.layer_gathered_bytes[0], 4 * row);
  ASSERT_GT(s.shared_expert_count, 0);
  for (size_t layer = 1; layer < static_cast<size_t>(s.layer_count); ++layer) {
    EXPECT_EQ(f.layer_gathered_bytes[layer], 6 * row) << "layer " << layer;
  }
  // One gather after another: o's sums, then the FFN's, in every layer.
  for (size_t layer = 0; layer < static_cast<size_t>(s.layer_count); ++layer) EXPECT_EQ(f.layer_gathers[layer], 2u);
  EXPECT_EQ(f.head_gathered_bytes, static_cast<uint64_t>(s.vocab_size) * sizeof(float));
}

// Two published Mixture-of-Experts models, their footprints built from their shapes as their
// GGUF files store them, then placed on the seed's four nodes and on four times them.

// How a GGUF type stores weights: bytes per block of weights, as ggml lays the blocks out.
struct Encoding {
  const char* name;
  uint64_t block_bytes;
  uint64_t block_weights;
  bool operator==(const Encoding&) const = default;
};
constexpr Encoding kF32{"F32", 4, 1};
constexpr Encoding kF16{"F16", 2, 1};
constexpr Encoding kQ8_0{"Q8_0", 34, 32};    // 8.5 bits: 32 int8 and an f16 scale
constexpr Encoding kMXFP4{"MXFP4", 17, 32};  // 4.25 bits: 32 4-bit floats and a shared 8-bit exponent
constexpr Encoding kQ4_K{"Q4_K", 144, 256};  // 4.5 bits
constexpr Encoding kQ6_K{"Q6_K", 210, 256};  // 6.5625 bits

struct Tensor {
  uint64_t weights;
  Encoding encoding;
  bool experts = false;  // one of a layer's tensors of experts
};

enum class Count { Weights, Bytes };
uint64_t amount(const Tensor& t, Count count) {
  return count == Count::Weights ? t.weights : t.weights / t.encoding.block_weights * t.encoding.block_bytes;
}

// A model's tensors as its GGUF file lists them, grouped as a stage holds them.
struct PublishedModel {
  std::vector<std::vector<Tensor>> layers;
  Tensor embedding;
  std::vector<Tensor> head;  // output norm and matrix
  uint64_t expert_count;
  uint64_t experts_used;
  uint64_t kv_bytes_per_layer_per_token;

  std::vector<Tensor> all() const {
    std::vector<Tensor> tensors{embedding};
    for (const auto& layer : layers) tensors.insert(tensors.end(), layer.begin(), layer.end());
    tensors.insert(tensors.end(), head.begin(), head.end());
    return tensors;
  }
  size_t tensors_in(Encoding encoding) const {
    const std::vector<Tensor> tensors = all();
    return static_cast<size_t>(
        std::count_if(tensors.begin(), tensors.end(), [&](const Tensor& t) { return t.encoding == encoding; }));
  }
  uint64_t held(Count count) const {
    uint64_t sum = 0;
    for (const Tensor& t : all()) sum += amount(t, count);
    return sum;
  }
  // What a token reads of a tensor: of a tensor of experts, the experts it runs.
  uint64_t read(const Tensor& t, Count count) const {
    return t.experts ? amount(t, count) / expert_count * experts_used : amount(t, count);
  }
  // What a token reads of the whole model: every layer's share and the head; of the embedding
  // one row, which no count here includes (nor do the model cards' active parameters).
  uint64_t read_per_token(Count count) const {
    uint64_t sum = 0;
    for (const auto& layer : layers) {
      for (const Tensor& t : layer) sum += read(t, count);
    }
    for (const Tensor& t : head) sum += amount(t, count);
    return sum;
  }
  ModelFootprint footprint() const {
    ModelFootprint f{static_cast<int>(layers.size()), {}, amount(embedding, Count::Bytes), 0,
                     kv_bytes_per_layer_per_token};
    for (const auto& layer : layers) {
      uint64_t held = 0, read_per_token = 0;
      for (const Tensor& t : layer) {
        held += amount(t, Count::Bytes);
        read_per_token += read(t, Count::Bytes);
      }
      f.layer_weight_bytes.push_back(held);
      f.layer_read_bytes.push_back(read_per_token);
    }
    for (const Tensor& t : head) f.head_bytes += amount(t, Count::Bytes);
    return f;
  }
};

// Strata keeps keys and values in f16 by default (--kv-type f16), for every position of the
// context in every layer (gpt-oss's sliding-window layers would need fewer).
constexpr uint64_t kv_f16(uint64_t kv_dim) { return 2 * kv_dim * 2; }

// gpt-oss-120b, from openai/gpt-oss-120b's config.json as llama.cpp's GGUF files carry it (load
// logs of lmstudio-community's gpt-oss-120b-MXFP4, 59.02 GiB like ggml-org's, and, in
// ik_llama.cpp issue #895, of unsloth's gpt-oss-120b-F16): 36 layers, hidden size 2880, 64
// query heads and 8 KV heads of 64, 128 experts of which a token runs 4, each an FFN of 2880
// (gate and up from 2880, down back to it), vocabulary 201088, the head apart from the
// embedding. Every attention projection has a bias, every head a sink, the router and every
// expert biases. The experts are MXFP4 in every GGUF; norms, biases, sinks and the router F32;
// the other matrices (attention, embedding, output) are `matrices`: Q8_0 in ggml-org's file,
// F16 in unsloth's.
PublishedModel gpt_oss_120b(Encoding matrices) {
  constexpr uint64_t layers = 36, hidden = 2880, heads = 64, kv_heads = 8, head_dim = 64, vocab = 201088;
  constexpr uint64_t experts = 128, used = 4, expert_ffn = 2880;
  constexpr uint64_t q = heads * head_dim, kv = kv_heads * head_dim;
  const std::vector<Tensor> layer = {
      {hidden, kF32},          {hidden, kF32},  // attn_norm, post_attention_norm
      {hidden * q, matrices},  {q, kF32},       // attn_q and its bias
      {hidden * kv, matrices}, {kv, kF32},      // attn_k
      {hidden * kv, matrices}, {kv, kF32},      // attn_v
      {q * hidden, matrices},  {hidden, kF32},  // attn_output
      {heads, kF32},                            // attn_sinks
      {hidden * experts, kF32}, {experts, kF32},  // ffn_gate_inp: the router
      {hidden * expert_ffn * experts, kMXFP4, true}, {expert_ffn * experts, kF32, true},  // ffn_gate_exps
      {hidden * expert_ffn * experts, kMXFP4, true}, {expert_ffn * experts, kF32, true},  // ffn_up_exps
      {expert_ffn * hidden * experts, kMXFP4, true}, {hidden * experts, kF32, true},      // ffn_down_exps
  };
  return {std::vector<std::vector<Tensor>>(layers, layer), {hidden * vocab, matrices},
          {{hidden, kF32}, {hidden * vocab, matrices}}, experts, used, kv_f16(kv)};
}

// llama.cpp's use_more_bits (src/llama-quant.cpp): the layers whose attn_v and ffn_down (so
// ffn_down_exps) Q4_K_M stores in Q6_K.
bool q4_k_m_uses_q6_k(uint64_t layer, uint64_t layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

// Qwen3-235B-A22B in Q4_K_M, from Qwen/Qwen3-235B-A22B's config.json as the GGUF carries it
// (the load log of unsloth's Qwen3-235B-A22B-Q4_K_M in ik_llama.cpp issue #389): 94 layers,
// hidden size 4096, 64 query heads and 4 KV heads of 128, RMS norms of Q and K per head, no
// biases, 128 experts of which a token runs 8, each an FFN of 1536, vocabulary 151936, the
// head apart from the embedding. llama.cpp's Q4_K_M (llama_tensor_get_type) keeps norms and
// the router F32, stores output.weight in Q6_K, attn_v and ffn_down_exps in Q6_K in the layers
// use_more_bits picks, and every other matrix in Q4_K.
PublishedModel qwen3_235b_a22b_q4_k_m() {
  constexpr uint64_t layers = 94, hidden = 4096, heads = 64, kv_heads = 4, head_dim = 128, vocab = 151936;
  constexpr uint64_t experts = 128, used = 8, expert_ffn = 1536;
  constexpr uint64_t q = heads * head_dim, kv = kv_heads * head_dim;
  PublishedModel model{
      {}, {hidden * vocab, kQ4_K}, {{hidden, kF32}, {hidden * vocab, kQ6_K}}, experts, used, kv_f16(kv)};
  for (uint64_t layer = 0; layer < layers; ++layer) {
    const Encoding more_bits = q4_k_m_uses_q6_k(layer, layers) ? kQ6_K : kQ4_K;
    model.layers.push_back({
        {hidden, kF32}, {hidden, kF32},      // attn_norm, ffn_norm
        {head_dim, kF32}, {head_dim, kF32},  // attn_q_norm, attn_k_norm
        {hidden * q, kQ4_K}, {hidden * kv, kQ4_K}, {hidden * kv, more_bits}, {q * hidden, kQ4_K},
        {hidden * experts, kF32},                                // ffn_gate_inp: the router
        {hidden * expert_ffn * experts, kQ4_K, true},            // ffn_gate_exps
        {hidden * expert_ffn * experts, kQ4_K, true},            // ffn_up_exps
        {expert_ffn * hidden * experts, more_bits, true},        // ffn_down_exps
    });
  }
  return model;
}

constexpr double kGiBytes = 1024.0 * 1024.0 * 1024.0;

double layers_gib(const ModelFootprint& f) {
  return std::accumulate(f.layer_weight_bytes.begin(), f.layer_weight_bytes.end(), 0.0) / kGiBytes;
}

// The tables above against what llama.cpp printed loading the files (tensors per type, "model
// params", "model size", "repeating layers": the layers alone) and the model cards' active
// parameters (5.1B of 117B; 22B of 235B), which count the head but not the embedding.
TEST(PublishedMoeModel, TheShapesGiveTheSizesLlamaCppReports) {
  for (const PublishedModel& model : {gpt_oss_120b(kQ8_0), gpt_oss_120b(kF16), qwen3_235b_a22b_q4_k_m()}) {
    for (const Tensor& t : model.all()) EXPECT_EQ(t.weights % t.encoding.block_weights, 0u) << t.encoding.name;
  }
  for (const Encoding matrices : {kQ8_0, kF16}) {
    const PublishedModel m = gpt_oss_120b(matrices);
    SCOPED_TRACE(matrices.name);
    EXPECT_EQ(m.all().size(), 687u);
    EXPECT_EQ(m.tensors_in(kF32), 433u);
    EXPECT_EQ(m.tensors_in(matrices), 146u);
    EXPECT_EQ(m.tensors_in(kMXFP4), 108u);
    EXPECT_NEAR(m.held(Count::Weights) / 1e9, 116.829, 0.0005);
    EXPECT_NEAR(m.read_per_token(Count::Weights) / 1e9, 5.1, 0.05);
  }
  EXPECT_NEAR(gpt_oss_120b(kQ8_0).held(Count::Bytes) / kGiBytes, 59.02, 0.005);
  EXPECT_NEAR(gpt_oss_120b(kF16).held(Count::Bytes) / kGiBytes, 60.868, 0.0005);
  EXPECT_NEAR(layers_gib(gpt_oss_120b(kF16).footprint()), 58.710, 0.0005);

  const PublishedModel qwen = qwen3_235b_a22b_q4_k_m();
  EXPECT_EQ(qwen.all().size(), 1131u);
  EXPECT_EQ(qwen.tensors_in(kF32), 471u);
  EXPECT_EQ(qwen.tensors_in(kQ4_K), 567u);
  EXPECT_EQ(qwen.tensors_in(kQ6_K), 93u);  // the head, and attn_v and ffn_down_exps of 46 layers
  EXPECT_NEAR(qwen.held(Count::Weights) / 1e9, 235.094, 0.0005);
  EXPECT_NEAR(qwen.held(Count::Bytes) / kGiBytes, 132.386, 0.0005);
  EXPECT_NEAR(layers_gib(qwen.footprint()), 131.584, 0.0005);
  EXPECT_NEAR(qwen.read_per_token(Count::Weights) / 1e9, 22.0, 0.5);
}

std::vector<NodeCapacity> four_times(std::vector<NodeCapacity> nodes) {
  for (NodeCapacity& node : nodes) node.memory_bytes *= 4;
  return nodes;
}

// The least bytes a token reads on the slowest stage of any pipeline of exactly `stage_count`
// stages that obeys the memory rule: every ordered choice of distinct nodes and every split
// into that many contiguous stages. nullopt: no such pipeline fits.
std::optional<uint64_t> least_slowest_stage_read(const std::vector<NodeCapacity>& nodes, const ModelFootprint& m,
                                                 uint64_t kv_tokens, size_t stage_count) {
  std::optional<uint64_t> best;
  std::vector<bool> used(nodes.size(), false);
  std::function<void(int, size_t, uint64_t)> extend = [&](int first, size_t stages, uint64_t slowest) {
    if (first == m.layer_count || stages == stage_count) {
      if (first == m.layer_count && stages == stage_count && (!best || slowest < *best)) best = slowest;
      return;
    }
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (used[n]) continue;
      for (int last = first + 1; last <= m.layer_count; ++last) {
        if (stage_need(m, kv_tokens, first, last) > nodes[n].memory_bytes) break;  // more layers need more
        used[n] = true;
        extend(last, stages + 1, std::max(slowest, stage_read(m, {nodes[n].id, first, last})));
        used[n] = false;
      }
    }
  };
  extend(0, 0, 0);
  return best;
}

uint64_t slowest_stage_read(const Placement& p, const ModelFootprint& m) {
  uint64_t slowest = 0;
  for (const Stage& s : p.stages) slowest = std::max(slowest, stage_read(m, s));
  return slowest;
}

// The seed's nodes all read weights at the same speed, so every pipeline reads the same bytes
// per token in the same time and differs only by its hops: the fastest has the fewest stages
// that fit, and among those the least read on its slowest stage. Its predicted time is what a
// token reads of the whole model at that speed, plus the hops: far less than every byte held.
void expect_speed_strategy_reads_only_active_bytes(const std::vector<NodeCapacity>& nodes, const PublishedModel& model,
                                                   size_t expected_stages) {
  const ModelFootprint m = model.footprint();
  const Placement p = place_layers(nodes, m, {kContext4096, Strategy::Speed});
  expect_valid(p, nodes, m, kContext4096);
  for (size_t fewer = 1; fewer < expected_stages; ++fewer) {
    EXPECT_FALSE(least_slowest_stage_read(nodes, m, kContext4096, fewer)) << fewer << " stages fit";
  }
  EXPECT_EQ(p.stages.size(), expected_stages) << p.reason;
  EXPECT_EQ(slowest_stage_read(p, m), least_slowest_stage_read(nodes, m, kContext4096, expected_stages)) << p.reason;
  const double speed = nodes[0].weight_bytes_per_second;
  const double read_seconds = static_cast<double>(model.read_per_token(Count::Bytes)) / speed;
  const double hops_seconds = kDefaultHopSeconds * static_cast<double>(expected_stages - 1);
  EXPECT_NEAR(p.predicted_seconds_per_token, read_seconds + hops_seconds, 1e-12 * read_seconds);
  EXPECT_LT(p.predicted_seconds_per_token * 10, static_cast<double>(model.held(Count::Bytes)) / speed);
}

// Every node takes part, with layers in proportion to its memory (the floor or the ceiling of
// its share), each stage obeying the memory rule; the time predicted is the bytes read.
void expect_memory_strategy_is_memory_weighted(const std::vector<NodeCapacity>& nodes, const PublishedModel& model) {
  const ModelFootprint m = model.footprint();
  const Placement p = place_layers(nodes, m, {kContext4096, Strategy::Memory});
  expect_valid(p, nodes, m, kContext4096);
  double memory = 0;
  for (const NodeCapacity& node : nodes) memory += static_cast<double>(node.memory_bytes);
  std::map<std::string, int> counts = layers_per_node(p);
  ASSERT_EQ(counts.size(), nodes.size()) << p.reason;
  for (const NodeCapacity& node : nodes) {
    const double share = m.layer_count * static_cast<double>(node.memory_bytes) / memory;
    EXPECT_GE(counts[node.id], static_cast<int>(std::floor(share))) << node.id << "\n" << p.reason;
    EXPECT_LE(counts[node.id], static_cast<int>(std::ceil(share))) << node.id << "\n" << p.reason;
  }
  EXPECT_NEAR(p.predicted_seconds_per_token, pipeline_seconds(p.stages, nodes, m, kDefaultHopSeconds),
              1e-12 * p.predicted_seconds_per_token);
}

// gpt-oss in unsloth's F16 file: its attention and other matrices in 16 bits, the larger of the
// two by 1.8 GiB.
TEST(PublishedMoeModel, GptOss120bOnTheSeedsFourNodes) {
  const auto nodes = seed_cluster();  // 16, 16, 32 and 32 GB
  const PublishedModel model = gpt_oss_120b(kF16);
  const ModelFootprint m = model.footprint();
  // 65 GB with its KV: more than two 32 GB nodes hold, within the four's 96 GB.
  const uint64_t need = stage_need(m, kContext4096, 0, m.layer_count);
  ASSERT_GT(need, 64 * kGB);
  ASSERT_LT(need, 96 * kGB);
  expect_speed_strategy_reads_only_active_bytes(nodes, model, 3);
  expect_memory_strategy_is_memory_weighted(nodes, model);
  // 36 layers over 16:16:32:32 is exactly 6, 6, 12 and 12.
  EXPECT_EQ(layers_per_node(place_layers(nodes, m, {kContext4096, Strategy::Memory})),
            (std::map<std::string, int>{{"a", 6}, {"b", 6}, {"c", 12}, {"d", 12}}));
}

TEST(PublishedMoeModel, GptOss120bOnFourTimesTheSeedsNodes) {
  const auto nodes = four_times(seed_cluster());  // 64, 64, 128 and 128 GB
  const PublishedModel model = gpt_oss_120b(kF16);
  const ModelFootprint m = model.footprint();
  // One 128 GB node holds it all: no hop.
  ASSERT_LT(stage_need(m, kContext4096, 0, m.layer_count), 128 * kGB);
  expect_speed_strategy_reads_only_active_bytes(nodes, model, 1);
  expect_memory_strategy_is_memory_weighted(nodes, model);
}

TEST(PublishedMoeModel, Qwen3_235bDoesNotFitTheSeedsFourNodes) {
  const auto nodes = seed_cluster();  // 16, 16, 32 and 32 GB
  const ModelFootprint m = qwen3_235b_a22b_q4_k_m().footprint();
  // Every node holds a layer, so all 96 GB count; the model needs every byte of every expert.
  for (const NodeCapacity& node : nodes) ASSERT_LE(stage_need(m, kContext4096, 1, 2), node.memory_bytes);
  const uint64_t missing = stage_need(m, kContext4096, 0, m.layer_count) - 96 * kGB;
  for (Strategy strategy : {Strategy::Speed, Strategy::Memory}) {
    try {
      place_layers(nodes, m, {kContext4096, strategy});
      ADD_FAILURE() << "a 143 GB model placed in 96 GB";
    } catch (const DoesNotFit& e) {
      EXPECT_EQ(e.missing_bytes(), missing);
      EXPECT_NE(std::string(e.what()).find(units::describe_bytes(missing) + " missing"), std::string::npos) << e.what();
    }
  }
}

TEST(PublishedMoeModel, Qwen3_235bOnFourTimesTheSeedsNodes) {
  const auto nodes = four_times(seed_cluster());  // 64, 64, 128 and 128 GB
  const PublishedModel model = qwen3_235b_a22b_q4_k_m();
  const ModelFootprint m = model.footprint();
  // 143 GB: more than a 128 GB node holds.
  ASSERT_GT(stage_need(m, kContext4096, 0, m.layer_count), 128 * kGB);
  expect_speed_strategy_reads_only_active_bytes(nodes, model, 2);
  expect_memory_strategy_is_memory_weighted(nodes, model);
}

}  // namespace
}  // namespace strata::cluster
