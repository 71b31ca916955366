// One request's generation as seen from the HTTP side: the engine thread feeds it tokens, which
// it turns into text there (so that a stop string ends the request at the token that completes
// it) and queues on a TokenStream; the HTTP thread waits on that for text to send. Either side
// may end it early.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/completion_text.h"
#include "engine/generator.h"
#include "engine/token_stream.h"

namespace strata::api {

struct GenerationOutcome {
  enum class Kind { Stop, Length, Error } kind = Kind::Stop;
  std::string error;          // for Error
  std::string stop_sequence;  // for Stop: the stop string that ended it, if one did
};

// How a chat answer's text is read for tool calls and reasoning.
struct OutputReading {
  chat::OutputFormat format;
  uint64_t seed = 0;          // the request's: generated call ids derive from it
  bool single_call = false;   // parallel_tool_calls false: calls after the first are dropped
};

class GenerationSession : public std::enable_shared_from_this<GenerationSession> {
 public:
  // With `reading`, the updates' text is split into content, reasoning and tool calls.
  GenerationSession(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop,
                    bool with_logprobs, std::optional<OutputReading> reading = std::nullopt);

  // Callbacks that keep this session alive for as long as the engine holds them.
  engine::RequestCallbacks callbacks();

  struct Update {
    TextDelta delta;
    std::optional<GenerationOutcome> outcome;  // set once generation is over
  };
  // Blocks until there is new text or the generation is over, or returns an empty update after
  // `timeout` without either.
  Update wait_for(std::chrono::milliseconds timeout);

  // The client went away: the engine hears it at its next token, or drops it from its queue.
  void cancel();
  // The server is stopping: waiters return at once with an error and the engine is told to stop.
  void abandon();

  int completion_tokens() const;
  // The generated tokens that fell in the model's reasoning, its markers included.
  int reasoning_tokens() const;
  int tool_calls() const;
  int cached_tokens() const;
  // Speculative decoding's drafts for it so far: confirmed, and not.
  int drafts_accepted() const;
  int drafts_rejected() const;
  // When the engine gave the first token; unset before.
  std::optional<std::chrono::steady_clock::time_point> first_token_at() const;

 private:
  bool on_token(const engine::GeneratedToken& token);
  void on_finish(engine::FinishReason reason, const std::string& error);
  // The parser's reading of released text (and of the end, when `final`).
  TextDelta read(TextDelta delta, bool final);

  engine::TokenStream<Update> updates_;  // ends with the update that holds the outcome
  mutable std::mutex mutex_;             // of the text and the counts, which the engine thread writes
  CompletionText text_;
  std::optional<OutputReading> reading_;
  std::optional<chat::OutputParser> parser_;
  std::optional<GenerationOutcome> outcome_;  // as wait_for took it
  int completion_tokens_ = 0;
  int reasoning_tokens_ = 0;
  int tool_calls_ = 0;
  int cached_tokens_ = 0;
  int drafts_accepted_ = 0;
  int drafts_rejected_ = 0;
  std::optional<std::chrono::steady_clock::time_point> first_token_at_;
};

}  // namespace strata::api
