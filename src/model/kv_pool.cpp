#include "model/kv_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace strata::model {

std::optional<KvType> parse_kv_type(std::string_view name) {
  if (name == "f32") return KvType::F32;
  if (name == "f16") return KvType::F16;
  return std::nullopt;
}

const char* kv_type_name(KvType type) { return type == KvType::F16 ? "f16" : "f32"; }

KvLayout::KvLayout(const Config& config, int layer_count, KvType type)
    : layer_count(layer_count),
      kv_heads(config.kv_head_count),
      key_dim(config.head_dim),
      value_dim(config.cached_value_dim()),
      type(type),
      element_bytes(kv_element_bytes(type)),
      key_elements(static_cast<size_t>(key_dim) * kKvBlock),
      value_elements(static_cast<size_t>(value_dim) * kKvBlock),
      block_bytes(static_cast<size_t>(layer_count) * kv_heads * (key_elements + value_elements) * element_bytes) {}

uint64_t chain_hash(uint64_t parent, std::span<const Token> ids) {
  // FNV-1a over the ids from the parent's hash, then a splitmix64 finish so that chains
  // differing in one id spread over all 64 bits.
  uint64_t h = parent ^ 0xcbf29ce484222325ull;
  for (Token id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

KvPool::KvPool(KvLayout layout, int block_count, Hasher hasher)
    : layout_(layout), hasher_(hasher), blocks_(static_cast<size_t>(std::max(0, block_count))) {
  // Lowest blocks first out, so that a lightly used pool touches little memory.
  for (int b = block_count - 1; b >= 0; --b) free_.push_back(b);
}

KvPoolStats KvPool::stats() const {
  const int used = pinned_ + static_cast<int>(cached_.size());
  return {hits_, misses_, evictions_, block_count(), used, pinned_, layout_.block_bytes};
}

std::optional<int> KvPool::allocate() {
  int block = 0;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!cached_.empty()) {
    block = cached_.front();
    cached_.pop_front();
    unpublish(block);
    ++evictions_;
  } else {
    return std::nullopt;
  }
  Block& b = blocks_[static_cast<size_t>(block)];
  if (!b.data) b.data.reset(new std::byte[layout_.block_bytes]);
  b.refs = 1;
  ++pinned_;
  return block;
}

void KvPool::pin(int block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.refs++ == 0) {
    cached_.erase(b.lru);
    ++pinned_;
  }
}

void KvPool::unpin(int block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.refs <= 0) throw std::logic_error("unpinning a KV block that is not pinned");
  if (--b.refs > 0) return;
  --pinned_;
  if (b.published) {
    b.lru = cached_.insert(cached_.end(), block);
  } else {
    free_.push_back(block);
  }
}

std::byte* KvPool::data(int block) { return blocks_[static_cast<size_t>(block)].data.get(); }

const std::byte* KvPool::data(int block) const { return blocks_[static_cast<size_t>(block)].data.get(); }

bool KvPool::same_ids(const Block& b, std::span<const Token> ids) const {
  return std::equal(ids.begin(), ids.end(), b.ids.begin(), b.ids.end());
}

int KvPool::match(std::span<const Token> tokens, std::vector<int>& blocks, std::vector<Link>& links) {
  const int full = static_cast<int>(tokens.size() / kKvBlock);
  Link parent;
  int found = 0;
  for (; found < full; ++found) {
    const auto ids = tokens.subspan(static_cast<size_t>(found) * kKvBlock, kKvBlock);
    const uint64_t hash = hasher_(parent.hash, ids);
    const auto entry = index_.find(hash);
    if (entry == index_.end()) break;
    const Block& b = blocks_[static_cast<size_t>(entry->second)];
    if (b.parent_serial != parent.serial || !same_ids(b, ids)) break;
    pin(entry->second);
    blocks.push_back(entry->second);
    parent = {hash, b.serial};
    links.push_back(parent);
  }
  hits_ += static_cast<uint64_t>(found);
  misses_ += static_cast<uint64_t>(full - found);
  return found;
}

