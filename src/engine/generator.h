// What the API layer needs from whatever runs the model: submit a tokenized request, receive its
// tokens one by one. Every request is its own sequence with its own state, created on submit and
// released when it finishes; only the keys and values of whole blocks of leading tokens may be
// taken over by a later request with the same leading tokens, which computes the same bits.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/pooling.h"
#include "sampling/params.h"

namespace strata::engine {

using Token = int32_t;

// Where a request that its scheduler passed on (Engine::pass_on) left its state: the stages of
// that scheduler's pipeline hold the keys and values of its first `positions` inputs under
// `sequence`, so that the next scheduler can move them instead of computing them again.
// `pipeline` names those stages to whoever runs the request next (a cluster's placement epoch).
struct HeldState {
  uint64_t pipeline = 0;
  uint64_t sequence = 0;
  int positions = 0;
};

inline constexpr int kMaxTopLogprobs = 20;

struct GenerationRequest {
  std::vector<Token> prompt;  // already tokenized, BOS included when wanted
  int max_tokens = 16;
  sampling::SamplingParams sampling;
  // Report each token's log-probability, a log-softmax over the vocabulary that is skipped
  // when nobody asked for it.
  bool logprobs = false;
  int top_logprobs = 0;  // how many alternatives to report per token (0..kMaxTopLogprobs), with logprobs
  // A request that moves to another scheduler part-way (its node was lost) goes on there: its
  // prompt then ends with the tokens it had generated, this many, and the sampler skips the
  // random draws that chose them, so that what follows is what would have followed.
  int resumed_after = 0;
  // Set for such a request when its previous scheduler's stages still hold its first inputs.
  std::optional<HeldState> held;
  // Names the request in the log lines of every node it passes (the API's x-request-id).
  std::string request_id;
  // GBNF (constrain/grammar.h) that the generated text must follow: each token is drawn from
  // those that keep it a prefix of a sentence, the end of generation only once it is whole, and
  // the request stops ("stop") when nothing more can follow. Empty: unconstrained. The text is
  // what travels to another node's scheduler; a resumed request's generated tokens are fed to
  // it again first.
  std::string grammar;
  // Mean, Cls or Last: an embedding request. Its prompt runs through the model (max_tokens,
  // sampling and logprobs do not apply), nothing is generated, and on_embedding receives the
  // prompt's output-normed hidden rows pooled so; then it finishes with Stop.
  model::Pooling embedding = model::Pooling::None;
};

struct TokenLogprob {
  Token token = 0;
  float logprob = 0.0f;  // log-softmax of the raw logits
};

struct GeneratedToken {
  Token token = 0;
  float logprob = 0.0f;  // 0 unless the request asked for logprobs
  std::vector<TokenLogprob> top;  // top_logprobs entries, most likely first
  bool end_of_generation = false;  // the model's EOS/EOT: finish_reason "stop"; not to be shown
  int cached_tokens = 0;  // of the request's prompt, whose keys and values came from a cache
  // Speculative decoding's drafts for this request so far (at its scheduler): those the model
  // confirmed (tokens that came without a step of their own) and those it did not.
  int drafts_accepted = 0;
  int drafts_rejected = 0;
};

// Lost: the node that scheduled the request was lost, or no longer schedules, part-way; the
// request may go on at another scheduler from its tokens so far (a cluster node resumes it,
// and ends it with Error when it cannot).
enum class FinishReason { Stop, Length, Cancelled, Error, Lost };
// "stop", "length", "cancelled", "error" or "lost".
inline const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::Lost:
      return "lost";
    case FinishReason::Error:
      break;
  }
  return "error";
}

struct RequestCallbacks {
  // Runs on an engine thread for every generated token; return false to end the request now
  // (a stop string matched, or the client went away).
  std::function<bool(const GeneratedToken&)> on_token;
  // Runs exactly once, last. `error` is set when reason is Error or Lost. After on_token returned
  // false the reason is Cancelled.
  std::function<void(FinishReason reason, const std::string& error)> on_finish;
  // Optional. Asked while the request waits in the queue, and between its steps: true drops it
  // (finishing Cancelled), e.g. when its client went away, without waiting for its next token,
  // which may be far off while the request waits for a new pipeline or would be computed again.
  // It may be asked on another thread than the other callbacks, at the same time as on_token.
  std::function<bool()> cancelled;
  // Optional. Runs instead of on_finish, last, when the scheduler passes the request on with
  // its state held (see HeldState): it goes on elsewhere from its prompt and the tokens
  // generated so far. Without it such a request finishes with the pass-on's error.
  std::function<void(const HeldState&)> on_passed_on;
  // Optional. Runs once on the engine thread, before on_token, when the request leaves the
  // queue for its first step (its wait is over; its prefill begins).
  std::function<void()> on_started;
  // An embedding request's: runs once, on the engine thread, before on_finish (Stop), with
  // the pooled vector (embedding_dim floats, not normalized).
  std::function<void(std::vector<float>)> on_embedding;
};

// Thrown by submit when no request can run now or for a while (a cluster still forming, a
// model that does not fit the cluster's memory): the API answers 503 with Retry-After.
struct Unavailable : std::runtime_error {
  explicit Unavailable(const std::string& why, int retry_after_seconds = 5)
      : std::runtime_error(why), retry_after_seconds(retry_after_seconds) {}
  int retry_after_seconds;
};

// How often a request's RequestCallbacks::cancelled is asked while no step or token tells of it
// (the request waits for a new pipeline, or is relayed to another node's scheduler).
inline constexpr std::chrono::milliseconds kCancelCheck{100};

struct ModelLimits {
  int context_size = 0;   // prompt + generated tokens must fit
  int max_parallel = 0;   // sequences decoded together
  int max_queued = 0;     // requests waiting beyond that before submit refuses
};

class Generator {
 public:
  virtual ~Generator() = default;
  virtual ModelLimits limits() const = 0;
  // Queues the request. Returns false (calling nothing) when the queue is full.
  // Throws std::invalid_argument when the request cannot fit the context or its grammar cannot
  // be read (or followed by its resumed tokens), or it asks for an embedding the model cannot
  // make; Unavailable when nothing can run it now.
  virtual bool submit(GenerationRequest request, RequestCallbacks callbacks) = 0;
  // Empty when a request can run now, or when it would be refused at once; otherwise what it
  // would wait for (a cluster forming, layers loading), for the clients that wait to see.
  virtual std::string waiting_for() const { return {}; }
  // Finishes in-flight requests with Cancelled and refuses new ones; returns when all are done.
  virtual void shutdown() = 0;
};

}  // namespace strata::engine
