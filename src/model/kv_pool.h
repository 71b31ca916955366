// Paged key/value memory of one node's stage: fixed blocks of kKvBlock positions taken from
// a pool, a prefix index over the full blocks, and per-block reference counts; and a stage's
// memory as one such pool for its layers that attend over every position and another for its
// sliding-window layers, whose old blocks a sequence lets go as its window moves on.
//
// A full block is known by a hash chained over every token id up to its end (its parent's
// hash and its own ids). The index keeps each block's own ids and the serial number of the
// block before it, so a lookup compares ids and parents, never trusting a hash alone: a
// chain of matches is the same tokens from position 0, whatever the hash function does.
// Blocks in use by a sequence are pinned; unpinned blocks of the index stay cached until the
// pool needs them, least recently used first out.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "tensor/vector_ops.h"

namespace strata::model {

using Token = int32_t;

inline constexpr int kKvBlock = tensor::kKeyBlock;

enum class KvType { F32, F16 };
std::optional<KvType> parse_kv_type(std::string_view name);  // "f32", "f16"
const char* kv_type_name(KvType type);
inline size_t kv_element_bytes(KvType type) { return type == KvType::F16 ? 2 : 4; }

// Rows of a position's keys (or values) over the KV heads, one per position, each as a pool of
// `type` stores it: the form in which a sequence's state moves between stages, bit for bit.
struct KvRows {
  KvType type = KvType::F32;
  std::vector<uint8_t> bytes;
  size_t elements() const { return bytes.size() / kv_element_bytes(type); }
};

// Where keys and values lie in a block: per layer, per KV head, its keys dimension-major (the
// layout tensor::key_scores reads), then per KV head its values position-major. A KV head's
// keys are key_dim wide and its values value_dim (0 with latent attention, whose values are
// its keys' latent).
struct KvLayout {
  KvLayout(const Config& config, int layer_count, KvType type);
  int layer_count;
  int kv_heads;
  int key_dim;
  int value_dim;
  KvType type;
  size_t element_bytes;
  size_t key_elements;    // one KV head's keys of a block
  size_t value_elements;  // one KV head's values of a block
  size_t block_bytes;
  size_t key_offset(int layer, int kv_head) const {
    return (static_cast<size_t>(layer) * kv_heads * (key_elements + value_elements) +
            static_cast<size_t>(kv_head) * key_elements) *
           element_bytes;
  }
  size_t value_offset(int layer, int kv_head) const {
    return key_offset(layer, kv_heads) + static_cast<size_t>(kv_head) * value_elements * element_bytes;
  }
  // Of one position: the elements of its keys, and of its values, over the KV heads.
  size_t key_row_elements() const { return static_cast<size_t>(kv_heads) * key_dim; }
  size_t value_row_elements() const { return static_cast<size_t>(kv_heads) * value_dim; }
};

// The chain hash of a block: its parent's chain hash and its own ids.
uint64_t chain_hash(uint64_t parent, std::span<const Token> ids);

struct KvPoolStats {
  uint64_t hits = 0;       // blocks found in the index for a new sequence
  uint64_t misses = 0;     // full blocks looked up and not found
  uint64_t evictions = 0;  // cached blocks dropped to make room
  int blocks = 0;          // the pool's size
  int used_blocks = 0;     // pinned or cached
  int pinned_blocks = 0;   // in use by a sequence
  size_t block_bytes = 0;
};

// Not thread-safe: its owner serializes the calls.
class KvPool {
 public:
  using Hasher = uint64_t (*)(uint64_t parent, std::span<const Token> ids);
  // A position in a chain of published blocks: the root (before position 0) is {0, 0}.
  struct Link {
    uint64_t hash = 0;
    uint64_t serial = 0;
  };

  KvPool(KvLayout layout, int block_count, Hasher hasher = chain_hash);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int block_count() const { return static_cast<int>(blocks_.size()); }
  KvPoolStats stats() const;

  // A block pinned once: a free one, else the least recently used cached one, which leaves
  // the index. Empty when every block is pinned.
  std::optional<int> allocate();
  void pin(int block);
  // At the last unpin a published block is cached (most recently used), another is freed.
  void unpin(int block);
  std::byte* data(int block);
  const std::byte* data(int block) const;

  // Pins the longest run of leading full blocks of `tokens` that the index holds and appends
  // them and their links to `blocks` and `links`. Returns the count.
  int match(std::span<const Token> tokens, std::vector<int>& blocks, std::vector<Link>& links);
  // Enters `block`, pinned and now full of the keys and values of `ids` after the chain
  // `parent`, in the index. Returns the link that continues the chain: this block's, or that
  // of the block already indexed for the same ids and parent (this one then stays private).
  // Empty when another chain holds the hash: the sequence can publish no further.
  std::optional<Link> publish(int block, Link parent, std::span<const Token> ids);

