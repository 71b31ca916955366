// GPT-2 style byte-level BPE: each pre-tokenized piece is rewritten in GPT-2's byte alphabet and
// its characters are merged by the rank of tokenizer.ggml.merges, lowest rank first.
#include "tokenizer/pair_merger.h"
#include "tokenizer/tokenizer_impl.h"

namespace strata::tokenizer {

void Tokenizer::Impl::encode_byte_level(std::string_view text, std::vector<Token>& out) const {
  std::string word;
  std::string merge_key;
  const auto rank_priority = [&](std::string_view left,
                                 std::string_view right) -> std::optional<double> {
    merge_key.assign(left);
    merge_key += ' ';
    merge_key += right;
    auto it = merge_ranks.find(merge_key);
    if (it == merge_ranks.end()) return std::nullopt;
    return -static_cast<double>(it->second);
  };

  for (std::string_view piece : pre_tokenize(pre_tokenizer, text)) {
    word.clear();
    for (char c : piece) {
      unicode::append_utf8(word, unicode::byte_to_codepoint(static_cast<uint8_t>(c)));
    }
    if (ignore_merges) {
      if (const Token* token = find(word)) {
        out.push_back(*token);
        continue;
      }
    }
    for (std::string_view symbol : merge_pairs(word, rank_priority)) {
      if (const Token* token = find(symbol)) {
        out.push_back(*token);
        continue;
      }
      // A merge whose result is missing from the vocabulary: fall back to its characters, which
      // a byte-level vocabulary always has.
      for (size_t pos = 0; pos < symbol.size();) {
        const size_t length = unicode::decode_utf8_at(symbol, pos).length;
        if (const Token* token = find(symbol.substr(pos, length))) {
          out.push_back(*token);
        } else if (unknown >= 0) {
          out.push_back(unknown);
        }
        pos += length;
      }
    }
  }
}

}  // namespace strata::tokenizer
