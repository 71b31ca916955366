// The mask a trie walk computes, cached by position, against a check of every token on its own.
#include <gtest/gtest.h>

#include "constrain/grammar.h"
#include "constrain/matcher.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::constrain {
namespace {

std::shared_ptr<const Vocabulary> vocabulary_of(const std::string& path) {
  const auto file = gguf::File::open(path);
  return Vocabulary::from_tokenizer(*tokenizer::Tokenizer::from_gguf(*file));
}

// A JSON-like grammar with strings (of any characters), numbers and nesting.
const char* kGrammar = R"(root ::= "{" ws pair ("," ws pair)* "}"
pair ::= str ws ":" ws val ws
val ::= str | num | "[" ws (val ws ("," ws val ws)*)? "]" | root
str ::= "\"" ([^"\\] | "\\" ["\\n])* "\""
num ::= "-"? [0-9]+ ("." [0-9]{1,3})?
ws ::= [ \n]{0,3}
)";

// At every point of `text` (fed in pieces of `step` bytes, so also inside characters), the
// cached trie mask equals checking each token's bytes on a matcher fed the same text.
void expect_masks_match(const std::shared_ptr<const Vocabulary>& vocab, const std::string& text, size_t step,
                        const char* gbnf = kGrammar) {
  const Grammar grammar = parse_gbnf(gbnf);
  Matcher walked(grammar, vocab);
  Matcher checked(grammar, vocab);
  size_t allowed_somewhere = 0;
  for (size_t at = 0; at <= text.size(); at += step) {
    const std::vector<uint8_t> mask = walked.allowed_tokens();
    EXPECT_EQ(walked.allowed_tokens(), mask) << "the cached mask differs at " << at;
    for (Token t = 0; t < vocab->size(); ++t) {
      const bool expected = vocab->is_end(t) ? checked.complete()
                                             : !vocab->piece(t).empty() && checked.accepts(vocab->piece(t));
      ASSERT_EQ(mask[static_cast<size_t>(t)] != 0, expected)
          << "token " << t << " '" << vocab->piece(t) << "' after '" << text.substr(0, at) << "'";
      allowed_somewhere += expected;
    }
    const std::string next = text.substr(at, step);
    ASSERT_TRUE(walked.accept_bytes(next));
    ASSERT_TRUE(checked.accept_bytes(next));
  }
  EXPECT_TRUE(walked.finished());
  EXPECT_GT(allowed_somewhere, text.size());  // the masks are not all empty
}

const std::string kText = "{\"name\": \"Zoë \\\"x\\\" 😀\",\n \"n\": [1, -2.5, {\"k\":[]}]}";

TEST(Mask, EqualsTheTokenByTokenCheckOnTheDreamsVocabulary) {
  expect_masks_match(vocabulary_of(STRATA_SHARED_DIR "/models/aidreams260K.gguf"), kText, 1);
}

TEST(Mask, EqualsTheTokenByTokenCheckOnGpt2sVocabulary) {
  expect_masks_match(vocabulary_of(STRATA_SHARED_DIR "/vocab/ggml-vocab-gpt-2.gguf"), kText, 3);
}

// Classes that take only part of what a character's first bytes may become, beside ones that
// take all of it, so that both ways of waiting for a character's last bytes are compared.
TEST(Mask, EqualsTheTokenByTokenCheckInsideCharactersOfPartialClasses) {
  const char* grammar = R"(root ::= ([α-ω] | [é] | "😀" | [一-龥] | [^a-zé.])+ "." )";
  expect_masks_match(vocabulary_of(STRATA_SHARED_DIR "/vocab/ggml-vocab-gpt-2.gguf"), "βé😀中Ü€.", 1, grammar);
}

TEST(Mask, EndTokensOnlyWhenComplete) {
  const auto vocab = std::make_shared<const Vocabulary>(std::vector<std::string>{"a", "b", "", "ab"}, std::vector<Token>{2});
  Matcher m(parse_gbnf("root ::= \"a\" \"b\"?"), vocab);
  EXPECT_EQ(m.allowed_tokens(), (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_FALSE(m.accept_token(2));
  EXPECT_TRUE(m.accept_token(0));
  EXPECT_EQ(m.allowed_tokens(), (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_TRUE(m.accept_token(2));
}

TEST(Mask, RepeatedPositionsInsideAStringAreTheSameState) {
  // The walk's cost is paid once: after the first character, the string's positions repeat.
  const auto vocab = std::make_shared<const Vocabulary>(std::vector<std::string>{"\"", "x", "xy", "\\"}, std::vector<Token>{});
  Matcher m(parse_gbnf("root ::= \"\\\"\" [a-z]* \"\\\"\""), vocab);
  ASSERT_TRUE(m.accept_token(0));
  const std::vector<uint8_t>* first = &m.allowed_tokens();
  ASSERT_TRUE(m.accept_token(2));
  EXPECT_EQ(&m.allowed_tokens(), first);
  EXPECT_EQ(*first, (std::vector<uint8_t>{1, 1, 1, 0}));
}

}  // namespace
}  // namespace strata::constrain
