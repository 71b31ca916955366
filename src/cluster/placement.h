// Which node runs which layers: a pure, deterministic function of the nodes' capacities and the
// model's footprint. No I/O. The pipeline order is the placement's own choice, searched in
// node-id order, so the same nodes in any input order give the same placement.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cluster/model_footprint.h"

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
  // the request's kv_tokens as the model's footprint stores them. Of a sliding-window layer, the
  // KV of its windows (its own --parallel); 0: the footprint's window_kv_tokens.
  uint64_t kv_bytes_per_layer = 0;
  uint64_t kv_bytes_per_window_layer = 0;
  // A tensor-parallel group placed as one node (tensor_groups.h): what its exchanges of rows add
  // to a token, per exchange (the footprint's gathers) and per byte the footprint says it
  // gathers. 0 for a node alone.
  double seconds_per_exchange = 0.0;
  double seconds_per_gathered_byte = 0.0;
  // And per token: the calls that start each step on its members, made at once.
  double seconds_per_step = 0.0;
};

enum class Strategy {
  // Every node that can hold a layer takes part, with layers in proportion to its usable memory
  // (largest remainder), moved as little as the memory rule needs.
  Memory,
  // The least predicted time per token for one stream: Σ stage bytes read per token / node
  // speed (+ a group's exchanges) + hop × (stages − 1). Nodes not needed stay out. Ties go to the faster slowest
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

// A member of a tensor-parallel group (cluster/tensor_groups.h).
struct GroupMember {
  std::string node_id;
  double share = 0.0;  // of every layer's heads and rows: the group's shares add up to 1
  bool operator==(const GroupMember&) const = default;
};

struct Stage {
  std::string node_id;  // a group's first member
  int first_layer = 0;
  int last_layer = 0;  // exclusive
  // A tensor-parallel group that computes the stage together, in member order, node_id first;
  // empty: node_id alone.
  std::vector<GroupMember> group = {};
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
// node's kv_pool_bytes, or kv_tokens × kv bytes per layer per token × its layer count, a
// sliding-window layer's at its window_kv_tokens)
// (+ embedding when first, + head when last) ≤ its node's memory_bytes.
// Throws DoesNotFit, or std::invalid_argument for unusable input (no layers, a layer that
// reads more bytes than it holds, duplicate or empty node ids, a speed that is not positive and
// finite).
Placement place_layers(std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                       const PlacementRequest& request);

// What the speed strategy predicts per token for `stages`, stage i run by stage_nodes[i] (a
// group as one node, tensor_groups.h): each stage's reads and exchanges, and a hop before every
// stage after the first. Throws std::invalid_argument when the two do not pair up.
double predicted_seconds_per_token(std::span<const Stage> stages, std::span<const NodeCapacity> stage_nodes,
                                   const ModelFootprint& model, const PlacementRequest& request);

// For a placement fixed by hand: throws std::invalid_argument naming the first problem (gap,
// overlap, layers not covered, unknown or repeated node, memory rule broken: by a group's
// members for their shares).
void check_placement(const Placement& placement, std::span<const NodeCapacity> nodes,
                     const ModelFootprint& model, uint64_t kv_tokens);

// After nodes only left (lost or drained), so that the requests that wait meanwhile wait for
// the fewest layers to be prepared: the nodes of `current` that are still `members` keep their
// layers, and each gone stage's layers go to the stage before it (after it, for the first); a
// group goes on with the members it has left.
// nullopt when no stage's node is left or the result breaks the memory rule over `nodes`; a
// placement from scratch is then needed.
std::optional<Placement> repair_placement(const Placement& current, std::span<const std::string> members,
                                          std::span<const NodeCapacity> nodes, const ModelFootprint& model,
                                          uint64_t kv_tokens);

}  // namespace strata::cluster
