// Which node runs which layers: a pure, deterministic function of the nodes' capacities and the
// model's footprint. No I/O. The pipeline order is the placement's own choice, searched in
// node-id order, so the same nodes in any input order give the same placement.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace strata::cluster {

// What a node holds of the model's weights: all of them (its own file) unless it says
// otherwise (a node that fetched some from its peers).
struct Holdings {
  bool everything = true;
  std::vector<uint64_t> layer_bytes;  // otherwise: per layer, bytes of its tensors held
  bool embedding = false;
  bool head = false;
};

// What a node offers, as it reports it (see node_resources.h).
struct NodeCapacity {
  std::string id;
  uint64_t memory_bytes = 0;             // usable for weights and KV cache
  double weight_bytes_per_second = 0.0;  // quantized weights streamed through a mat-vec
  Holdings held;
  uint64_t kv_pool_bytes = 0;  // a KV pool of this size whatever its layers (--kv-memory); 0: per layer
  // Else the KV it keeps per layer it runs (its own --ctx-size × --parallel and --kv-type); 0:
  // the request's kv_tokens as the model's footprint stores them.
  uint64_t kv_bytes_per_layer = 0;
};

// What a model needs, per part that a stage may hold. Memory counts every byte a stage holds;
// speed, the bytes it reads per token.
struct ModelFootprint {
  int layer_count = 0;
  std::vector<uint64_t> layer_weight_bytes;  // one entry per layer: every byte of its tensors
  uint64_t embedding_bytes = 0;              // token embedding: first stage only (a token reads one row)
  uint64_t head_bytes = 0;                   // output norm and matrix: last stage only, read whole
  uint64_t kv_bytes_per_layer_per_token = 0;
  // Per layer, the bytes one token reads: of a Mixture-of-Experts layer only the experts it
  // runs (expert_used_count of expert_count), far less than it holds. Empty: every byte (a
  // dense model).
  std::vector<uint64_t> layer_read_bytes;
};

// What part of the model a tensor is, by its name: the one rule that placement, fetching and
// the weights a node reports all follow.
struct TensorRole {
  enum Kind {
    Layer,         // blk.N.*: read by the stage that runs layer N
    Embedding,     // token_embd: the first stage (and the last, when the head is tied)
    OutputMatrix,  // output.weight: the last stage
    OutputNorm,    // output_norm: the last stage
    Shared,        // anything else (rope_freqs): every stage reads it
    Unused,        // blk.N.* of a block after the model's layers (GLM's NextN): no stage reads it
  };
  Kind kind = Shared;
  int layer = -1;  // for Layer
  // For Layer: a tensor of experts (blk.N.ffn_gate_exps, _up_exps, _down_exps, their biases),
  // the expert count its last dimension, of which a token reads only the experts it runs.
  bool experts = false;
};
// `skipped_layer_count` blocks follow the `layer_count` layers (Config::skipped_layer_count).
// Throws std::runtime_error for a blk. name that names no block of them.
TensorRole role_of_tensor(std::string_view name, int layer_count, int skipped_layer_count = 0);

// Sizes from the file's metadata and tensor table (blk.N.* per layer; a head tied to token_embd
// still costs its bytes on the last stage). A layer's tensors of experts are read at
// expert_used_count / expert_count of their bytes. Throws std::runtime_error for a file that is
// not a model, or whose tensors of experts do not match its expert count.
ModelFootprint footprint_of(const gguf::File& file);

enum class Strategy {
  // Every node that can hold a layer takes part, with layers in proportion to its usable memory
  // (largest remainder), moved as little as the memory rule needs.
  Memory,
  // The least predicted time per token for one stream: Σ stage bytes read per token / node
  // speed + hop × (stages − 1). Nodes not needed stay out. Ties go to the faster slowest
  // stage, then to the first pipeline found, the search going in node-id order.
  Speed,
};

inline constexpr double kDefaultHopSeconds = 0.0003;
inline constexpr double kDefaultKeepTolerance = 0.05;

// Either strategy prefers nodes to keep the weights they hold: among equal placements, the one
// that leaves the fewest bytes to fetch; and with Speed, the placement that leaves the fewest
// bytes to fetch (then the fastest such) when it is predicted at most `keep_tolerance` slower
// than the fastest.
struct PlacementRequest {
  uint64_t kv_tokens = 0;  // KV positions reserved per layer: ctx_size × parallel
  Strategy strategy = Strategy::Speed;
  double hop_seconds = kDefaultHopSeconds;  // added per hand-over between stages
  double keep_tolerance = kDefaultKeepTolerance;
};

struct Stage {
  std::string node_id;
  int first_layer = 0;
  int last_layer = 0;  // exclusive
  bool operator==(const Stage&) const = default;
};

struct Placement {
  uint64_t epoch = 0;  // set by the caller; place_layers leaves it 0
  std::vector<Stage> stages;  // pipeline order, contiguous, covering [0, layer_count)
  std::string reason;         // for people: per node memory used/usable and time per token
  double predicted_seconds_per_token = 0.0;
  uint64_t fetch_bytes = 0;  // weights the nodes must fetch, not holding them
};

// The model cannot be placed on the nodes: missing_bytes() more usable memory would be needed
// in total (0 when there is enough in total but no contiguous split fits).
class DoesNotFit : public std::runtime_error {
 public:
  DoesNotFit(const std::string& message, uint64_t missing_bytes)
      : std::runtime_error(message), missing_bytes_(missing_bytes) {}
  uint64_t missing_bytes() const { return missing_bytes_; }

 private:
  uint64_t missing_bytes_;
};

// Memory rule, for every stage: its layers' weights (every byte, all experts) + its KV (the
// node's kv_pool_bytes, or kv_tokens × kv bytes per layer per token × its layer count)
// (+ embedding when first, + head when last) ≤ its node's memory_bytes.
// Throws DoesNotFit, or std::invalid_argument for unusable input (no layers, a layer that
// reads more bytes than it holds, duplicate or empty node ids, a speed that is not positive and
// finite).
Placement place_layers(std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                       const PlacementRequest& request);

// For a placement fixed by hand: throws std::invalid_argument naming the first problem (gap,
// overlap, layers not covered, unknown or repeated node, memory rule broken).
void check_placement(const Placement& placement, std::span<const NodeCapacity> nodes,
                     const ModelFootprint& model, uint64_t kv_tokens);

// After nodes only left (lost or drained), so that the requests that wait meanwhile wait for
// the fewest layers to be prepared: the nodes of `current` that are still `members` keep their
// layers, and each gone stage's layers go to the stage before it (after it, for the first).
// nullopt when no stage's node is left or the result breaks the memory rule over `nodes`; a
// placement from scratch is then needed.
std::optional<Placement> repair_placement(const Placement& current, std::span<const std::string> members,
                                          std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                                          uint64_t kv_tokens);

}  // namespace strata::cluster
