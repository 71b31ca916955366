// Paged key/value memory of one node's stage: fixed blocks of kKvBlock positions taken from
// one pool, a prefix index over the full blocks, and per-block reference counts.
//
// A full block is known by a hash chained over every token id up to its end (its parent's
// hash and its own ids). The index keeps each block's own ids and the serial number of the
// block before it, so a lookup compares ids and parents, never trusting a hash alone: a
// chain of matches is the same tokens from position 0, whatever the hash function does.
// Blocks in use by a sequence are pinned; unpinned blocks of the index stay cached until the
// pool needs them, least recently used first out.
#pragma once

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

}  // namespace strata::model
