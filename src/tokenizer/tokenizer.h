// Text <-> token ids for the vocabularies GGUF files carry: SentencePiece-style BPE
// (tokenizer.ggml.model = "llama") and GPT-2-style byte-level BPE ("gpt2"), following
// llama.cpp's behaviour so that its test vectors reproduce exactly, and Hugging Face's where the
// two part (Qwen's NFC, o200k's and DeepSeek V3's regexes as tokenizer.json states them).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace strata::tokenizer {

using Token = int32_t;

class Tokenizer {
 public:
  // Throws std::runtime_error naming the problem (unknown tokenizer.ggml.model or .pre, missing
  // or mistyped keys, special token ids outside the vocabulary).
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // parse_special: control-token text such as "<|eot_id|>" or "<s>" becomes that token;
  // otherwise it is tokenized as plain text. User-defined tokens are always matched.
  std::vector<Token> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // Concatenated token_piece()s, except that the space SentencePiece vocabularies put in front
  // of the text is removed again.
  std::string decode(std::span<const Token> tokens) const;
  // The bytes a token stands for in output; empty for control and unknown tokens. Pieces may be
  // partial UTF-8 sequences (byte tokens); StreamDecoder reassembles them.
  std::string token_piece(Token token) const;

  int vocab_size() const;
  Token bos() const;  // -1 if none
  Token eos() const;  // -1 if none
  bool add_bos_by_default() const;
  // Whether a whole text ends with eos (tokenizer.ggml.add_eos_token), as embedding models'
  // texts do: Qwen3-Embedding pools the eos row.
  bool add_eos_by_default() const;
  // eos, tokenizer.ggml.eot_token_id / eom_token_id, and tokens such as <|eot_id|>, <|im_end|>,
  // <|end|> and <end_of_turn>.
  bool is_end_of_generation(Token token) const;
  std::optional<Token> find_token(std::string_view text) const;
  bool is_control(Token token) const;
  // The vocabulary's text of a token, control tokens' included ("<s>", "<|im_end|>").
  std::string token_text(Token token) const;
  // The texts encode() turns into tokens only when parse_special is on (control and unknown
  // tokens), longest first.
  std::vector<std::string> special_texts() const;

  // Defined in tokenizer_impl.h, for the tokenizer's own source files.
  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<const Impl> impl);
  std::unique_ptr<const Impl> impl_;
};

// Turns generated tokens into text piece by piece without ever emitting broken UTF-8: bytes of
// an incomplete sequence wait for the next token, invalid bytes become U+FFFD. The tokenizer must
// outlive the decoder.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer);
  std::string push(Token token);
  // Whatever is still pending, as U+FFFD.
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace strata::tokenizer
