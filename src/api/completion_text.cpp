#include "api/completion_text.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace strata::api {

void TextDelta::append(TextDelta&& more) {
  text += more.text;
  std::move(more.logprobs.begin(), more.logprobs.end(), std::back_inserter(logprobs));
  reasoning += more.reasoning;
  std::move(more.tool_calls.begin(), more.tool_calls.end(), std::back_inserter(tool_calls));
}

CompletionText::CompletionText(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop,
                               bool with_logprobs, bool show_special_tokens)
    : tokenizer_(tokenizer),
      decoder_(std::make_unique<tokenizer::StreamDecoder>(tokenizer)),
      stop_(std::move(stop)),
      with_logprobs_(with_logprobs),
      show_special_tokens_(show_special_tokens) {}

CompletionText::~CompletionText() = default;

TextDelta CompletionText::push(const engine::GeneratedToken& token) {
  if (stopped_ || token.end_of_generation) return {};
  size_t start = released_ + held_.size();
  held_ += decoder_->push(token.token);
  if (show_special_tokens_ && tokenizer_.is_control(token.token)) held_ += tokenizer_.token_text(token.token);
  if (with_logprobs_) {
    TokenLogprobs logprobs{tokenizer_.token_piece(token.token), token.logprob, {}, start};
    for (const auto& alternative : token.top) {
      logprobs.top.push_back({tokenizer_.token_piece(alternative.token), alternative.logprob});
    }
    pending_tokens_.push_back({std::move(logprobs), released_ + held_.size()});
  }
  return release_checking_stops(possible_stop_prefix());
}

TextDelta CompletionText::finish() {
  if (stopped_) return {};
  held_ += decoder_->finish();
  return release_checking_stops(0);
}

TextDelta CompletionText::release_checking_stops(size_t held_back) {
  if (const auto [start, stop] = earliest_stop(); stop != nullptr) {
    stopped_ = true;
    matched_stop_ = *stop;
    return release(start);
  }
  return release(held_.size() - held_back);
}

TextDelta CompletionText::release(size_t length) {
  TextDelta delta;
  delta.text = held_.substr(0, length);
  held_.erase(0, length);
  released_ += length;
  // A token cut by a stop string still showed part of its text, so it is reported; once stopped,
  // tokens that showed nothing are dropped.
  auto shown = std::find_if(pending_tokens_.begin(), pending_tokens_.end(), [&](const auto& token) {
    return stopped_ ? token.logprobs.text_offset >= released_ : token.end > released_;
  });
  for (auto it = pending_tokens_.begin(); it != shown; ++it) {
    delta.logprobs.push_back(std::move(it->logprobs));
  }
  pending_tokens_.erase(pending_tokens_.begin(), stopped_ ? pending_tokens_.end() : shown);
  return delta;
}

std::pair<size_t, const std::string*> CompletionText::earliest_stop() const {
  std::pair<size_t, const std::string*> earliest{std::string::npos, nullptr};
  for (const auto& stop : stop_) {
    if (const size_t start = held_.find(stop); start < earliest.first) earliest = {start, &stop};
  }
  return earliest;
}

size_t CompletionText::possible_stop_prefix() const {
  size_t longest = 0;
  for (const auto& stop : stop_) {
    for (size_t length = std::min(stop.size() - 1, held_.size()); length > longest; --length) {
      if (held_.compare(held_.size() - length, length, stop, 0, length) == 0) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

}  // namespace strata::api
