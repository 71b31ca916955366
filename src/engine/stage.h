// One stage of a pipeline: a contiguous range of a model's layers, here or on another node.
// A batch says, per sequence, where its inputs continue, so it can cross a wire; each stage keeps
// the keys and values of its own layers per sequence id, from the sequence's first batch until
// it is released.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

namespace strata::engine {

using Token = int32_t;
using SequenceId = uint64_t;

struct SequenceWork {
  SequenceId id = 0;
  int first_position = 0;  // 0 starts the sequence: the stage creates its state
  int token_count = 0;
  int capacity = 0;  // positions the sequence may reach (prompt + generated), for its state
};

// The inputs of one step of a group of sequences: tokens for the stage that holds the
// embedding, else one hidden row per input, concatenated in `sequences` order.
struct StageBatch {
  std::vector<SequenceWork> sequences;
  std::vector<Token> tokens;
  std::vector<float> hidden;
};

// The model layers a stage computes, global indices [first, last); empty when it does not say.
struct StageLayers {
  int first = 0;
  int last = 0;
  bool contains(int layer) const { return layer >= first && layer < last; }
};

// One sequence's keys and values for one global layer, positions [0, positions) as rows of the
// model's kv_dim floats: the form in which its state moves from a stage of one placement to a
// stage of the next, so that it goes on there without being computed again.
struct LayerKv {
  SequenceId id = 0;
  int layer = 0;
  int positions = 0;
  int capacity = 0;
  std::vector<float> keys;
  std::vector<float> values;
};

// A stage that can no longer be reached, or that has moved to another placement: its
// sequences' state there is gone, but the requests can be run again on a new pipeline.
struct StageLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Stage {
 public:
  virtual ~Stage() = default;
  // Runs the batch through this stage's layers. Returns the hidden rows for the next stage
  // or, from the stage that holds the head, one logits row per sequence (for its last
  // input). Throws StageLost when the stage is gone, std::exception on other failures (a
  // malformed batch).
  virtual std::vector<float> forward(const StageBatch& batch) = 0;
  // Drops the state of these sequences; unknown ids are ignored.
  virtual void release(std::span<const SequenceId> ids) = 0;
  // The stage's pipeline is being replaced: a forward running on another thread may end now
  // with StageLost rather than wait for a node that may be gone, and later calls may fail at
  // once. The stage is not used for new work afterwards.
  virtual void cancel() {}

  // Moving a sequence's state. A stage that cannot (the defaults) makes the engine compute its
  // sequences again on the next pipeline instead.
  virtual StageLayers layers() const { return {}; }
  // The state of sequence `id` for `layer`. Throws StageLost when the stage is gone, other
  // exceptions when it does not hold that state.
  virtual LayerKv read_kv(SequenceId /*id*/, int /*layer*/) { throw StageLost("this stage cannot hand over state"); }
  // Takes over such state; the first layer written creates the sequence, which must then get
  // every layer of this stage before its next batch.
  virtual void write_kv(const LayerKv& /*kv*/) { throw StageLost("this stage cannot take over state"); }
};

}  // namespace strata::engine
