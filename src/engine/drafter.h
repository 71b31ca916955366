// Where speculative decoding's drafts come from: guesses of the tokens that follow a sequence,
// which the last stage checks in one step (sampling::choose_along) and keeps while they are
// what it would have chosen anyway, so that the text is the same as without them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "model/model.h"
#include "tensor/thread_pool.h"

namespace strata::engine {

using Token = int32_t;

class Drafter {
 public:
  // What a drafter keeps for one sequence between its steps (a draft model's keys and
  // values); the engine holds it with the sequence and drops it when the sequence ends.
  struct State {
    virtual ~State() = default;
  };
  virtual ~Drafter() = default;
  // A sequence's state, made before its first draft (none: the drafter keeps nothing).
  virtual std::unique_ptr<State> start() const { return nullptr; }
  // Up to `max` tokens that may follow `history` (the sequence's prompt and generated tokens);
  // none for an ordinary step. Deterministic: the same history gives the same drafts. Called on
  // the engine's loop thread, with the state start() made for this sequence.
  virtual std::vector<Token> draft(State* state, std::span<const Token> history, int max) const = 0;
};

// Prompt lookup: the tokens that followed the most recent earlier occurrence, in the history,
// of its last n tokens, for n from `longest` down to `shortest`; but before a lone last token,
// the n tokens before the last one, as if it had replaced the token that followed them there
// (an edited word of a copy: what follows the original follows the edit).
class PromptLookupDrafter final : public Drafter {
 public:
  explicit PromptLookupDrafter(int longest = 3, int shortest = 1) : longest_(longest), shortest_(shortest) {}
  std::vector<Token> draft(State* state, std::span<const Token> history, int max) const override;

 private:
  int longest_;
  int shortest_;
};

// A draft model: a small model of the target's vocabulary (the caller checks that), whole on
// this node, that proposes its greedy continuation. Each sequence keeps its own keys and values
// of it, in step with the history: at each draft it goes back to the longest prefix it shares
// with the history (rejected drafts go, model::KvState::rewind) and computes the rest.
class ModelDrafter final : public Drafter {
 public:
  // `threads` run its forward passes, one at a time (engines of several placements may share
  // it). `context`: the positions a sequence may reach in it (0: the model's trained context);
  // past them it drafts nothing.
  ModelDrafter(std::shared_ptr<model::Model> model, int threads, int context = 0);
  std::unique_ptr<State> start() const override;
  std::vector<Token> draft(State* state, std::span<const Token> history, int max) const override;

 private:
  std::shared_ptr<model::Model> model_;
  int context_;
  mutable std::mutex mutex_;
  std::unique_ptr<tensor::ThreadPool> pool_;
};

}  // namespace strata::engine
