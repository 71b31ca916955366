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
};

}  // namespace strata::engine
