// Turns generated tokens into the text a client may see: decodes them, cuts at stop strings and,
// while streaming, holds back text that could still become the start of a stop string.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "chat/output_format.h"
#include "engine/generator.h"

namespace strata::tokenizer {
class Tokenizer;
class StreamDecoder;
}  // namespace strata::tokenizer

namespace strata::api {

struct TokenAlternative {
  std::string text;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  std::string text;
  float logprob = 0.0f;
  std::vector<TokenAlternative> top;
  size_t text_offset = 0;  // where the token's text starts in the completion
};

struct TextDelta {
  std::string text;
  std::vector<TokenLogprobs> logprobs;  // for the tokens whose text is now fully shown
  // Chat output read by its family's parser: `text` is then the answer's content alone.
  std::string reasoning;
  std::vector<chat::ToolCall> tool_calls;  // complete calls, ids given

  bool empty() const { return text.empty() && logprobs.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(TextDelta&& more);
};

class CompletionText {
 public:
  // show_special_tokens: control tokens other than end-of-generation ones are written as their
  // text (<|channel|>, <|python_tag|>), for an output parser that reads the markers.
  CompletionText(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop,
                 bool with_logprobs, bool show_special_tokens = false);
  ~CompletionText();

  TextDelta push(const engine::GeneratedToken& token);
  // The held-back rest, once generation has ended.
  TextDelta finish();
  // A stop string matched: the text before it has been released and nothing more will be.
  bool stopped() const { return stopped_; }
  // The stop string that matched first in the text; empty before one did.
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  struct PendingToken {
    TokenLogprobs logprobs;
    size_t end = 0;
  };
  // Releases up to a matched stop string, or else all but the last `held_back` bytes.
  TextDelta release_checking_stops(size_t held_back);
  TextDelta release(size_t length);
  // Where the earliest stop string starts in held_, and which one it is; npos and null for none.
  std::pair<size_t, const std::string*> earliest_stop() const;
  size_t possible_stop_prefix() const;

  const tokenizer::Tokenizer& tokenizer_;
  std::unique_ptr<tokenizer::StreamDecoder> decoder_;
  std::vector<std::string> stop_;
  bool with_logprobs_;
  bool show_special_tokens_;
  bool stopped_ = false;
  std::string matched_stop_;
  std::string held_;     // decoded, not yet released
  size_t released_ = 0;  // bytes released so far
  std::vector<PendingToken> pending_tokens_;
};

}  // namespace strata::api
