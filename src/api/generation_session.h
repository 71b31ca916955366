// One request's generation as seen from the HTTP side: the engine thread feeds it tokens, the
// HTTP thread waits on it for text to send. Either side may end it early.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/completion_text.h"
#include "engine/generator.h"

namespace strata::api {

struct GenerationOutcome {
  enum class Kind { Stop, Length, Error } kind = Kind::Stop;
  std::string error;          // for Error
  std::string stop_sequence;  // for Stop: the stop string that ended it, if one did
};

class GenerationSession : public std::enable_shared_from_this<GenerationSession> {
 public:
  GenerationSession(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop,
                    bool with_logprobs);

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
  int cached_tokens() const;
  // When the engine gave the first token; unset before.
  std::optional<std::chrono::steady_clock::time_point> first_token_at() const;

 private:
  bool on_token(const engine::GeneratedToken& token);
  void on_finish(engine::FinishReason reason, const std::string& error);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  CompletionText text_;
  TextDelta unsent_;
  std::optional<GenerationOutcome> outcome_;
  bool cancelled_ = false;
  int completion_tokens_ = 0;
  int cached_tokens_ = 0;
  std::optional<std::chrono::steady_clock::time_point> first_token_at_;
};

}  // namespace strata::api
