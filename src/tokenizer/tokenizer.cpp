#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace strata::tokenizer {

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw std::runtime_error("tokenizer: " + message);
}

const gguf::Array& required_array(const gguf::File& file, std::string_view key,
                                  gguf::ValueType element_type) {
  const gguf::Array* array = file.get_array(key);
  if (array == nullptr) fail("missing key " + std::string(key));
  if (array->element_type != element_type) {
    fail(std::string(key) + " holds " + gguf::value_type_name(array->element_type) +
         " items, expected " + gguf::value_type_name(element_type));
  }
  return *array;
}

const gguf::Array* optional_array_of_size(const gguf::File& file, std::string_view key,
                                          size_t size) {
  const gguf::Array* array = file.get_array(key);
  if (array != nullptr && array->items.size() != size) {
    fail(std::string(key) + " has " + std::to_string(array->items.size()) +
         " items but there are " + std::to_string(size) + " tokens");
  }
  return array;
}

// `fallback` applies when the key is absent; an id outside the vocabulary is an error.
Token special_token_id(const gguf::File& file, std::string_view key, Token fallback,
                       size_t vocab_size) {
  const std::optional<uint64_t> id = file.get_uint(key);
  if (!id) return fallback < static_cast<Token>(vocab_size) ? fallback : -1;
  if (*id >= vocab_size) {
    fail(std::string(key) + " = " + std::to_string(*id) + " is outside the vocabulary of " +
         std::to_string(vocab_size) + " tokens");
  }
  return static_cast<Token>(*id);
}

// "<0x41>" -> 0x41
std::optional<uint8_t> parse_byte_token(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return std::nullopt;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') {
      value += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value += c - 'a' + 10;
    } else {
      return std::nullopt;
    }
  }
  return static_cast<uint8_t>(value);
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string result;
  size_t pos = 0;
  for (size_t found; (found = text.find(from, pos)) != std::string_view::npos;
       pos = found + from.size()) {
    result.append(text.substr(pos, found - pos));
    result.append(to);
  }
  result.append(text.substr(pos));
  return result;
}

// Byte-level vocabularies spell bytes with GPT-2's alphabet; characters outside it (added
// tokens) stand for themselves.
std::string unmap_byte_level(std::string_view text) {
  std::string bytes;
  for (size_t pos = 0; pos < text.size();) {
    const unicode::Utf8Decoded decoded = unicode::decode_utf8_at(text, pos);
    if (auto byte = unicode::codepoint_to_byte(decoded.codepoint);
        byte && decoded.status == unicode::Utf8Status::Valid) {
      bytes += static_cast<char>(*byte);
    } else {
      bytes.append(text.substr(pos, decoded.length));
    }
    pos += decoded.length;
  }
  return bytes;
}

// Chat-format end markers that llama.cpp also treats as ending generation.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eom_id|>",
    "<EOT>",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek's <｜end▁of▁sentence｜>
};

void load_vocabulary(const gguf::File& file, Tokenizer::Impl& impl) {
  const gguf::Array& tokens =
      required_array(file, "tokenizer.ggml.tokens", gguf::ValueType::String);
  const size_t n = tokens.items.size();
  if (n == 0) fail("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(std::numeric_limits<Token>::max())) fail("too many tokens");
  const gguf::Array* scores = optional_array_of_size(file, "tokenizer.ggml.scores", n);
  const gguf::Array* types = optional_array_of_size(file, "tokenizer.ggml.token_type", n);

  impl.texts.reserve(n);
  impl.scores.assign(n, 0.0f);
  impl.types.assign(n, TokenType::Normal);
  impl.ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    impl.texts.push_back(*tokens.items[i].as_string());
    if (scores != nullptr) {
      const std::optional<double> score = scores->items[i].as_float();
      if (!score) fail("tokenizer.ggml.scores[" + std::to_string(i) + "] is not a number");
      impl.scores[i] = static_cast<float>(*score);
    }
    if (types != nullptr) {
      const std::optional<int64_t> type = types->items[i].as_int();
      const bool known = type && *type >= 0 && *type <= static_cast<int64_t>(TokenType::Byte);
      impl.types[i] = known ? static_cast<TokenType>(*type) : TokenType::Undefined;
    }
    // A repeated text keeps its first id, which is the one encoding can produce.
    impl.ids.emplace(impl.texts[i], static_cast<Token>(i));
  }
}

void load_merges(const gguf::File& file, Tokenizer::Impl& impl) {
  const gguf::Array& merges =
      required_array(file, "tokenizer.ggml.merges", gguf::ValueType::String);
  impl.merge_ranks.reserve(merges.items.size());
  for (size_t rank = 0; rank < merges.items.size(); ++rank) {
    impl.merge_ranks.emplace(*merges.items[rank].as_string(), static_cast<int32_t>(rank));
  }
}

