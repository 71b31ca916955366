// Chooses the next token from a model's logits, following llama.cpp's default chain:
// penalties -> top-k -> top-p -> min-p -> temperature -> random pick.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sampling/params.h"
#include "sampling/random.h"

namespace strata::sampling {

struct Candidate {
  int32_t token = 0;
  float logit = 0.0f;
};

// Applies the repetition, presence and frequency penalties in place to the logits of the tokens
// seen among the last `params.penalty_last_n` tokens of `history` (-1: all of it, 0: none).
// Repetition divides a positive logit and multiplies a non-positive one (llama.cpp); then
// logit -= count * frequency_penalty + presence_penalty for every token seen `count` > 0 times.
// Throws std::invalid_argument for a history token outside the logits.
void apply_penalties(std::span<float> logits, std::span<const int32_t> history,
                     const SamplingParams& params);

// The filters below shrink `candidates`, which may come in any order, and may reorder the
// survivors; the result depends only on the input, contents and order. Equal logits rank the
// lower token id first. Each keeps at least one candidate; none sorts the whole vocabulary.

// Keeps the k highest logits; k <= 0 or k >= size keeps all.
void keep_top_k(std::vector<Candidate>& candidates, int k);
// Keeps the smallest set of most likely candidates whose probability (softmax over
// `candidates`) reaches p; p >= 1 keeps all.
void keep_top_p(std::vector<Candidate>& candidates, float p);
// Keeps the candidates whose probability is at least min_p times the highest one; min_p <= 0
// keeps all. Preserves the order of the survivors.
void keep_min_p(std::vector<Candidate>& candidates, float min_p);

// One choice of a next token with everything it depends on, so that it can be made wherever
// the logits are (the stage that holds the head) and only the token travels back. choose()
// gives the token that the request's Sampler, in the state step() saw, would have sampled.
struct SamplingStep {
  SamplingParams params;
  Random::State random{};
  std::vector<int32_t> recent;  // the tail of the history that the penalties look at; empty when they are off
  // Vocabulary flags (see Sampler::sample), or empty: a grammar's mask for the step's first row
  // and, with drafts, one more for each draft's row, as the grammar stands after the drafts
  // before it.
  std::vector<uint8_t> allowed;
  int top_logprobs = -1;  // < 0: no logprobs; else the chosen token's and the k most likely
  // Speculative decoding: the step's last `drafts` inputs are guesses of the tokens that follow
  // (its first input is the sequence's last token), to be checked with choose_along.
  int drafts = 0;
};

struct Choice {
  int32_t token = 0;
  float logprob = 0.0f;  // when asked
  std::vector<std::pair<int32_t, float>> top;
};

// Throws like Sampler::sample (the vocabulary is the logits' size).
Choice choose(const SamplingStep& step, std::span<const float> logits);

// Checks a step's drafts (step.drafts of them): `logits` holds a row per input, the sequence's
// last token's and then each draft's. Chooses at row 0 as choose() would; while a choice equals
// the draft after it, chooses again at that draft's row with the generator moved on and the
// choice added to the penalties' history, exactly as the request's Sampler would stand after
// that token (Sampler::skip(1)), and the row's own mask. Stops at the first choice that differs
// from its draft (kept) or after the last row. Returns 1 to drafts + 1 choices, all but the last
// equal to their drafts: the tokens that decoding one at a time would have chosen, bit for bit,
// since each row's logits and mask are those that one-at-a-time decoding has at that position.
// Throws like choose(), and std::invalid_argument when the rows or drafts do not match
// step.drafts, or a mask is not one per row.
std::vector<Choice> choose_along(const SamplingStep& step, std::span<const int32_t> drafts,
                                 std::span<const float> logits);

// A tensor-parallel group's members each hold the logits of a share of the vocabulary
// (model/tensor_share.h). A greedy choice without logprobs needs of each share only its best
// token, with drafts too (a best per row), so the members exchange those rather than rows.
bool chooses_from_bests(const SamplingStep& step);

// One share's part of such a choice at one row: its allowed token of the highest penalized
// logit (the lowest id among equals), and what choose() checks of the raw logits first.
struct ShareBest {
  int32_t token = -1;  // none allowed in the share
  float logit = 0.0f;  // the token's penalized logit
  bool invalid = false;   // a NaN or +inf among the share's raw logits
  bool possible = false;  // a raw logit other than -inf among them
};
// A share's best at each of the step's rows, as choose_along() takes them (the sequence's last
// token's row, then each draft's; one row without drafts): `logits` holds the tokens
// first_token .. first_token + share - 1 of a vocabulary of vocab_size, share = logits.size() /
// rows. `drafts` are the step's step.drafts draft tokens. Never throws: what choose() or
// choose_along() would refuse, choose_from_bests() refuses.
std::vector<ShareBest> bests_in_share(const SamplingStep& step, std::span<const int32_t> drafts,
                                      std::span<const float> logits, int32_t first_token, int vocab_size);
// What choose() (a step without drafts) or choose_along() gives from the whole rows, bit for
// bit, from the shares' bests: bests[row * shares + share], the shares in vocabulary order.
// Throws std::invalid_argument as they would, with their words, and for a best outside the
// vocabulary (bests cross between nodes).
std::vector<Choice> choose_from_bests(const SamplingStep& step, std::span<const int32_t> drafts,
                                      std::span<const ShareBest> bests, int vocab_size);

class Sampler {
 public:
  // Throws std::invalid_argument when vocab_size is not positive.
  Sampler(const SamplingParams& params, int vocab_size);
  // Goes on from a generator's state instead of the seed's.
  Sampler(const SamplingParams& params, int vocab_size, const Random::State& random);

  // Picks the next token from raw logits (vocab_size of them). `history` is the prompt and the
  // tokens generated so far; the penalties look at its tail. Deterministic: the same params,
  // seed and sequence of calls give the same tokens on any machine. Temperature <= 0 is greedy
  // (highest penalized logit, ties to the lowest id). A non-empty `allowed` (vocab_size flags)
  // masks the logits first: a token whose flag is 0 is never drawn, as if its logit were -inf
  // before the chain. Throws std::invalid_argument for logits or flags of the wrong size, NaN or
  // +inf logits, or when every allowed logit is -inf.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history,
                 std::span<const uint8_t> allowed = {});
  // The next sample's inputs, as choose() takes them; the sampler does not move on (skip(1)
  // does, once the token is known), so that a step lost on the way can be taken again.
  SamplingStep step(std::span<const int32_t> history, std::span<const uint8_t> allowed, int top_logprobs) const;
  // Moves on as `count` calls of sample would have (each draws once unless greedy), for a
  // request that resumes elsewhere after `count` tokens.
  void skip(int count);

 private:
  int32_t pick_at_random(const std::vector<Candidate>& candidates);

  SamplingParams params_;
  int vocab_size_;
  Random random_;
};

// The log-softmax of raw logits at `chosen` and at the k most likely tokens (most likely first,
// ties by lower id; k is clamped to the vocabulary). Computed in double, reported as float.
struct Logprobs {
  float chosen = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};
// Throws std::invalid_argument when `chosen` is outside the logits.
Logprobs logprobs(std::span<const float> logits, int32_t chosen, int k);

}  // namespace strata::sampling
