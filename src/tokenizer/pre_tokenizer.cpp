#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <utility>

#include "tokenizer/unicode.h"

namespace strata::tokenizer {

using unicode::classify;
using unicode::CodepointClass;
using unicode::is_letter;
using unicode::is_number;
using unicode::is_whitespace;

std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name) {
  struct Entry {
    std::string_view name;
    PreTokenizer kind;
  };
  // "default" (and a missing key, handled by the caller) mean GPT-2's own regex. llama.cpp uses
  // a punctuation-splitting variant there, but vocabularies without a pre key come from GPT-2
  // style tokenizers (GPT-NeoX among them), whose tokenizer.json uses the plain GPT-2 regex.
  static constexpr std::array kEntries = {
      Entry{"default", PreTokenizer::Gpt2},
      Entry{"gpt-2", PreTokenizer::Gpt2},
      Entry{"mpt", PreTokenizer::Gpt2},
      Entry{"llama3", PreTokenizer::Llama3},
      Entry{"llama-v3", PreTokenizer::Llama3},
      Entry{"llama-bpe", PreTokenizer::Llama3},
      Entry{"dbrx", PreTokenizer::Llama3},
      Entry{"smaug-bpe", PreTokenizer::Llama3},
      // GLM-4's regex is Llama 3's, letter for letter (as llama.cpp has them).
      Entry{"glm4", PreTokenizer::Llama3},
      Entry{"chatglm-bpe", PreTokenizer::Llama3},
      Entry{"qwen2", PreTokenizer::Qwen2},
      Entry{"gpt-4o", PreTokenizer::Gpt4o},
      Entry{"deepseek-v3", PreTokenizer::DeepseekV3},
      Entry{"deepseek-llm", PreTokenizer::DeepseekLlm},
      Entry{"deepseek-coder", PreTokenizer::DeepseekCoder},
      Entry{"falcon", PreTokenizer::Falcon},
      Entry{"starcoder", PreTokenizer::Starcoder},
      Entry{"refact", PreTokenizer::Starcoder},
  };
  for (const Entry& entry : kEntries) {
    if (entry.name == name) return entry.kind;
  }
  return std::nullopt;
}