std::optional<KvPool::Link> KvPool::publish(int block, Link parent, std::span<const Token> ids) {
  if (ids.size() != kKvBlock) throw std::logic_error("only full KV blocks are published");
  const uint64_t hash = hasher_(parent.hash, ids);
  if (const auto entry = index_.find(hash); entry != index_.end()) {
    const Block& held = blocks_[static_cast<size_t>(entry->second)];
    if (held.parent_serial == parent.serial && same_ids(held, ids)) return Link{hash, held.serial};
    return std::nullopt;
  }
  enter(block, hash, parent, ids);
  return Link{hash, blocks_[static_cast<size_t>(block)].serial};
}

std::optional<int> KvPool::find_beside(Link parent, std::span<const Token> ids) const {
  const auto entry = index_.find(hasher_(parent.hash, ids));
  if (entry == index_.end()) return std::nullopt;
  const Block& b = blocks_[static_cast<size_t>(entry->second)];
  if (b.parent_serial != parent.serial || !same_ids(b, ids)) return std::nullopt;
  return entry->second;
}

void KvPool::publish_beside(int block, Link parent, std::span<const Token> ids) {
  if (ids.size() != kKvBlock) throw std::logic_error("only full KV blocks are published");
  const uint64_t hash = hasher_(parent.hash, ids);
  if (const auto entry = index_.find(hash); entry != index_.end()) {
    const int held = entry->second;
    const Block& b = blocks_[static_cast<size_t>(held)];
    if (b.parent_serial == parent.serial && same_ids(b, ids)) return;
    unpublish(held);
    if (b.refs == 0) {  // it was cached for a chain no lookup can follow any more
      cached_.erase(b.lru);
      free_.push_back(held);
    }
  }
  enter(block, hash, parent, ids);
}

void KvPool::count_lookups(int hits, int misses) {
  hits_ += static_cast<uint64_t>(hits);
  misses_ += static_cast<uint64_t>(misses);
}

void KvPool::enter(int block, uint64_t hash, Link parent, std::span<const Token> ids) {
  Block& b = blocks_[static_cast<size_t>(block)];
  b.published = true;
  b.hash = hash;
  b.serial = next_serial_++;
  b.parent_serial = parent.serial;
  std::copy(ids.begin(), ids.end(), b.ids.begin());
  index_.emplace(hash, block);
}

void KvPool::unpublish(int block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  index_.erase(b.hash);
  b.published = false;
}

int window_blocks_needed(int window, int positions, int step_inputs) {
  const int all = (positions + kKvBlock - 1) / kKvBlock;
  if (window <= 0) return all;
  // The step's first input reads window - 1 positions before it; they and its inputs start
  // anywhere in a block and end anywhere in another.
  return std::min(all, (window - 1 + std::max(1, step_inputs) - 1) / kKvBlock + 2);
}

namespace {

int count_windowed(const Config& config, LayerRange range, bool windowed) {
  int count = 0;
  for (int l = range.first; l < range.last; ++l) count += config.is_sliding(l) == windowed ? 1 : 0;
  return count;
}

}  // namespace

KvMemory::KvMemory(const Config& config, LayerRange range, KvBlockCounts blocks, KvType type)
    : full_(KvLayout(config, count_windowed(config, range, false), type), blocks.full) {
  const int window_layers = count_windowed(config, range, true);
  int slots[2] = {0, 0};
  for (int l = range.first; l < range.last; ++l) {
    const bool sliding = config.is_sliding(l);
    windowed_.push_back(sliding);
    slot_.push_back(slots[sliding ? 1 : 0]++);
  }
  if (window_layers > 0) {
    window_size_ = config.sliding_window;
    window_ = std::make_unique<KvPool>(KvLayout(config, window_layers, type), blocks.window);
  }
}

}  // namespace strata::model
