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
      [self] {
        std::lock_guard lock(self->mutex_);
        return self->cancelled_;
      },
  };
}

bool GenerationSession::on_token(const engine::GeneratedToken& token) {
  std::lock_guard lock(mutex_);
  if (cancelled_ || text_.stopped() || outcome_) return false;
  ++completion_tokens_;
  cached_tokens_ = token.cached_tokens;
  drafts_accepted_ = token.drafts_accepted;
  drafts_rejected_ = token.drafts_rejected;
  if (!first_token_at_) first_token_at_ = std::chrono::steady_clock::now();
  const bool reasoning_before = parser_ && parser_->in_reasoning();
  unsent_.append(read(text_.push(token), false));
  if (reasoning_before || (parser_ && parser_->in_reasoning())) ++reasoning_tokens_;
  changed_.notify_all();
  return !text_.stopped();
}

void GenerationSession::on_finish(engine::FinishReason reason, const std::string& error) {
  std::lock_guard lock(mutex_);
  if (outcome_) return;
  using Kind = GenerationOutcome::Kind;
  if (text_.stopped()) {
    unsent_.append(read({}, true));
    outcome_ = GenerationOutcome{Kind::Stop, {}, text_.matched_stop()};
  } else if (reason == engine::FinishReason::Stop || reason == engine::FinishReason::Length) {
    unsent_.append(read(text_.finish(), true));
    bool stopped = reason == engine::FinishReason::Stop || text_.stopped();
    outcome_ = GenerationOutcome{stopped ? Kind::Stop : Kind::Length, {}, text_.matched_stop()};
  } else {
    outcome_ = GenerationOutcome{Kind::Error, reason == engine::FinishReason::Error
                                                  ? error
                                                  : "The generation was cancelled."};
  }
  changed_.notify_all();
}

GenerationSession::Update GenerationSession::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return !unsent_.empty() || outcome_; });
  Update update{std::move(unsent_), outcome_};
  unsent_ = {};
  return update;
}

void GenerationSession::cancel() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
}

void GenerationSession::abandon() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
  if (!outcome_) {
    outcome_ = GenerationOutcome{GenerationOutcome::Kind::Error, "The server is shutting down."};
  }
  changed_.notify_all();
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
