// Predicted one-stream decode speed of larger clusters from the placement's cost model
// (cluster/tensor_groups.h): a 70B dense model and gpt-oss-120b on 4 and 8 equal nodes, on
// gigabit and on 10 GbE, as a pipeline of single nodes and as the placement's choice of groups.
// The footprints are built from the models' published shapes and their GGUF types' bits per
// weight, not read from files (which cannot be downloaded here); the assumptions are printed.
#include <cstdio>
#include <string>
#include <vector>

#include "cluster/tensor_groups.h"

namespace {

using strata::cluster::GroupPlacement;
using strata::cluster::LinkCost;
using strata::cluster::LinkCosts;
using strata::cluster::ModelFootprint;
using strata::cluster::NodeCapacity;
using strata::cluster::Strategy;

constexpr uint64_t kGB = 1'000'000'000;
constexpr uint64_t kContextTokens = 4096;
constexpr double kNodeSpeed = 25e9;  // bytes of quantized weights per second, one node
constexpr uint64_t kNodeMemory = 32 * kGB;

struct Shape {
  const char* name;
  int layers;
  uint64_t dim, heads, head_dim, kv_heads, vocab;
  uint64_t ffn;  // dense FFN width, or one expert's
  uint64_t experts, experts_per_token;
  double layer_bits;   // bits per weight of the layers' attention (and dense FFN)
  double expert_bits;  // of the experts
  double embedding_bits, head_bits;
};

// Llama 3.1 70B in Q4_K_M (about 4.85 bits per weight in its layers, Q4_K embedding, Q6_K head),
// gpt-oss-120b as shipped (MXFP4 experts at 4.25 bits, the rest Q8_0 at 8.5).
const Shape kShapes[] = {
    {"Llama-3.1-70B Q4_K_M", 80, 8192, 64, 128, 8, 128256, 28672, 0, 0, 4.85, 0.0, 4.5, 6.5625},
    {"gpt-oss-120b MXFP4", 36, 2880, 64, 64, 8, 201088, 2880, 128, 4, 8.5, 4.25, 8.5, 8.5},
};

uint64_t bytes(uint64_t weights, double bits) { return static_cast<uint64_t>(static_cast<double>(weights) * bits / 8.0); }

ModelFootprint footprint(const Shape& s) {
  ModelFootprint m;
  m.layer_count = s.layers;
  const uint64_t attention = 2 * s.dim * s.heads * s.head_dim + 2 * s.dim * s.kv_heads * s.head_dim;
  const uint64_t ffn = 3 * s.dim * s.ffn;
  const uint64_t attention_bytes = bytes(attention, s.layer_bits);
  const uint64_t held = s.experts > 0 ? attention_bytes + bytes(s.experts * ffn, s.expert_bits) + s.dim * s.experts * 4
                                      : attention_bytes + bytes(ffn, s.layer_bits);
  const uint64_t read = s.experts > 0
                            ? attention_bytes + bytes(s.experts_per_token * ffn, s.expert_bits) + s.dim * s.experts * 4
                            : held;
  m.layer_weight_bytes.assign(static_cast<size_t>(s.layers), held);
  m.layer_read_bytes.assign(static_cast<size_t>(s.layers), read);
  m.embedding_bytes = bytes(s.vocab * s.dim, s.embedding_bits);
  m.head_bytes = bytes(s.vocab * s.dim, s.head_bits);
  m.kv_bytes_per_layer_per_token = 2 * s.kv_heads * s.head_dim * 2;  // f16 keys and values
  // As cluster::model_footprint counts them: every layer's sums of o's and down's leaves (the
  // experts' with experts), two rows each.
  const uint64_t sums = 2 * s.dim * 4;
  m.layer_gathered_bytes.assign(static_cast<size_t>(s.layers), 2 * sums);
  m.layer_gathers.assign(static_cast<size_t>(s.layers), 2);
  m.head_gathered_bytes = s.vocab * 4;
  return m;
}

std::string describe(const GroupPlacement& p) {
  std::string text;
  for (const auto& stage : p.stages) {
    text += text.empty() ? "" : " | ";
    for (size_t i = 0; i < stage.members.size(); ++i) text += (i > 0 ? "+" : "") + stage.members[i].node_id;
    text += " " + std::to_string(stage.first_layer) + "-" + std::to_string(stage.last_layer - 1);
  }
  return text;
}

}  // namespace

int main() {
  struct Network {
    const char* name;
    LinkCost link;
  };
  // One-way latency per exchange, software included.
  const Network networks[] = {{"1 GbE", {0.0002, 125e6}}, {"10 GbE", {0.00005, 1.25e9}}};
  std::printf("Assumptions: nodes of %.0f GB usable at %.0f GB/s of weights; KV for %llu positions (f16);\n"
              "1 GbE: 0.2 ms per exchange, 125 MB/s; 10 GbE: 0.05 ms, 1.25 GB/s; 0.3 ms per pipeline hop.\n\n",
              static_cast<double>(kNodeMemory) / 1e9, kNodeSpeed / 1e9,
              static_cast<unsigned long long>(kContextTokens));
  std::printf("| model | nodes | network | pipeline tokens/s | chosen tokens/s | chosen |\n|---|---|---|---|---|---|\n");
  for (const Shape& shape : kShapes) {
    const ModelFootprint m = footprint(shape);
    for (int count : {4, 8}) {
      std::vector<NodeCapacity> nodes;
      for (int i = 0; i < count; ++i) nodes.push_back({"n" + std::to_string(i + 1), kNodeMemory, kNodeSpeed});
      for (const Network& network : networks) {
        const LinkCosts links(network.link);
        ModelFootprint pipeline_only = m;
        pipeline_only.layer_gathered_bytes.clear();
        const GroupPlacement pipeline =
            strata::cluster::place_groups(nodes, pipeline_only, links, {kContextTokens, Strategy::Speed});
        const GroupPlacement chosen = strata::cluster::place_groups(nodes, m, links, {kContextTokens, Strategy::Speed});
        std::printf("| %s | %d | %s | %.2f | %.2f | %s |\n", shape.name, count, network.name,
                    1.0 / pipeline.predicted_seconds_per_token, 1.0 / chosen.predicted_seconds_per_token,
                    describe(chosen).c_str());
      }
    }
  }
  return 0;
}
