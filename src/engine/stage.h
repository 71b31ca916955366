// One stage of a pipeline: a contiguous range of a model's layers, here or on another node.
// A batch says, per sequence, where its inputs continue, so it can cross a wire; each stage keeps
// the keys and values of its own layers per sequence id, from the sequence's first batch (or
// hold_prefix) until it is released, in blocks of a pool that outlives sequences: full blocks
// stay cached for later sequences with the same leading tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/kv_pool.h"
#include "sampling/sampler.h"

namespace strata::engine {

using Token = int32_t;
using SequenceId = uint64_t;

struct SequenceWork {
  SequenceId id = 0;
  // A sequence's first batch starts at 0, or at a whole number of blocks of the prefix that
  // hold_prefix found on every stage (each lets the rest of its own go).
  int first_position = 0;
  int token_count = 0;
  int capacity = 0;  // positions the sequence may reach (prompt + generated), for its state
  // What the stage that holds the head gives back for it: its last input's logits (or, with a
  // sampling step, the token chosen from them), every input's output-normed hidden row (an
  // embedding request's), or nothing (a chunk of a prompt before its last).
  enum class Output { Logits, Embeddings, Nothing };
  Output output = Output::Logits;
  // With Logits: choose the next token there, so that the token comes back, not the row. A
  // step with drafts (speculative decoding) has its last `sampling->drafts` inputs checked
  // there (sampling::choose_along), from the logits of every input.
  std::optional<sampling::SamplingStep> sampling;
  // The sequence's positions from first_position on, which this stage holds (drafts that the
  // last step rejected), are dropped before the inputs are computed. Without it a batch must
  // continue exactly where the sequence's state ends.
  bool rewind = false;
};

// The inputs of one step of a group of sequences, concatenated in `sequences` order: every
// input's token id (which every stage needs to index its cache blocks by their tokens), and
// for the stages after the one that embeds, one hidden row per input.
struct StageBatch {
  std::vector<SequenceWork> sequences;
  std::vector<Token> tokens;
  std::vector<float> hidden;
  // The nodes of the stages after a remote one, in order, to which it passes its output itself
  // (a chain: Stage::chain_node); the last one's output comes back as the batch's.
  std::vector<std::string> then;
};

// A sampling step's outcome: the token and its logprobs, or why there is none (logits that are
// NaN, flags that do not fit the vocabulary).
struct Sampled {
  sampling::Choice choice;
  std::string error;
  // With drafts: the choices after `choice`, each at the row of the draft that the choice
  // before it confirmed (sampling::choose_along); `choice` and all of them but the last equal
  // their drafts.
  std::vector<sampling::Choice> continued;
};

// What a stage gives back for a batch: the hidden rows for the next stage or, from the stage
// that holds the head, each sequence's rows as its SequenceWork::Output says, in batch order,
// except those that sample there, whose tokens are in `sampled` (in batch order too).
struct StageOutput {
  std::vector<float> rows;
  std::vector<Sampled> sampled;
};

// The model layers a stage computes, global indices [first, last); empty when it does not say.
struct StageLayers {
  int first = 0;
  int last = 0;
  bool contains(int layer) const { return layer >= first && layer < last; }
};

// One sequence's keys and values for one global layer, positions [0, positions) as rows of the
// model's kv_dim elements, as the stage's pool stores them: the form in which its state moves
// from a stage of one placement to a stage of the next, so that it goes on there without being
// computed again.
struct LayerKv {
  SequenceId id = 0;
  int layer = 0;
  int positions = 0;
  int capacity = 0;
  // The first position the rows hold: 0, but for a sliding-window layer whose window has moved
  // on (a whole number of blocks); the rows are of positions [first_position, positions).
  int first_position = 0;
  model::KvRows keys;
  model::KvRows values;
  // The inputs' token ids at those positions, when the stage knows them (else empty): the
  // stage that takes the state over enters its full blocks in its prefix index.
  std::vector<Token> tokens;
};

// A stage that can no longer be reached, or that has moved to another placement: its
// sequences' state there is gone, but the requests can be run again on a new pipeline.
struct StageLost : std::runtime_error {
  explicit StageLost(const std::string& what, std::string node = {}, bool unreachable = false)
      : std::runtime_error(what), node(std::move(node)), unreachable(unreachable) {}
  std::string node;          // the lost stage's node, when it is on another one
  bool unreachable = false;  // its connection failed (a process gone), not late or moved on
};

class Stage {
 public:
  virtual ~Stage() = default;
  // Runs the batch through this stage's layers (see StageOutput). Throws StageLost when the
  // stage is gone, std::exception on other failures (a malformed batch).
  virtual StageOutput forward(const StageBatch& batch) = 0;
  // Drops the state of these sequences; unknown ids are ignored.
  virtual void release(std::span<const SequenceId> ids) = 0;
  // The stage's pipeline is being replaced: a forward running on another thread may end now
  // with StageLost rather than wait for a node that may be gone, and later calls may fail at
  // once. The stage is not used for new work afterwards.
  virtual void cancel() {}
  // A member of a tensor-parallel group (group_stage.h) whose step cannot finish, another
  // member being lost: a forward of it waiting for the others ends with an error now, and the
  // stage is not used again. The default: nothing of it waits for others.
  virtual void leave_group() {}

  // Chains. A stage on another node that passes a batch's output on itself to the stages after
  // it (StageBatch::then) names its node here, by which the stage before it names it; a
  // pipeline sends a run of such stages each batch once, to the first, and gets the last one's
  // output from it. Empty (the default): it cannot.
  virtual std::string chain_node() const { return {}; }
  // With a chain_node: sends the batch on without waiting; receive() gives the outputs in the
  // order they were sent, and fails like forward. One thread may send while another receives.
  virtual void send(const StageBatch& /*batch*/) { throw std::logic_error("this stage does not pass batches on"); }
  virtual StageOutput receive() { throw std::logic_error("this stage does not pass batches on"); }

  // Moving a sequence's state. A stage that cannot (the defaults) makes the engine compute its
  // sequences again on the next pipeline instead.
  virtual StageLayers layers() const { return {}; }
  // The state of sequence `id` for `layer`. Throws StageLost when the stage is gone, other
  // exceptions when it does not hold that state.
  virtual LayerKv read_kv(SequenceId /*id*/, int /*layer*/) { throw StageLost("this stage cannot hand over state"); }
  // Takes over such state; the first layer written creates the sequence, which must then get
  // every layer of this stage before its next batch.
  virtual void write_kv(const LayerKv& /*kv*/) { throw StageLost("this stage cannot take over state"); }
  // Starts sequence `id` (to reach `capacity` positions) with the longest run of leading full
  // blocks of `tokens` that this stage's cache holds, pinned until its first batch. Returns the
  // positions they cover, a whole number of blocks. Asked again before that batch, the stage
  // lets its hold go and takes the new one: with sliding-window layers a hold cannot always be
  // cut back to a shorter one, whose window it may lack. Throws like forward.
  virtual int hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) = 0;
  // Blocks of model::kKvBlock positions that this stage's pools hold for all its sequences.
  virtual model::KvBlockCounts kv_blocks() = 0;
};

}  // namespace strata::engine