void compute_pieces(Tokenizer::Impl& impl) {
  impl.pieces.resize(impl.texts.size());
  impl.byte_tokens.fill(-1);
  for (size_t id = 0; id < impl.texts.size(); ++id) {
    const std::string& text = impl.texts[id];
    switch (impl.types[id]) {
      case TokenType::Normal:
        impl.pieces[id] = impl.model == Model::SentencePiece
                              ? replace_all(text, "\xE2\x96\x81", " ")
                              : unmap_byte_level(text);
        break;
      case TokenType::UserDefined: impl.pieces[id] = text; break;
      case TokenType::Byte: {
        const std::optional<uint8_t> byte = parse_byte_token(text);
        if (!byte) fail("byte token " + std::to_string(id) + " is not of the form <0xNN>: " + text);
        impl.pieces[id] = std::string(1, static_cast<char>(*byte));
        if (impl.byte_tokens[*byte] < 0) impl.byte_tokens[*byte] = static_cast<Token>(id);
        break;
      }
      case TokenType::Undefined:
      case TokenType::Unknown:
      case TokenType::Control:
      case TokenType::Unused: break;  // nothing to show in output text
    }
  }
}

void collect_special_tokens(Tokenizer::Impl& impl) {
  for (size_t id = 0; id < impl.texts.size(); ++id) {
    const TokenType type = impl.types[id];
    if (type == TokenType::Control || type == TokenType::UserDefined ||
        type == TokenType::Unknown) {
      impl.special_tokens.push_back(static_cast<Token>(id));
    }
  }
  std::stable_sort(impl.special_tokens.begin(), impl.special_tokens.end(), [&](Token a, Token b) {
    return impl.texts[static_cast<size_t>(a)].size() > impl.texts[static_cast<size_t>(b)].size();
  });
}

