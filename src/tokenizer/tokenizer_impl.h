// The vocabulary and settings behind a Tokenizer, shared by its source files.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

// Values of tokenizer.ggml.token_type, as llama.cpp numbers them.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

enum class Model {
  SentencePiece,  // tokenizer.ggml.model = "llama": merges ranked by token score, byte fallback
  ByteLevelBpe,   // tokenizer.ggml.model = "gpt2": ranked merges over GPT-2's byte alphabet
};

// Lets the maps be searched with a string_view without building a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
template <typename Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

struct Tokenizer::Impl {
  Model model = Model::SentencePiece;
  std::vector<std::string> texts;   // as stored in the vocabulary
  std::vector<std::string> pieces;  // the bytes each token decodes to
  std::vector<float> scores;
  std::vector<TokenType> types;
  StringMap<Token> ids;

  // SentencePiece
  bool add_space_prefix = false;
  std::array<Token, 256> byte_tokens{};  // <0xNN> tokens, -1 where missing

  // Byte-level BPE
  StringMap<int32_t> merge_ranks;  // "left right" -> rank, lower merges first
  PreTokenizer pre_tokenizer = PreTokenizer::Gpt2;
  bool ignore_merges = false;  // a piece that is a whole token is taken as is (Llama 3)
  bool normalize_to_nfc = false;  // text goes to NFC before it is split (Qwen)

  Token bos = -1;
  Token eos = -1;
  Token unknown = -1;
  bool add_bos = false;
  bool add_eos = false;  // tokenizer.ggml.add_eos_token: texts to embed end with eos
  std::vector<Token> end_of_generation;  // sorted
  std::vector<Token> special_tokens;     // control, user-defined and unknown; longest text first

  const Token* find(std::string_view text) const {
    auto it = ids.find(text);
    return it == ids.end() ? nullptr : &it->second;
  }
  void encode_sentencepiece(std::string_view text, bool prefix_space,
                            std::vector<Token>& out) const;
  void encode_byte_level(std::string_view text, std::vector<Token>& out) const;
};

}  // namespace strata::tokenizer
