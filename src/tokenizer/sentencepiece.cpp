// SentencePiece BPE as llama.cpp implements it: merge adjacent symbols whose concatenation is the
// vocabulary token with the highest score; characters left outside the vocabulary fall back to
// <0xNN> byte tokens.
#include "tokenizer/pair_merger.h"
#include "tokenizer/tokenizer_impl.h"

namespace strata::tokenizer {

namespace {

// SentencePiece writes spaces as U+2581 LOWER ONE EIGHTH BLOCK.
constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

}  // namespace

void Tokenizer::Impl::encode_sentencepiece(std::string_view text, bool prefix_space,
                                           std::vector<Token>& out) const {
  std::string escaped;
  escaped.reserve(text.size() + 8);
  if (prefix_space) escaped += kSpaceMarker;
  for (char c : text) {
    if (c == ' ') {
      escaped += kSpaceMarker;
    } else {
      escaped += c;
    }
  }

  const auto score_of_merge = [&](std::string_view left,
                                  std::string_view right) -> std::optional<double> {
    const Token* token = find(std::string_view(left.data(), left.size() + right.size()));
    if (token == nullptr) return std::nullopt;
    return scores[static_cast<size_t>(*token)];
  };
  for (std::string_view symbol : merge_pairs(escaped, score_of_merge)) {
    if (const Token* token = find(symbol)) {
      out.push_back(*token);
      continue;
    }
    for (char c : symbol) {
      const Token byte_token = byte_tokens[static_cast<uint8_t>(c)];
      if (byte_token >= 0) {
        out.push_back(byte_token);
      } else if (unknown >= 0) {
        out.push_back(unknown);
      }
    }
  }
}

}  // namespace strata::tokenizer
