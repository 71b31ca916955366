// What a node says of itself to its peers (in every Hello), in the cluster's own terms: the
// protocol's NodeInfo, KvCacheStats and Weights (rpc/node.proto) as plain values, converted at
// the boundary (rpc/cluster_messages.h). No protobuf here, so that the cluster reasons about
// them, and the API renders them, without the protocol's generated code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::cluster_types {

// One KV pool of a stage: its blocks and what its prefix cache found.
struct KvPoolStats {
  std::string type;  // "f32" or "f16"
  uint64_t block_bytes = 0;
  int32_t pool_blocks = 0;
  int32_t used_blocks = 0;  // pinned by sequences or cached for reuse
  int32_t pinned_blocks = 0;
  uint64_t hits = 0;       // blocks found for new sequences
  uint64_t misses = 0;     // full blocks looked up and not found
  uint64_t evictions = 0;  // cached blocks dropped to make room
  bool operator==(const KvPoolStats&) const = default;
};

// A stage's KV pools: the full-attention layers' and, when it has sliding-window layers, theirs.
struct KvCacheStats : KvPoolStats {
  std::optional<KvPoolStats> window;
  bool operator==(const KvCacheStats&) const = default;
};

// What a node holds of the model's weights, and how fetching the rest from its peers goes.
struct Weights {
  bool whole_file = false;            // every tensor (a file given with -m, or one completed)
  std::vector<uint64_t> layer_bytes;  // otherwise, per layer: bytes of its tensors held, verified
  bool embedding = false;             // token_embd held
  bool head = false;                  // output_norm and the output matrix held
  bool shared = false;                // every tensor of no layer, embedding nor head (rope_freqs) held
  bool fetching = false;              // its layers' tensors are coming from peers now
  uint64_t received_bytes = 0;        // fetched from peers since this node started
  uint64_t fetch_received_bytes = 0;  // by the current (or last) fetch
  uint64_t wanted_bytes = 0;          // its layers' tensors it lacked when that fetch began
  uint64_t held_at_start_bytes = 0;   // of its layers' tensors, held before that fetch began
  double bytes_per_second = 0.0;      // over that fetch
  double eta_seconds = 0.0;           // 0 when done or unknown
  bool operator==(const Weights&) const = default;
};

// What a node measured of its link to a peer's tensor-parallel group links
// (parallel::GroupLinks::measure): what the placement weighs a group's gathers by.
struct LinkMeasure {
  std::string peer_id;
  double latency_seconds = 0.0;  // one way
  double bytes_per_second = 0.0;
  bool operator==(const LinkMeasure&) const = default;
};

struct NodeInfo {
  std::string node_id;
  std::string node_address;  // host:port of its node service
  std::string exchange_address;  // host:port of its tensor-parallel group links
  std::string api_address;   // host:port of its HTTP API
  std::string model_hash;    // of the GGUF's metadata and tensor table
  std::string model_name;
  uint32_t protocol_version = 0;
  uint64_t memory_bytes = 0;             // it may use for weights and KV cache
  double weight_bytes_per_second = 0.0;  // measured quantized mat-vec throughput
  std::string state;                     // rpc::kNodeStates
  uint64_t ready_epoch = 0;              // the placement whose layers it holds, loaded
  uint64_t held_sequences = 0;           // sequence states its stage holds now
  double load_progress = 0.0;            // 0..1 while loading
  bool leaving = false;                  // draining: placements leave it out
  std::optional<KvCacheStats> kv_cache;  // of its stage's pools, while it holds one
  uint64_t kv_memory_bytes = 0;          // its KV pool's size, whatever its layers (--kv-memory); 0: per layer
  uint64_t kv_bytes_per_layer = 0;       // else its pool's bytes per layer it runs
  uint64_t kv_bytes_per_window_layer = 0;  // and per sliding-window layer; 0: no such layer
  std::string instance;                    // random for each process: a restart says another
  int64_t started_unix_ms = 0;             // when this process started
  // Inputs its stage's layers have computed in this process, and when this description was
  // taken: the dashboard's tokens/s of every node.
  uint64_t stage_inputs = 0;
  int64_t described_unix_ms = 0;
  std::vector<LinkMeasure> links;  // to its peers' group links, as far as it has measured them
  // nullopt from a node of an older version, which says nothing of them: it has its own file.
  std::optional<Weights> weights;
  bool operator==(const NodeInfo&) const = default;
};

}  // namespace strata::cluster_types