namespace {

// Matchers see one piece at a time, so lookaheads and `$` stop at the piece's end, as they do
// when a regex is run over each piece separately. They return the length of the match starting
// at `pos` (leftmost alternative first, like the regex), or 0 for no match.
using Piece = std::u32string_view;
using Matcher = size_t (*)(Piece s, size_t pos);

struct CodepointRun {
  char32_t first;
  char32_t last;
};

bool in_ranges(std::span<const CodepointRun> ranges, char32_t cp) {
  return std::any_of(ranges.begin(), ranges.end(),
                     [cp](const CodepointRun& r) { return cp >= r.first && cp <= r.last; });
}

bool is_space(char32_t cp) { return cp == ' '; }
bool is_newline(char32_t cp) { return cp == '\r' || cp == '\n'; }
bool is_punctuation(char32_t cp) { return classify(cp) == CodepointClass::Punctuation; }
bool is_punctuation_or_symbol(char32_t cp) {
  const CodepointClass cls = classify(cp);
  return cls == CodepointClass::Punctuation || cls == CodepointClass::Symbol;
}
bool is_letter_or_mark(char32_t cp) {
  return is_letter(cp) || classify(cp) == CodepointClass::Mark;
}
bool is_ascii_letter(char32_t cp) { return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'); }
bool is_ascii_digit(char32_t cp) { return cp >= '0' && cp <= '9'; }
// [!-/:-@[-`{-~]
bool is_ascii_punctuation(char32_t cp) {
  return cp >= '!' && cp <= '~' && !is_ascii_letter(cp) && !is_ascii_digit(cp);
}
// o200k's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}]: the capitals, or the
// lower-case letters, each with the letters and marks that have no case.
bool is_caseless(CodepointClass cls) {
  return cls == CodepointClass::ModifierLetter || cls == CodepointClass::OtherLetter ||
         cls == CodepointClass::Mark;
}
bool is_upper_or_caseless(char32_t cp) {
  const CodepointClass cls = classify(cp);
  return cls == CodepointClass::UppercaseLetter || cls == CodepointClass::TitlecaseLetter ||
         is_caseless(cls);
}
bool is_lower_or_caseless(char32_t cp) {
  const CodepointClass cls = classify(cp);
  return cls == CodepointClass::LowercaseLetter || is_caseless(cls);
}
// [^\s\p{L}\p{N}]
bool is_other(char32_t cp) { return !is_whitespace(cp) && !is_letter(cp) && !is_number(cp); }
// [^\r\n\p{L}\p{N}]
bool is_letter_prefix(char32_t cp) { return !is_newline(cp) && !is_letter(cp) && !is_number(cp); }
// [^\r\n\p{L}\p{P}\p{S}]
bool is_letter_prefix_not_punctuation(char32_t cp) {
  return !is_newline(cp) && !is_letter(cp) && !is_punctuation_or_symbol(cp);
}

// The run of characters from `pos` that match, counted up to `limit`: a bounded repetition such
// as \p{N}{1,3} must not look further, or a long run would be scanned once per match.
template <typename Predicate>
size_t run_length(Piece s, size_t pos, Predicate matches, size_t limit = Piece::npos) {
  size_t n = 0;
  while (n < limit && pos + n < s.size() && matches(s[pos + n])) ++n;
  return n;
}

// `P?X+`: the optional prefix is tried first, then the regex backtracks to doing without it.
template <typename PrefixPredicate, typename Predicate>
size_t optional_prefix_then_run(Piece s, size_t pos, PrefixPredicate prefix, Predicate matches) {
  if (prefix(s[pos])) {
    if (size_t n = run_length(s, pos + 1, matches)) return 1 + n;
  }
  return run_length(s, pos, matches);
}

template <typename Predicate>
size_t optional_space_then_run(Piece s, size_t pos, Predicate matches) {
  return optional_prefix_then_run(s, pos, is_space, matches);
}

// 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive for ASCII letters only (as llama.cpp,
// which lower-cases with a simple mapping under which no non-ASCII letter becomes one of these).
size_t contraction(Piece s, size_t pos, bool ignore_case) {
  if (s[pos] != '\'') return 0;
  const auto letter_at = [&](size_t i) -> char32_t {
    if (i >= s.size()) return 0;
    const char32_t cp = s[i];
    return ignore_case && cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp;
  };
  const char32_t first = letter_at(pos + 1);
  if (first == 's' || first == 't' || first == 'm' || first == 'd') return 2;
  const char32_t second = letter_at(pos + 2);
  if ((first == 'r' && second == 'e') || (first == 'v' && second == 'e') ||
      (first == 'l' && second == 'l')) {
    return 3;
  }
  return 0;
}

// \s+(?!\S): a whitespace run, less its last character when something other than whitespace
// follows (that character then prefixes the next word).
size_t whitespace_not_before_text(Piece s, size_t pos) {
  const size_t n = run_length(s, pos, is_whitespace);
  return pos + n == s.size() ? n : (n > 0 ? n - 1 : 0);
}

size_t match_gpt2(Piece s, size_t pos) {
  if (size_t n = contraction(s, pos, false)) return n;
  if (size_t n = optional_space_then_run(s, pos, is_letter)) return n;
  if (size_t n = optional_space_then_run(s, pos, is_number)) return n;
  if (size_t n = optional_space_then_run(s, pos, is_other)) return n;
  return whitespace_not_before_text(s, pos);
}

// \s*[\r\n]+|\s+(?!\S)|\s+, the alternatives that end the Llama 3 family of regexes.
size_t whitespace_alternatives(Piece s, size_t pos) {
  const size_t whitespace = run_length(s, pos, is_whitespace);
  // \s*[\r\n]+ ends at the last newline of the whitespace run.
  for (size_t n = whitespace; n > 0; --n) {
    if (is_newline(s[pos + n - 1])) return n;
  }
  if (whitespace > 1 && pos + whitespace < s.size()) return whitespace - 1;
  return whitespace;
}

// \p{N}{1,max_digits}
size_t numbers_up_to(Piece s, size_t pos, size_t max_digits) {
  return run_length(s, pos, is_number, max_digits);
}

// `P?X+T*` for a one-character prefix P (tried first), a run X and a trailing run T.
template <typename PrefixPredicate, typename Predicate, typename TrailingPredicate>
size_t optional_prefix_run_then_trailing(Piece s, size_t pos, PrefixPredicate prefix,
                                         Predicate matches, TrailingPredicate trailing) {
  const size_t n = optional_prefix_then_run(s, pos, prefix, matches);
  return n == 0 ? 0 : n + run_length(s, pos + n, trailing);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3_family(Piece s, size_t pos, size_t max_digits) {
  if (size_t n = contraction(s, pos, true)) return n;
  if (size_t n = optional_prefix_then_run(s, pos, is_letter_prefix, is_letter)) return n;
  if (size_t n = numbers_up_to(s, pos, max_digits)) return n;
  if (size_t n = optional_prefix_run_then_trailing(s, pos, is_space, is_other, is_newline)) {
    return n;
  }
  return whitespace_alternatives(s, pos);
}

size_t match_llama3(Piece s, size_t pos) { return match_llama3_family(s, pos, 3); }
size_t match_qwen2(Piece s, size_t pos) { return match_llama3_family(s, pos, 1); }

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+: the first part takes its longest
// run, then gives characters back until the second can start.
size_t upper_then_lower(Piece s, size_t pos) {
  const size_t upper = run_length(s, pos, is_upper_or_caseless);
  for (size_t taken = upper + 1; taken-- > 0;) {
    if (pos + taken < s.size() && is_lower_or_caseless(s[pos + taken])) {
      return taken + run_length(s, pos + taken, is_lower_or_caseless);
    }
  }
  return 0;
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
size_t upper_then_optional_lower(Piece s, size_t pos) {
  const size_t upper = run_length(s, pos, is_upper_or_caseless);
  return upper == 0 ? 0 : upper + run_length(s, pos + upper, is_lower_or_caseless);
}

// [^\r\n\p{L}\p{N}]?WORD(?i:'s|'t|'re|'ve|'m|'ll|'d)?, the prefix tried first.
size_t o200k_word(Piece s, size_t pos, size_t (*word)(Piece, size_t)) {
  const auto word_from = [&](size_t start) -> size_t {
    const size_t n = start < s.size() ? word(s, start) : 0;
    if (n == 0) return 0;
    const size_t end = start + n;
    return end - pos + (end < s.size() ? contraction(s, end, true) : 0);
  };
  if (is_letter_prefix(s[pos])) {
    if (size_t n = word_from(pos + 1)) return n;
  }
  return word_from(pos);
}

// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)?|
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)?|
// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_o200k(Piece s, size_t pos) {
  if (size_t n = o200k_word(s, pos, upper_then_lower)) return n;
  if (size_t n = o200k_word(s, pos, upper_then_optional_lower)) return n;
  if (size_t n = numbers_up_to(s, pos, 3)) return n;
  // The '/' of [\r\n/]* can never follow the run, which takes every '/' itself.
  if (size_t n = optional_prefix_run_then_trailing(s, pos, is_space, is_other, is_newline)) {
    return n;
  }
  return whitespace_alternatives(s, pos);
}

// \p{N}{1,3}
size_t match_up_to_three_numbers(Piece s, size_t pos) { return numbers_up_to(s, pos, 3); }

// [一-龥぀-ゟ゠-ヿ]: CJK ideographs, hiragana and katakana.
constexpr CodepointRun kDeepseekV3CjkAndKana[] = {
    {0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}};

// [一-龥぀-ゟ゠-ヿ]+
size_t match_cjk_and_kana(Piece s, size_t pos) {
  return run_length(s, pos, [](char32_t cp) { return in_ranges(kDeepseekV3CjkAndKana, cp); });
}

// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
size_t ascii_punctuation_then_ascii_letters(Piece s, size_t pos) {
  if (!is_ascii_punctuation(s[pos])) return 0;
  const size_t letters = run_length(s, pos + 1, is_ascii_letter);
  return letters == 0 ? 0 : 1 + letters;
}

// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_deepseek_v3_text(Piece s, size_t pos) {
  if (size_t n = ascii_punctuation_then_ascii_letters(s, pos)) return n;
  if (size_t n = optional_prefix_then_run(s, pos, is_letter_prefix_not_punctuation,
                                          is_letter_or_mark)) {
    return n;
  }
  if (size_t n = optional_prefix_run_then_trailing(s, pos, is_space, is_punctuation_or_symbol,
                                                   is_newline)) {
    return n;
  }
  return whitespace_alternatives(s, pos);
}

// [\r\n]
size_t match_newline(Piece s, size_t pos) { return is_newline(s[pos]) ? 1 : 0; }

// llama.cpp runs the DeepSeek regexes that name no \p{..} class through std::wregex after
// replacing non-ASCII whitespace by '\v', so explicit character ranges never match whitespace.
template <const auto& kRanges>
bool in_class_not_whitespace(char32_t cp) {
  return !is_whitespace(cp) && in_ranges(kRanges, cp);
}

// The cased letters of DeepSeek's tokenizer.json: [A-Za-zµÀ-ÖØ-öø-ƺ...𞤀-𞥃]. Some of
// its characters (Greek Extended, Ω, K) have canonical equivalents elsewhere; these are the code
// points of the original, un-normalised regex.
constexpr CodepointRun kDeepseekCasedLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

// [!-/:-~！-／：-～‘-‟　-。]: ASCII punctuation, symbols and letters, their full-width forms, curly
// quotes and the ideographic full stop and comma.
constexpr CodepointRun kDeepseekPunctuation[] = {
    {0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002},
};

// [一-龥ࠀ-一가-퟿]: a wide band of CJK and other scripts from U+0800, and Hangul.
constexpr CodepointRun kDeepseekCjk[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

// \s?[cased letters]+
size_t match_deepseek_cased_letters(Piece s, size_t pos) {
  return optional_prefix_then_run(s, pos, is_whitespace,
                                  in_class_not_whitespace<kDeepseekCasedLetters>);
}

// \s?[!-/:-~！-／：-～‘-‟　-。]+
size_t match_deepseek_punctuation(Piece s, size_t pos) {
  return optional_prefix_then_run(s, pos, is_whitespace,
                                  in_class_not_whitespace<kDeepseekPunctuation>);
}

// [一-龥ࠀ-一가-퟿]+
size_t match_deepseek_cjk(Piece s, size_t pos) {
  return run_length(s, pos, in_class_not_whitespace<kDeepseekCjk>);
}

// \s+$
size_t match_trailing_whitespace(Piece s, size_t pos) {
  // Inside a whitespace run the search already failed one position earlier, so the run does not
  // reach the end; saying so at once keeps long runs linear rather than quadratic.
  if (pos > 0 && is_whitespace(s[pos - 1])) return 0;
  const size_t n = run_length(s, pos, is_whitespace);
  return pos + n == s.size() ? n : 0;
}

// \p{N}+
size_t match_numbers(Piece s, size_t pos) { return run_length(s, pos, is_number); }

// \p{N}
size_t match_single_number(Piece s, size_t pos) { return is_number(s[pos]) ? 1 : 0; }

// \s?\p{L}+
size_t match_letters_after_optional_space(Piece s, size_t pos) {
  return optional_prefix_then_run(s, pos, is_whitespace, is_letter);
}

// \s?\p{P}+
size_t match_punctuation_after_optional_space(Piece s, size_t pos) {
  return optional_prefix_then_run(s, pos, is_whitespace, is_punctuation);
}

// [\p{P}\$\+<=>\^~\|`]+: punctuation together with the ASCII symbols.
size_t match_punctuation_and_ascii_symbols(Piece s, size_t pos) {
  return run_length(s, pos, [](char32_t cp) {
    return is_punctuation(cp) || std::u32string_view(U"$+<=>^~|`").find(cp) != Piece::npos;
  });
}

// [0-9][0-9][0-9]
size_t match_three_ascii_digits(Piece s, size_t pos) {
  if (pos + 3 > s.size()) return 0;
  return std::all_of(s.begin() + pos, s.begin() + pos + 3, is_ascii_digit) ? 3 : 0;
}

std::span<const Matcher> matchers_for(PreTokenizer kind) {
  static constexpr Matcher kGpt2[] = {match_gpt2};
  static constexpr Matcher kLlama3[] = {match_llama3};
  static constexpr Matcher kQwen2[] = {match_qwen2};
  static constexpr Matcher kGpt4o[] = {match_o200k};
  static constexpr Matcher kDeepseekV3[] = {match_up_to_three_numbers, match_cjk_and_kana,
                                            match_deepseek_v3_text};
  static constexpr Matcher kDeepseekLlm[] = {
      match_newline,
      match_deepseek_cased_letters,
      match_deepseek_punctuation,
      match_trailing_whitespace,
      match_deepseek_cjk,
      match_numbers,
  };
  static constexpr Matcher kDeepseekCoder[] = {
      match_newline,
      match_letters_after_optional_space,
      match_punctuation_after_optional_space,
      match_deepseek_cjk,
      match_single_number,
  };
  static constexpr Matcher kFalcon[] = {match_punctuation_and_ascii_symbols, match_gpt2,
                                        match_three_ascii_digits};
  static constexpr Matcher kStarcoder[] = {match_single_number, match_gpt2};
  switch (kind) {
    case PreTokenizer::Gpt2: return kGpt2;
    case PreTokenizer::Llama3: return kLlama3;
    case PreTokenizer::Qwen2: return kQwen2;
    case PreTokenizer::Gpt4o: return kGpt4o;
    case PreTokenizer::DeepseekV3: return kDeepseekV3;
    case PreTokenizer::DeepseekLlm: return kDeepseekLlm;
    case PreTokenizer::DeepseekCoder: return kDeepseekCoder;
    case PreTokenizer::Falcon: return kFalcon;
    case PreTokenizer::Starcoder: return kStarcoder;
  }
  return kGpt2;
}

// Pieces as [begin, end) code point indices.
using Span = std::pair<size_t, size_t>;

// Like repeated regex searches over each piece: matches and the gaps between them all become
// pieces.
std::vector<Span> split(const std::u32string& codepoints, const std::vector<Span>& pieces,
                        Matcher match) {
  std::vector<Span> result;
  result.reserve(pieces.size() * 2);
  for (const auto& [begin, end] : pieces) {
    const Piece piece(codepoints.data() + begin, end - begin);
    size_t gap_start = 0;
    size_t pos = 0;
    while (pos < piece.size()) {
      const size_t length = match(piece, pos);
      if (length == 0) {
        ++pos;
        continue;
      }
      if (gap_start < pos) result.emplace_back(begin + gap_start, begin + pos);
      result.emplace_back(begin + pos, begin + pos + length);
      pos += length;
      gap_start = pos;
    }
    if (gap_start < piece.size()) result.emplace_back(begin + gap_start, end);
  }
  return result;
}

}  // namespace

std::vector<std::string_view> pre_tokenize(PreTokenizer kind, std::string_view text) {
  std::u32string codepoints;
  std::vector<size_t> byte_offsets;  // of each code point, then of the end
  for (size_t pos = 0; pos < text.size();) {
    const unicode::Utf8Decoded decoded = unicode::decode_utf8_at(text, pos);
    codepoints += decoded.codepoint;
    byte_offsets.push_back(pos);
    pos += decoded.length;
  }
  byte_offsets.push_back(text.size());

  std::vector<Span> pieces;
  if (!codepoints.empty()) pieces.emplace_back(0, codepoints.size());
  for (Matcher match : matchers_for(kind)) pieces = split(codepoints, pieces, match);

  std::vector<std::string_view> result;
  result.reserve(pieces.size());
  for (const auto& [begin, end] : pieces) {
    result.push_back(text.substr(byte_offsets[begin], byte_offsets[end] - byte_offsets[begin]));
  }
  return result;
}

}  // namespace strata::tokenizer