void collect_end_of_generation(Tokenizer::Impl& impl, const gguf::File& file) {
  const size_t n = impl.texts.size();
  for (std::string_view key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (Token id = special_token_id(file, key, -1, n); id >= 0)
      impl.end_of_generation.push_back(id);
  }
  if (impl.eos >= 0) impl.end_of_generation.push_back(impl.eos);
  for (std::string_view text : kEndOfGenerationTexts) {
    if (const Token* id = impl.find(text)) impl.end_of_generation.push_back(*id);
  }
  // Harmony (gpt-oss) ends its answer with <|return|> and a tool call with <|call|>; its <|end|>
  // closes one message of several (the reasoning before the answer), so generation goes on,
  // whatever the metadata names as end-of-turn.
  if (impl.find("<|return|>") && impl.find("<|channel|>")) {
    if (const Token* end = impl.find("<|end|>"))
      std::erase(impl.end_of_generation, *end);
    impl.end_of_generation.push_back(*impl.find("<|return|>"));
    if (const Token* call = impl.find("<|call|>")) impl.end_of_generation.push_back(*call);
  }
  std::sort(impl.end_of_generation.begin(), impl.end_of_generation.end());
  impl.end_of_generation.erase(
      std::unique(impl.end_of_generation.begin(), impl.end_of_generation.end()),
      impl.end_of_generation.end());
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& file) {
  auto impl = std::make_unique<Impl>();
  const std::optional<std::string> model = file.get_string("tokenizer.ggml.model");
  if (!model) fail("missing key tokenizer.ggml.model");
  if (*model == "llama") {
    impl->model = Model::SentencePiece;
  } else if (*model == "gpt2") {
    impl->model = Model::ByteLevelBpe;
  } else {
    fail("unknown tokenizer.ggml.model '" + *model + "' (supported: llama, gpt2)");
  }

  load_vocabulary(file, *impl);
  const size_t n = impl->texts.size();
  bool add_bos_default = false;
  Token default_bos = -1, default_eos = -1, default_unknown = -1;
  if (impl->model == Model::SentencePiece) {
    impl->add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    add_bos_default = true;
    // llama.cpp's defaults, which are Llama's ids.
    default_bos = 1;
    default_eos = 2;
    default_unknown = 0;
  } else {
    load_merges(file, *impl);
    const std::string pre = file.get_string("tokenizer.ggml.pre").value_or("default");
    const std::optional<PreTokenizer> pre_tokenizer = pre_tokenizer_from_name(pre);
    if (!pre_tokenizer) fail("unknown tokenizer.ggml.pre '" + pre + "'");
    impl->pre_tokenizer = *pre_tokenizer;
    // Llama 3's own vocabularies (not the other users of its regex) skip merges for whole-token
    // pieces and start prompts with BOS.
    const bool llama3_vocabulary = pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe";
    impl->ignore_merges = llama3_vocabulary;
    add_bos_default = llama3_vocabulary;
    // Qwen's tokenizer.json has an NFC normalizer, which GGUF files do not record (llama.cpp
    // does not normalize); its pre-tokenizer, which only Qwen's vocabularies name, stands for it.
    impl->normalize_to_nfc = impl->pre_tokenizer == PreTokenizer::Qwen2;
  }
  impl->bos = special_token_id(file, "tokenizer.ggml.bos_token_id", default_bos, n);
  impl->eos = special_token_id(file, "tokenizer.ggml.eos_token_id", default_eos, n);
  impl->unknown = special_token_id(file, "tokenizer.ggml.unknown_token_id", default_unknown, n);
  impl->add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(add_bos_default);
  impl->add_eos = file.get_bool("tokenizer.ggml.add_eos_token").value_or(false) && impl->eos >= 0;
  if (impl->add_bos && impl->bos < 0) {
    fail("tokenizer.ggml.add_bos_token is set but there is no tokenizer.ggml.bos_token_id");
  }

  compute_pieces(*impl);
  collect_special_tokens(*impl);
  collect_end_of_generation(*impl, file);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Tokenizer(std::unique_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

namespace {

// A stretch of raw text, or a special token found in the input (token >= 0).
struct Fragment {
  std::string_view text;
  Token token = -1;
};

// Cuts special-token texts out of the input, longest token first, as llama.cpp does.
std::vector<Fragment> split_on_special_tokens(const Tokenizer::Impl& impl, std::string_view text,
                                              bool parse_special) {
  // No fragment for empty text: SentencePiece would otherwise turn "" into its space prefix.
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({text});
  std::vector<Fragment> next;
  for (Token id : impl.special_tokens) {
    if (!parse_special && impl.types[static_cast<size_t>(id)] != TokenType::UserDefined) continue;
    const std::string& needle = impl.texts[static_cast<size_t>(id)];
    if (needle.empty()) continue;
    const bool occurs = std::any_of(fragments.begin(), fragments.end(), [&](const Fragment& f) {
      return f.token < 0 && f.text.find(needle) != std::string_view::npos;
    });
    if (!occurs) continue;
    next.clear();
    for (const Fragment& fragment : fragments) {
      if (fragment.token >= 0) {
        next.push_back(fragment);
        continue;
      }
      size_t pos = 0;
      for (size_t found; (found = fragment.text.find(needle, pos)) != std::string_view::npos;
           pos = found + needle.size()) {
        if (found > pos) next.push_back({fragment.text.substr(pos, found - pos)});
        next.push_back({{}, id});
      }
      if (pos < fragment.text.size()) next.push_back({fragment.text.substr(pos)});
    }
    fragments.swap(next);
  }
  return fragments;
}

}  // namespace

std::vector<Token> Tokenizer::encode(std::string_view text, bool add_bos,
                                     bool parse_special) const {
  std::vector<Token> tokens;
  if (add_bos && impl_->bos >= 0) tokens.push_back(impl_->bos);
  // SentencePiece prefixes a space to the text and to every stretch after a special token.
  bool after_special = true;
  for (const Fragment& fragment : split_on_special_tokens(*impl_, text, parse_special)) {
    if (fragment.token >= 0) {
      tokens.push_back(fragment.token);
      after_special = true;
      continue;
    }
    if (impl_->model == Model::SentencePiece) {
      impl_->encode_sentencepiece(fragment.text, impl_->add_space_prefix && after_special, tokens);
    } else if (impl_->normalize_to_nfc) {
      impl_->encode_byte_level(unicode::to_nfc(fragment.text), tokens);
    } else {
      impl_->encode_byte_level(fragment.text, tokens);
    }
    after_special = false;
  }
  return tokens;
}

std::string Tokenizer::decode(std::span<const Token> tokens) const {
  std::string text;
  bool strip_prefix_space = impl_->add_space_prefix;
  for (Token token : tokens) {
    const std::string piece = token_piece(token);
    if (strip_prefix_space && !piece.empty()) {
      text.append(piece, piece.front() == ' ' ? 1 : 0);
      strip_prefix_space = false;
    } else {
      text += piece;
    }
  }
  return text;
}

std::string Tokenizer::token_piece(Token token) const {
  if (token < 0 || token >= vocab_size()) {
    throw std::out_of_range("tokenizer: token " + std::to_string(token) +
                            " is outside the vocabulary");
  }
  return impl_->pieces[static_cast<size_t>(token)];
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->texts.size()); }
Token Tokenizer::bos() const { return impl_->bos; }
Token Tokenizer::eos() const { return impl_->eos; }
bool Tokenizer::add_bos_by_default() const { return impl_->add_bos; }

bool Tokenizer::add_eos_by_default() const { return impl_->add_eos; }

bool Tokenizer::is_end_of_generation(Token token) const {
  return std::binary_search(impl_->end_of_generation.begin(), impl_->end_of_generation.end(),
                            token);
}

std::optional<Token> Tokenizer::find_token(std::string_view text) const {
  if (const Token* id = impl_->find(text)) return *id;
  return std::nullopt;
}

bool Tokenizer::is_control(Token token) const {
  return token >= 0 && token < vocab_size() &&
         impl_->types[static_cast<size_t>(token)] == TokenType::Control;
}

std::string Tokenizer::token_text(Token token) const {
  if (token < 0 || token >= vocab_size()) return {};
  return impl_->texts[static_cast<size_t>(token)];
}

std::vector<std::string> Tokenizer::special_texts() const {
  std::vector<std::string> texts;
  for (Token t : impl_->special_tokens) {
    const std::string& text = impl_->texts[static_cast<size_t>(t)];
    if (impl_->types[static_cast<size_t>(t)] != TokenType::UserDefined && !text.empty()) texts.push_back(text);
  }
  return texts;
}

}  // namespace strata::tokenizer