  // A pool whose blocks follow another pool's chain (a stage's window pool beside its full
  // one): its index holds blocks by the other chain's links, which verify their tokens.
  // The block entered for `ids` after the chain's `parent`, neither pinned nor counted.
  std::optional<int> find_beside(Link parent, std::span<const Token> ids) const;
  // Enters `block`, pinned and full of the keys and values of `ids`, after the other chain's
  // `parent`; an entry of the same hash after another parent (left there by a chain that the
  // other pool has since let go) gives way. A block already entered for them stays private.
  void publish_beside(int block, Link parent, std::span<const Token> ids);
  // Of find_beside's lookups for new sequences.
  void count_lookups(int hits, int misses);

 private:
  struct Block {
    std::unique_ptr<std::byte[]> data;  // allocated at first use
    int refs = 0;
    bool published = false;
    uint64_t hash = 0;
    uint64_t serial = 0;
    uint64_t parent_serial = 0;
    std::array<Token, kKvBlock> ids{};
    std::list<int>::iterator lru;  // when cached
  };
  bool same_ids(const Block& b, std::span<const Token> ids) const;
  void enter(int block, uint64_t hash, Link parent, std::span<const Token> ids);
  void unpublish(int block);

  KvLayout layout_;
  Hasher hasher_;
  std::vector<Block> blocks_;
  std::vector<int> free_;
  std::list<int> cached_;  // unpinned published blocks, least recently used first
  std::unordered_map<uint64_t, int> index_;  // chain hash -> block
  uint64_t next_serial_ = 1;
  int pinned_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  uint64_t evictions_ = 0;
};

// Blocks of a stage's two pools, or that sequences need of them.
struct KvBlockCounts {
  int full = 0;    // of its layers that attend over every position
  int window = 0;  // of its sliding-window layers; a pool of 0: it has none
  bool operator==(const KvBlockCounts&) const = default;
  KvBlockCounts& operator+=(const KvBlockCounts& more) {
    full += more.full;
    window += more.window;
    return *this;
  }
  // Whether these blocks fit in pools of `pools` blocks, a pool of 0 setting no limit.
  bool fit_in(const KvBlockCounts& pools) const {
    return (pools.full == 0 || full <= pools.full) && (pools.window == 0 || window <= pools.window);
  }
};

// The first position a sliding-window layer reads for an input at `position`.
inline int window_start(int window, int position) { return window > 0 ? std::max(0, position - window + 1) : 0; }
// Window-pool blocks a sequence holds at most while a step feeds up to `step_inputs` inputs and
// after, until its next step: those of the window before the step's first input and the step's
// own, never more than its `positions`' blocks.
int window_blocks_needed(int window, int positions, int step_inputs);

// A stage's KV memory for its layer range: the blocks of its full-attention layers, and the
// prefix index, in one pool; those of its sliding-window layers, which a sequence lets go once
// its window has moved past them, in another whose index follows the first's chain. A range
// without full-attention layers still keeps the chain in a pool of blocks without data.
class KvMemory {
 public:
  KvMemory(const Config& config, LayerRange range, KvBlockCounts blocks, KvType type);
  KvMemory(const KvMemory&) = delete;
  KvMemory& operator=(const KvMemory&) = delete;

  KvPool& full() { return full_; }
  const KvPool& full() const { return full_; }
  KvPool* window() { return window_.get(); }  // null without sliding-window layers
  const KvPool* window() const { return window_.get(); }
  int window_size() const { return window_size_; }  // 0 without sliding-window layers
  KvType type() const { return full_.layout().type; }
  KvBlockCounts blocks() const { return {full_.block_count(), window_ ? window_->block_count() : 0}; }

  // Layer `layer` of the range (from 0): whether it slides, and where its keys and values lie
  // in its pool's blocks (its index among the layers of that pool).
  bool windowed(int layer) const { return windowed_[static_cast<size_t>(layer)]; }
  int slot(int layer) const { return slot_[static_cast<size_t>(layer)]; }
  KvPool& pool_of(int layer) { return windowed(layer) ? *window_ : full_; }
  const KvPool& pool_of(int layer) const { return windowed(layer) ? *window_ : full_; }
  int layer_count() const { return static_cast<int>(windowed_.size()); }

 private:
  std::vector<bool> windowed_;
  std::vector<int> slot_;
  int window_size_ = 0;
  KvPool full_;
  std::unique_ptr<KvPool> window_;
};

}  // namespace strata::model
