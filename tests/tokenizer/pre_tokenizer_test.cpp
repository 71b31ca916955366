// Pre-tokenizer splits derived by hand from the regexes they implement (and, for o200k and
// DeepSeek V3, the same as tokenizers.js splits them with the regexes of tokenizer.json). The
// vocabularies seldom have merges across the edges of pieces, so encoding alone does not show
// every rule; here each is checked directly.
#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "test_support.h"

namespace strata::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

Pieces split(PreTokenizer kind, std::string_view text) {
  Pieces pieces;
  for (std::string_view piece : pre_tokenize(kind, text)) pieces.emplace_back(piece);
  return pieces;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
TEST(Llama3PreTokenizer, WordsTakeTheirLeadingSpace) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "Hello world"), (Pieces{"Hello", " world"}));
}

TEST(Llama3PreTokenizer, ContractionsAreCaseInsensitive) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "I'm sure they'LL go, JOHN'S don't"),
            (Pieces{"I", "'m", " sure", " they", "'LL", " go", ",", " JOHN", "'S", " don", "'t"}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "WE'RE WE'VE I'D"),
            (Pieces{"WE", "'RE", " WE", "'VE", " I", "'D"}));
}

TEST(Llama3PreTokenizer, ApostropheBeforeOtherLettersPrefixesTheWord) {
  // After a space the apostrophe is taken by " ?[^\s\p{L}\p{N}]+" before the word can have it.
  EXPECT_EQ(split(PreTokenizer::Llama3, "'hello 'x"), (Pieces{"'hello", " '", "x"}));
}

TEST(Llama3PreTokenizer, DigitsGoInGroupsOfUpToThree) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "12345678"), (Pieces{"123", "456", "78"}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "abc1234def"), (Pieces{"abc", "123", "4", "def"}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "$100 7"), (Pieces{"$", "100", " ", "7"}));
  // Arabic-Indic digits are \p{N} too.
  EXPECT_EQ(split(PreTokenizer::Llama3, "\u0663\u0664\u0665\u0666"),
            (Pieces{"\u0663\u0664\u0665", "\u0666"}));
}

TEST(Llama3PreTokenizer, PunctuationRunsTakeOneSpaceAndFollowingNewlines) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "Hello!!! ...world"),
            (Pieces{"Hello", "!!!", " ...", "world"}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "x.\n\ny"), (Pieces{"x", ".\n\n", "y"}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "ok \xF0\x9F\x91\x8D\xF0\x9F\x91\x8D!"),
            (Pieces{"ok", " \xF0\x9F\x91\x8D\xF0\x9F\x91\x8D!"}));
}

TEST(Llama3PreTokenizer, NewlinesCollectPrecedingWhitespace) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "hello\r\nworld"), (Pieces{"hello", "\r\n", "world"}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "a\n\n  b"), (Pieces{"a", "\n\n", " ", " b"}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "a  \n b"), (Pieces{"a", "  \n", " b"}));
}

TEST(Llama3PreTokenizer, SpacesBeforeAWordLeaveItTheLastOne) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "hi   there"), (Pieces{"hi", "  ", " there"}));
  // A tab is [^\r\n\p{L}\p{N}], so it prefixes the word like a space.
  EXPECT_EQ(split(PreTokenizer::Llama3, "\tword"), (Pieces{"\tword"}));
}

TEST(Llama3PreTokenizer, TrailingSpacesStayTogether) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "hi   "), (Pieces{"hi", "   "}));
  EXPECT_EQ(split(PreTokenizer::Llama3, "   "), (Pieces{"   "}));
}

TEST(Llama3PreTokenizer, NonLatinLetters) {
  EXPECT_EQ(split(PreTokenizer::Llama3, "Привет мир"), (Pieces{"Привет", " мир"}));
}

TEST(Llama3PreTokenizer, PiecesConcatenateToTheInputEvenForInvalidUtf8) {
  const std::string text = "ab\xFF\xC3 12\xE2\x82";
  std::string joined;
  for (std::string_view piece : pre_tokenize(PreTokenizer::Llama3, text)) joined += piece;
  EXPECT_EQ(joined, text);
}

TEST(Qwen2PreTokenizer, SplitsEveryDigit) {
  EXPECT_EQ(split(PreTokenizer::Qwen2, "x12345"), (Pieces{"x", "1", "2", "3", "4", "5"}));
}

// Llama 3 and Qwen take digits in groups of at most three (Qwen: one): a long number must not be
// scanned again for every group.
TEST(Llama3PreTokenizer, LongNumbersSplitInLinearTime) {
  const std::string digits(64 * 1024, '7');
  for (PreTokenizer kind : {PreTokenizer::Llama3, PreTokenizer::Qwen2}) {
    const auto start = test::thread_cpu_time();
    const std::vector<std::string_view> pieces = pre_tokenize(kind, digits);
    const auto elapsed = test::thread_cpu_time() - start;
    EXPECT_GE(pieces.size(), digits.size() / 3);
    EXPECT_LT(elapsed, std::chrono::milliseconds(100));
  }
}

// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)?|
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)?|
// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
TEST(O200kPreTokenizer, WordsEndWhereCapitalsFollowLowerCase) {
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "HelloWorld"), (Pieces{"Hello", "World"}));
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "ʰello WORLDs"), (Pieces{"ʰello", " WORLDs"}));
  // Not only for ASCII: the classes are the letters' general categories.
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "приветМИР ПРИВЕТмир"),
            (Pieces{"привет", "МИР", " ПРИВЕТмир"}));
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "\u01C5emal"), (Pieces{"\u01C5emal"}));  // title case
}

TEST(O200kPreTokenizer, MarksBelongToTheirWord) {
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "हिन्दी e\u0301"), (Pieces{"हिन्दी", " e\u0301"}));
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "a\u0301\u0301B"), (Pieces{"a\u0301\u0301", "B"}));
}

TEST(O200kPreTokenizer, ContractionsStayWithTheirWord) {
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "they're HERE'S it's"),
            (Pieces{"they're", " HERE'S", " it's"}));
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "'s x"), (Pieces{"'s", " x"}));
}

TEST(O200kPreTokenizer, DigitsPunctuationAndWhitespace) {
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "12345 x.\n\ny"), (Pieces{"123", "45", " x", ".\n\n", "y"}));
  EXPECT_EQ(split(PreTokenizer::Gpt4o, "hi   there\n\n  x  "),
            (Pieces{"hi", "  ", " there", "\n\n", " ", " x", "  "}));
}

// \p{N}{1,3}, then [一-龥぀-ゟ゠-ヿ]+, then
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
TEST(DeepseekV3PreTokenizer, DigitsGoInThreesFirst) {
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "12345abc"), (Pieces{"123", "45", "abc"}));
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "\u0661\u0662\u0663\u0664"),
            (Pieces{"\u0661\u0662\u0663", "\u0664"}));
}

TEST(DeepseekV3PreTokenizer, IdeographsAndKanaStandAlone) {
  // Without its space: the ideographs are cut out before the space could prefix them.
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "Hi 你好世界"), (Pieces{"Hi", " ", "你好世界"}));
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "カタカナとひらがな 東京タワー"),
            (Pieces{"カタカナとひらがな", " ", "東京タワー"}));
}

TEST(DeepseekV3PreTokenizer, AsciiPunctuationPrefixesAsciiLetters) {
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "It's a.com x_y"),
            (Pieces{"It", "'s", " a", ".com", " x", "_y"}));
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "don't 'em"), (Pieces{"don", "'t", " '", "em"}));
}

TEST(DeepseekV3PreTokenizer, MarksPunctuationAndWhitespace) {
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "नमस्ते x\u0301y \u0301z"),
            (Pieces{"नमस्ते", " x\u0301y", " \u0301z"}));
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "a!!\n\nb"), (Pieces{"a", "!!\n\n", "b"}));
  EXPECT_EQ(split(PreTokenizer::DeepseekV3, "hi   there\n\n  x  "),
            (Pieces{"hi", "  ", " there", "\n\n", " ", " x", "  "}));
}

TEST(Gpt2PreTokenizer, SplitsLikeTheGpt2Regex) {
  EXPECT_EQ(split(PreTokenizer::Gpt2, "Hello  world's 123!?\n"),
            (Pieces{"Hello", " ", " world", "'s", " 123", "!?", "\n"}));
  // Contractions are case-sensitive here.
  EXPECT_EQ(split(PreTokenizer::Gpt2, "IT'S"), (Pieces{"IT", "'", "S"}));
}

TEST(PreTokenizerNames, KnownAndUnknownNames) {
  EXPECT_EQ(pre_tokenizer_from_name("llama-bpe"), PreTokenizer::Llama3);
  EXPECT_EQ(pre_tokenizer_from_name("smaug-bpe"), PreTokenizer::Llama3);
  EXPECT_EQ(pre_tokenizer_from_name("glm4"), PreTokenizer::Llama3);
  EXPECT_EQ(pre_tokenizer_from_name("qwen2"), PreTokenizer::Qwen2);
  EXPECT_EQ(pre_tokenizer_from_name("gpt-4o"), PreTokenizer::Gpt4o);
  EXPECT_EQ(pre_tokenizer_from_name("deepseek-v3"), PreTokenizer::DeepseekV3);
  EXPECT_EQ(pre_tokenizer_from_name("refact"), PreTokenizer::Starcoder);
  EXPECT_EQ(pre_tokenizer_from_name("no-such-pre"), std::nullopt);
}

}  // namespace
}  // namespace strata::tokenizer
