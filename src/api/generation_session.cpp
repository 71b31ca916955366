#include "api/generation_session.h"

namespace strata::api {

GenerationSession::GenerationSession(const tokenizer::Tokenizer& tokenizer,
                                     std::vector<std::string> stop, bool with_logprobs,
                                     std::optional<OutputReading> reading)
    : text_(tokenizer, std::move(stop), with_logprobs,
            reading && (reading->format.parse_tool_calls || reading->format.family == chat::Family::Harmony)),
      reading_(std::move(reading)) {
  if (reading_) parser_.emplace(reading_->format);
}

TextDelta GenerationSession::read(TextDelta delta, bool final) {
  if (!parser_) return delta;
  chat::OutputDelta out = parser_->push(delta.text);
  if (final) out.append(parser_->finish());
  delta.text = std::move(out.content);
  delta.reasoning = std::move(out.reasoning);
  for (auto& call : out.tool_calls) {
    if (reading_->single_call && tool_calls_ > 0) continue;
    if (call.id.empty()) call.id = chat::generated_call_id(reading_->format.family, reading_->seed, tool_calls_);
    delta.tool_calls.push_back(std::move(call));
    ++tool_calls_;
  }
  return delta;
}

engine::RequestCallbacks GenerationSession::callbacks() {
  auto self = shared_from_this();
  return {
      [self](const engine::GeneratedToken& token) { return self->on_token(token); },
      [self](engine::FinishReason reason, const std::string& error) {
        self->on_finish(reason, error);
      },
      [self] { return self->updates_.cancelled(); },
  };
}

bool GenerationSession::on_token(const engine::GeneratedToken& token) {
  std::lock_guard lock(mutex_);
  if (updates_.cancelled() || updates_.ended() || text_.stopped()) return false;
  ++completion_tokens_;
  cached_tokens_ = token.cached_tokens;
  drafts_accepted_ = token.drafts_accepted;
  drafts_rejected_ = token.drafts_rejected;
  if (!first_token_at_) first_token_at_ = std::chrono::steady_clock::now();
  const bool reasoning_before = parser_ && parser_->in_reasoning();
  TextDelta delta = read(text_.push(token), false);
  if (reasoning_before || (parser_ && parser_->in_reasoning())) ++reasoning_tokens_;
  if (!delta.empty()) updates_.push({std::move(delta), std::nullopt});
  return !text_.stopped();
}

void GenerationSession::on_finish(engine::FinishReason reason, const std::string& error) {
  std::lock_guard lock(mutex_);
  if (updates_.ended()) return;
  using Kind = GenerationOutcome::Kind;
  Update last;
  if (text_.stopped()) {
    last.delta = read({}, true);
    last.outcome = GenerationOutcome{Kind::Stop, {}, text_.matched_stop()};
  } else if (reason == engine::FinishReason::Stop || reason == engine::FinishReason::Length) {
    last.delta = read(text_.finish(), true);
    bool stopped = reason == engine::FinishReason::Stop || text_.stopped();
    last.outcome = GenerationOutcome{stopped ? Kind::Stop : Kind::Length, {}, text_.matched_stop()};
  } else {
    last.outcome = GenerationOutcome{Kind::Error, reason == engine::FinishReason::Error
                                                      ? error
                                                      : "The generation was cancelled."};
  }
  updates_.push(std::move(last), /*last=*/true);
}

GenerationSession::Update GenerationSession::wait_for(std::chrono::milliseconds timeout) {
  Update update;
  for (Update& taken : updates_.take(std::chrono::steady_clock::now() + timeout).items) {
    update.delta.append(std::move(taken.delta));
    if (taken.outcome) update.outcome = std::move(taken.outcome);
  }
  // Once taken, the outcome is every later update's too.
  std::lock_guard lock(mutex_);
  if (update.outcome) {
    outcome_ = update.outcome;
  } else {
    update.outcome = outcome_;
  }
  return update;
}

void GenerationSession::cancel() { updates_.cancel(); }

void GenerationSession::abandon() {
  updates_.cancel();
  // The engine's own end, should it come after, is not queued.
  updates_.push({{}, GenerationOutcome{GenerationOutcome::Kind::Error, "The server is shutting down."}}, /*last=*/true);
}

int GenerationSession::completion_tokens() const {
  std::lock_guard lock(mutex_);
  return completion_tokens_;
}

int GenerationSession::reasoning_tokens() const {
  std::lock_guard lock(mutex_);
  return reasoning_tokens_;
}

int GenerationSession::tool_calls() const {
  std::lock_guard lock(mutex_);
  return tool_calls_;
}

int GenerationSession::cached_tokens() const {
  std::lock_guard lock(mutex_);
  return cached_tokens_;
}

int GenerationSession::drafts_accepted() const {
  std::lock_guard lock(mutex_);
  return drafts_accepted_;
}

int GenerationSession::drafts_rejected() const {
  std::lock_guard lock(mutex_);
  return drafts_rejected_;
}

std::optional<std::chrono::steady_clock::time_point> GenerationSession::first_token_at() const {
  std::lock_guard lock(mutex_);
  return first_token_at_;
}

}  // namespace strata::api
