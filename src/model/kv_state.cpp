#include "model/kv_state.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "tensor/fp16.h"

namespace strata::model {
namespace {

int blocks_for(int positions) { return (positions + kKvBlock - 1) / kKvBlock; }

// Copies `count` elements of T from `from` to `to`, `from_stride` and `to_stride` elements
// apart: a head's keys between a block (dimension-major) and a row.
template <typename T>
void copy_strided(const void* from, size_t from_stride, void* to, size_t to_stride, int count) {
  const auto* in = static_cast<const unsigned char*>(from);
  auto* out = static_cast<unsigned char*>(to);
  for (int i = 0; i < count; ++i) {
    std::memcpy(out + static_cast<size_t>(i) * to_stride * sizeof(T), in + static_cast<size_t>(i) * from_stride * sizeof(T),
                sizeof(T));
  }
}

void copy_strided(KvType type, const void* from, size_t from_stride, void* to, size_t to_stride, int count) {
  if (type == KvType::F16) {
    copy_strided<uint16_t>(from, from_stride, to, to_stride, count);
  } else {
    copy_strided<float>(from, from_stride, to, to_stride, count);
  }
}

}  // namespace

KvState::KvState(std::shared_ptr<KvMemory> memory, int capacity) : memory_(std::move(memory)), capacity_(capacity) {}

KvState::~KvState() { truncate(0); }

int KvState::first_held(int layer) const {
  if (!memory_->windowed(layer)) return 0;
  for (size_t b = static_cast<size_t>(window_from_); b < window_blocks_.size(); ++b) {
    if (window_blocks_[b] >= 0) return std::min(size_, static_cast<int>(b) * kKvBlock);
  }
  return size_;
}

int KvState::hold_prefix(std::span<const Token> tokens) {
  if (size_ != 0 || !blocks_.empty()) throw std::logic_error("only a new sequence takes a cached prefix");
  int held = memory_->full().match(tokens, blocks_, links_);
  if (KvPool* window = memory_->window(); window != nullptr && held > 0) {
    // The window pool's blocks of the matched run, found by the full chain's links; the run is
    // cut back until the window of the input after it is all there.
    std::vector<int> found(static_cast<size_t>(held), -1);
    int misses = 0;
    for (int b = 0; b < held; ++b) {
      const auto ids = tokens.subspan(static_cast<size_t>(b) * kKvBlock, kKvBlock);
      const auto block = window->find_beside(b == 0 ? KvPool::Link{} : links_[static_cast<size_t>(b) - 1], ids);
      found[static_cast<size_t>(b)] = block.value_or(-1);
    }
    const auto first_read = [&](int blocks) { return window_start(memory_->window_size(), blocks * kKvBlock) / kKvBlock; };
    while (held > 0 && std::any_of(found.begin() + first_read(held), found.begin() + held, [](int b) { return b < 0; })) {
      --held;
      ++misses;
    }
    window_blocks_.assign(static_cast<size_t>(held), -1);
    window_from_ = first_read(held);
    for (int b = window_from_; b < held; ++b) {
      window->pin(found[static_cast<size_t>(b)]);
      window_blocks_[static_cast<size_t>(b)] = found[static_cast<size_t>(b)];
    }
    window->count_lookups(held - window_from_, misses);
    while (static_cast<int>(blocks_.size()) > held) {
      memory_->full().unpin(blocks_.back());
      blocks_.pop_back();
    }
    links_.resize(static_cast<size_t>(held));
  }
  size_ = held * kKvBlock;
  ids_.assign(tokens.begin(), tokens.begin() + size_);
  return size_;
}

void KvState::truncate(int positions) {
  if (positions % kKvBlock != 0 || positions > size_) throw std::logic_error("a sequence keeps whole blocks only");
  const size_t keep = static_cast<size_t>(positions / kKvBlock);
  if (KvPool* window = memory_->window()) {
    const size_t first_read = static_cast<size_t>(window_start(memory_->window_size(), positions) / kKvBlock);
    if (positions > 0 && std::any_of(window_blocks_.begin() + static_cast<std::ptrdiff_t>(first_read),
                                     window_blocks_.begin() + static_cast<std::ptrdiff_t>(keep), [](int b) { return b < 0; })) {
      throw std::logic_error("the sliding-window layers no longer hold the window of position " + std::to_string(positions));
    }
    while (window_blocks_.size() > keep) {
      if (window_blocks_.back() >= 0) window->unpin(window_blocks_.back());
      window_blocks_.pop_back();
    }
    window_from_ = std::min(window_from_, static_cast<int>(keep));
  }
  // Last block first: in the pool's LRU order a prefix then outlives its continuations,
  // which no lookup can reach without it.
  while (blocks_.size() > keep) {
    memory_->full().unpin(blocks_.back());
    blocks_.pop_back();
  }
  links_.resize(std::min(links_.size(), keep));
  ids_.resize(std::min(ids_.size(), static_cast<size_t>(positions)));
  size_ = positions;
}

void KvState::rewind(int positions) {
  if (positions < 0 || positions > size_) throw std::logic_error("a sequence rewinds only to a position it holds");
  KvPool* window = memory_->window();
  const int whole = positions / kKvBlock * kKvBlock;
  const size_t partial = static_cast<size_t>(whole / kKvBlock);  // the block the next position falls in
  const size_t kept_blocks = static_cast<size_t>(blocks_for(positions));
  if (window != nullptr) {
    const size_t first_read = static_cast<size_t>(window_start(memory_->window_size(), positions) / kKvBlock);
    for (size_t b = first_read; b < kept_blocks; ++b) {
      if (window_blocks_[b] < 0) {
        throw std::logic_error("the sliding-window layers no longer hold the window of position " + std::to_string(positions));
      }
    }
  }
  // Last block first, as truncate lets them go.
  while (blocks_.size() > kept_blocks) {
    memory_->full().unpin(blocks_.back());
    blocks_.pop_back();
  }
  while (window != nullptr && window_blocks_.size() > kept_blocks) {
    if (window_blocks_.back() >= 0) window->unpin(window_blocks_.back());
    window_blocks_.pop_back();
  }
  const bool shared = positions > whole && partial < links_.size();  // full, and in (or from) the index
  links_.resize(std::min(links_.size(), partial));
  ids_.resize(std::min(ids_.size(), static_cast<size_t>(positions)));
  size_ = positions;
  if (!shared) return;
  // Let go of it first: a block nobody else holds stays in the index, its bytes as they are,
  // until the pool takes it for another, which may be this very allocation when the pool has
  // no other block. A copy then takes nothing from the index, and needs no block more. -1: let
  // go, with no copy.
  const auto own_copy = [](KvPool& pool, int& block) {
    const int original = block;
    pool.unpin(original);
    const std::optional<int> copy = pool.allocate();
    block = copy.value_or(-1);
    if (copy && *copy != original) std::memcpy(pool.data(*copy), pool.data(original), pool.layout().block_bytes);
    return copy.has_value();
  };
  const bool copied = own_copy(memory_->full(), blocks_[partial]) &&
                      (window == nullptr || window_blocks_[partial] < 0 || own_copy(*window, window_blocks_[partial]));
  if (copied) return;
  // Others hold it, and every other block: back to the whole blocks before it (a copy made,
  // or an original not yet let go, is let go now).
  if (blocks_[partial] >= 0) memory_->full().unpin(blocks_[partial]);
  blocks_.pop_back();
  if (window != nullptr && window_blocks_.size() > partial) {
    if (window_blocks_[partial] >= 0) window->unpin(window_blocks_[partial]);
    window_blocks_.pop_back();
  }
  ids_.resize(std::min(ids_.size(), static_cast<size_t>(whole)));
  size_ = whole;
  throw KvPoolFull("the KV pool has no room for a rewound sequence's block");
}

void KvState::record(std::span<const Token> ids) {
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  publish_full_blocks();
}

void KvState::publish_full_blocks() {
  KvPool* window = memory_->window();
  const size_t full = std::min(ids_.size(), static_cast<size_t>(size_)) / kKvBlock;
  while (publishing_ && links_.size() < full) {
    const size_t b = links_.size();
    const KvPool::Link parent = b == 0 ? KvPool::Link{} : links_[b - 1];
    const auto ids = std::span<const Token>(ids_).subspan(b * kKvBlock, kKvBlock);
    const auto link = memory_->full().publish(blocks_[b], parent, ids);
    if (!link) {
      publishing_ = false;
      break;
    }
    if (window != nullptr && b < window_blocks_.size() && window_blocks_[b] >= 0) {
      window->publish_beside(window_blocks_[b], parent, ids);
    }
    links_.push_back(*link);
  }
}

void KvState::let_window_go(int first_kept) {
  KvPool& window = *memory_->window();
  const int end = std::min(first_kept, static_cast<int>(window_blocks_.size()));
  // Oldest first, so that the pool's LRU order gives the oldest up first.
  for (int b = window_from_; b < end; ++b) {
    int& block = window_blocks_[static_cast<size_t>(b)];
    if (block >= 0) window.unpin(block);
    block = -1;
  }
  window_from_ = std::max(window_from_, end);
}

std::byte* KvState::block_data(int layer, int block) const {
  const std::vector<int>& table = memory_->windowed(layer) ? window_blocks_ : blocks_;
  return memory_->pool_of(layer).data(table[static_cast<size_t>(block)]);
}

void KvState::copy_rows(int layer, int first, int positions, uint8_t* keys, uint8_t* values, bool into_blocks) const {
  const KvLayout& layout = this->layout(layer);
  const int slot = memory_->slot(layer);
  const size_t element = layout.element_bytes;
  const size_t key_head_bytes = static_cast<size_t>(layout.key_dim) * element;
  const size_t value_head_bytes = static_cast<size_t>(layout.value_dim) * element;
  for (int position = first; position < positions; ++position) {
    std::byte* block = block_data(layer, position / kKvBlock);
    const size_t lane = static_cast<size_t>(position % kKvBlock);
    const size_t row = static_cast<size_t>(position - first);
    for (int h = 0; h < layout.kv_heads; ++h) {
      const size_t key_row = (row * layout.kv_heads + h) * key_head_bytes;
      const size_t value_row = (row * layout.kv_heads + h) * value_head_bytes;
      // Keys lie dimension-major in the block, values position-major.
      std::byte* block_keys = block + layout.key_offset(slot, h) + lane * element;
      std::byte* block_values = block + layout.value_offset(slot, h) + lane * value_head_bytes;
      if (into_blocks) {
        copy_strided(layout.type, keys + key_row, 1, block_keys, kKvBlock, layout.key_dim);
        std::memcpy(block_values, values + value_row, value_head_bytes);
      } else {
        copy_strided(layout.type, block_keys, kKvBlock, keys + key_row, 1, layout.key_dim);
        std::memcpy(values + value_row, block_values, value_head_bytes);
      }
    }
  }
}

void KvState::read(int layer, KvRows& keys, KvRows& values) const {
  if (layer < 0 || layer >= memory_->layer_count()) throw std::invalid_argument("layer " + std::to_string(layer) + " is not held here");
  const KvLayout& layout = this->layout(layer);
  const int first = first_held(layer);
  const size_t rows = static_cast<size_t>(size_ - first);
  keys.type = values.type = layout.type;
  keys.bytes.resize(rows * layout.key_row_elements() * layout.element_bytes);
  values.bytes.resize(rows * layout.value_row_elements() * layout.element_bytes);
  copy_rows(layer, first, size_, keys.bytes.data(), values.bytes.data(), false);
}

void KvState::write(int layer, int first, int positions, const KvRows& keys, const KvRows& values,
                    std::span<const Token> ids) {
  if (layer < 0 || layer >= memory_->layer_count()) throw std::invalid_argument("layer " + std::to_string(layer) + " is not held here");
  const KvLayout& layout = this->layout(layer);
  const bool windowed = memory_->windowed(layer);
  const size_t key_row = layout.key_row_elements();
  const size_t value_row = layout.value_row_elements();
  const size_t element = kv_element_bytes(keys.type);
  const bool first_fits = windowed ? first >= 0 && first % kKvBlock == 0 && first <= window_start(memory_->window_size(), positions)
                                   : first == 0;
  const size_t rows = static_cast<size_t>(positions - first);
  if (!first_fits) {
    throw std::invalid_argument("the rows of layer " + std::to_string(layer) + " start at position " + std::to_string(first) +
                                ", which leaves out positions its next input reads");
  }
  if (positions < 0 || positions > capacity_ || (size_ != 0 && size_ != positions) || keys.type != values.type ||
      keys.bytes.size() != rows * key_row * element || values.bytes.size() != rows * value_row * element) {
    throw std::invalid_argument("the keys and values of " + std::to_string(positions) +
                                " positions do not match this sequence's shape, capacity or positions");
  }
  // Full blocks for a sliding-window layer too, as a step reserves them: they hold the
  // sequence's place in the prefix index (publish_full_blocks), even in a range of window
  // layers only.
  if (!(reserve_full(positions) && (!windowed || reserve_window(first, positions)))) {
    throw KvPoolFull("the KV pool has no room for a sequence handed over");
  }
  if (keys.type == layout.type) {
    copy_rows(layer, first, positions, const_cast<uint8_t*>(keys.bytes.data()), const_cast<uint8_t*>(values.bytes.data()), true);
  } else {
    // Rows as floats for store(), which rounds them into an f16 pool as the forward pass does
    // its own; halves into an f32 pool widen exactly.
    std::vector<uint16_t> halves(keys.type == KvType::F16 ? std::max(key_row, value_row) : 0);
    std::vector<float> k(key_row), v(value_row);
    const auto as_floats = [&](const uint8_t* row, std::vector<float>& out) {
      if (keys.type == KvType::F32) {
        std::memcpy(out.data(), row, out.size() * element);
        return;
      }
      std::memcpy(halves.data(), row, out.size() * element);
      tensor::fp16_to_fp32(halves.data(), out.data(), static_cast<int64_t>(out.size()));
    };
    for (int position = first; position < positions; ++position) {
      const size_t row = static_cast<size_t>(position - first);
      as_floats(keys.bytes.data() + row * key_row * element, k);
      as_floats(values.bytes.data() + row * value_row * element, v);
      store(layer, position, k.data(), v.data());
    }
  }
  // Nothing enters the index before every layer holds its data: a sequence that took a block
  // over from there would read layers not yet written.
  if (written_layers_.empty()) {
    written_layers_.assign(static_cast<size_t>(memory_->layer_count()), false);
    ids_.assign(ids.begin(), ids.end());
    publishing_ = false;
  }
  const bool known = ids.size() == static_cast<size_t>(positions) && std::equal(ids.begin(), ids.end(), ids_.begin(), ids_.end());
  if (!known) ids_.clear();  // unknown, or not the same on every layer: never published
  size_ = positions;
  written_layers_[static_cast<size_t>(layer)] = true;
  if (!ids_.empty() && std::all_of(written_layers_.begin(), written_layers_.end(), [](bool w) { return w; })) {
    publishing_ = true;
    publish_full_blocks();
  }
}

bool KvState::reserve_step(int inputs) {
  if (memory_->window() == nullptr) return reserve_full(size_ + inputs);
  const int first = window_start(memory_->window_size(), size_);
  let_window_go(first / kKvBlock);
  return reserve_full(size_ + inputs) && reserve_window(first, size_ + inputs);
}

bool KvState::reserve_full(int positions) {
  const size_t needed = static_cast<size_t>(blocks_for(positions));
  while (blocks_.size() < needed) {
    const std::optional<int> block = memory_->full().allocate();
    if (!block) return false;
    blocks_.push_back(*block);
  }
  return true;
}

bool KvState::reserve_window(int first, int positions) {
  KvPool& window = *memory_->window();
  const size_t needed = static_cast<size_t>(blocks_for(positions));
  if (window_blocks_.size() < needed) window_blocks_.resize(needed, -1);
  for (size_t b = static_cast<size_t>(first / kKvBlock); b < needed; ++b) {
    if (window_blocks_[b] >= 0) continue;
    const std::optional<int> block = window.allocate();
    if (!block) return false;
    window_blocks_[b] = *block;
  }
  return true;
}

void KvState::store(int layer, int position, const float* k, const float* v) {
  const KvLayout& layout = this->layout(layer);
  const int slot = memory_->slot(layer);
  std::byte* block = block_data(layer, position / kKvBlock);
  const int lane = position % kKvBlock;
  const int key_dim = layout.key_dim;
  const int value_dim = layout.value_dim;
  for (int h = 0; h < layout.kv_heads; ++h) {
    std::byte* keys = block + layout.key_offset(slot, h);
    std::byte* values = block + layout.value_offset(slot, h);
    const float* k_head = k + h * key_dim;
    const float* v_head = v + h * value_dim;
    if (layout.type == KvType::F16) {
      auto* key_halves = reinterpret_cast<uint16_t*>(keys);
      auto* value_halves = reinterpret_cast<uint16_t*>(values) + lane * value_dim;
      for (int d = 0; d < key_dim; ++d) key_halves[d * kKvBlock + lane] = tensor::fp32_to_fp16(k_head[d]);
      for (int d = 0; d < value_dim; ++d) value_halves[d] = tensor::fp32_to_fp16(v_head[d]);
    } else {
      auto* key_floats = reinterpret_cast<float*>(keys);
      auto* value_floats = reinterpret_cast<float*>(values) + lane * value_dim;
      for (int d = 0; d < key_dim; ++d) key_floats[d * kKvBlock + lane] = k_head[d];
      for (int d = 0; d < value_dim; ++d) value_floats[d] = v_head[d];
    }
  }
}

}  // namespace strata::model
