// Pre-tokenizers for byte-level BPE: they split text into the pieces that BPE merges stay within.
//
// Each one reproduces a list of regexes from Hugging Face tokenizer.json files, applied the way
// llama.cpp applies them: every regex splits every piece left by the previous one, and both its
// matches and the text between matches become pieces. The regexes need Unicode classes that
// std::regex lacks, so each is a hand-written matcher over code points.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace strata::tokenizer {

enum class PreTokenizer {
  Gpt2,           // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
  Llama3,         // the Llama 3 regex, digits in groups of up to three
  Qwen2,          // the Llama 3 regex with single digits
  Gpt4o,          // o200k (gpt-oss): words split by case, contractions attached, digits by three
  DeepseekV3,     // digits by three, then CJK and kana runs, then words, punctuation, whitespace
  DeepseekLlm,    // newlines, cased-letter runs, punctuation runs, trailing spaces, CJK, numbers
  DeepseekCoder,  // newlines, letter runs, punctuation runs, CJK, single digits
  Falcon,         // punctuation runs, then GPT-2, then groups of three ASCII digits
  Starcoder,      // single digits, then GPT-2
};

// The tokenizer.ggml.pre names we implement; nullopt for any other name.
std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name);

// The pieces are views into `text` and concatenate back to it. Invalid UTF-8 is kept byte for
// byte (each bad byte is classified as U+FFFD).
std::vector<std::string_view> pre_tokenize(PreTokenizer kind, std::string_view text);

}  // namespace strata::tokenizer
