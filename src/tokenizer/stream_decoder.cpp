#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace strata::tokenizer {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

std::string StreamDecoder::push(Token token) {
  pending_ += tokenizer_.token_piece(token);
  std::string ready;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const unicode::Utf8Decoded decoded = unicode::decode_utf8_at(pending_, pos);
    if (decoded.status == unicode::Utf8Status::Incomplete) break;  // wait for the rest
    if (decoded.status == unicode::Utf8Status::Invalid) {
      ready += kReplacement;
    } else {
      ready.append(pending_, pos, decoded.length);
    }
    pos += decoded.length;
  }
  pending_.erase(0, pos);
  return ready;
}

std::string StreamDecoder::finish() {
  std::string rest = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return rest;
}

}  // namespace strata::tokenizer
