// One sequence's keys and values on one stage: its block tables in the stage's KvMemory.
#pragma once

#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "model/kv_pool.h"

namespace strata::model {

// One sequence's block tables for the layers of one range: its positions' keys and values in
// blocks of its memory's pools, the leading ones possibly shared with other sequences through
// the prefix index. Its full-attention layers keep every position; its sliding-window layers
// keep the blocks their next input's window reads, and let the older ones go when a step
// starts. Its blocks are unpinned when it is dropped.
class KvState {
 public:
  KvState(std::shared_ptr<KvMemory> memory, int capacity);
  ~KvState();
  KvState(const KvState&) = delete;
  KvState& operator=(const KvState&) = delete;
  int size() const { return size_; }
  int capacity() const { return capacity_; }

  // The first position layer `layer` (of its range, from 0) holds: 0, but for a
  // sliding-window layer whose window has moved on (a whole number of blocks).
  int first_held(int layer) const;
  // Positions [first_held(layer), size()) of layer `layer` as rows in its pool's type, keys
  // then values: the form in which a sequence's state moves to another node.
  void read(int layer, KvRows& keys, KvRows& values) const;
  // Writes positions [first, positions) of layer `layer` from such rows: copied bit for bit
  // from rows of the pool's type; from others, widened exactly (f16 into f32) or rounded to the
  // nearest (f32 into f16), as the forward pass stores its own. `first` is 0 for a
  // full-attention layer; for a sliding-window one, a whole number of blocks no later than the
  // window of the input at `positions` starts. The state then holds `positions` positions:
  // every one of its layers must be written before it is used. `ids` are the token ids of
  // positions [0, positions), or empty when unknown: once every layer is written with the
  // same ids, the full blocks enter the prefix index. Throws KvPoolFull when a pool has no room.
  void write(int layer, int first, int positions, const KvRows& keys, const KvRows& values,
             std::span<const Token> ids);
  // The token ids of the positions recorded (or written) so far; fewer than size() when they
  // are not known.
  std::span<const Token> ids() const { return ids_; }

  // For a sequence that holds nothing yet: takes the longest run of leading full blocks of
  // `tokens` that the index holds and whose sliding-window layers still hold the blocks the
  // next input's window reads. Returns the positions taken.
  int hold_prefix(std::span<const Token> tokens);
  // Keeps the first `positions` positions, a whole number of blocks, and lets the rest go.
  // The sliding-window layers must still hold the window of the input at `positions`.
  void truncate(int positions);
  // Keeps the first `positions` positions, any number (speculative decoding's rejected
  // drafts go), and lets the rest go; the sliding-window layers hold what they held of them. A
  // block that entered the prefix index or came from it (other sequences may hold it) is never
  // written again: when the next position falls in such a block, the sequence goes on in a
  // copy of its own, or, when the pool has no other block and nobody else holds it, in that
  // block taken out of the index. Throws KvPoolFull, keeping whole blocks only, when others
  // hold it and the pool has no block for a copy; std::logic_error, changing nothing, when the
  // sliding-window layers let go of the window of the input at `positions` (a step's drafts
  // never reach that far back).
  void rewind(int positions);
  // Records the ids of the inputs the last forward computed, and enters the blocks they
  // filled in the prefix index (never a partial block).
  void record(std::span<const Token> ids);

 private:
  friend class Model;
  // Before a step of `inputs` inputs: lets go of the sliding-window blocks the step's window
  // no longer reads and takes blocks for its positions. False when a pool cannot give them.
  bool reserve_step(int inputs);
  // Takes the blocks the full-attention layers lack for positions [0, positions); the
  // sliding-window layers', for [first, positions).
  bool reserve_full(int positions);
  bool reserve_window(int first, int positions);
  // Writes position `position` of `layer`: k and v are its key and value rows as floats.
  void store(int layer, int position, const float* k, const float* v);
  const KvLayout& layout(int layer) const { return memory_->pool_of(layer).layout(); }
  // Block `block` of the positions of `layer`, in its pool.
  std::byte* block_data(int layer, int block) const;
  // Copies positions [first, positions) of `layer` between its blocks and rows of the pool's
  // type (KvLayout's key and value rows): into the blocks, or out of them.
  void copy_rows(int layer, int first, int positions, uint8_t* keys, uint8_t* values, bool into_blocks) const;
  // Enters the full blocks of known ids not yet in the index, while the chain holds, and the
  // sliding-window layers' blocks beside them.
  void publish_full_blocks();
  // Lets go of the sliding-window blocks before block `first_kept`.
  void let_window_go(int first_kept);

  std::shared_ptr<KvMemory> memory_;
  int capacity_;
  int size_ = 0;
  std::vector<int> blocks_;          // of the full-attention layers
  std::vector<int> window_blocks_;   // of the sliding-window layers; -1 where let go
  int window_from_ = 0;              // window_blocks_ before it are all let go
  std::vector<Token> ids_;           // of the positions recorded so far
  std::vector<KvPool::Link> links_;  // per full block entered in (or found in) the index
  bool publishing_ = true;           // false once a hash collision broke the chain, or ids are unknown
  std::vector<bool> written_layers_; // by write(), until every layer is
};

// A forward that needs more KV blocks than its pool has free: nothing was computed.
struct KvPoolFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace strata::model
