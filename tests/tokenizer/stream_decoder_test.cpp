// StreamDecoder must never hand out broken UTF-8, however the bytes are split across tokens.
#include <gtest/gtest.h>

#include "test_support.h"

namespace strata::tokenizer {
namespace {

using test::is_valid_utf8;

// Streams `tokens`, checking every chunk, and returns the concatenated output.
std::string stream(const Tokenizer& tok, const std::vector<Token>& tokens) {
  StreamDecoder decoder(tok);
  std::string out;
  for (Token token : tokens) {
    const std::string chunk = decoder.push(token);
    EXPECT_TRUE(is_valid_utf8(chunk))
        << "after token " << token << ": " << testing::PrintToString(chunk);
    out += chunk;
  }
  const std::string rest = decoder.finish();
  EXPECT_TRUE(is_valid_utf8(rest));
  return out + rest;
}

TEST(ValidUtf8Helper, CatchesBrokenSequences) {
  EXPECT_TRUE(is_valid_utf8("a\xC3\xA4\xF0\x9F\xA6\x99"));
  EXPECT_FALSE(is_valid_utf8("\xF0\x9F\xA6"));
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));
}

TEST(StreamDecoder, EmojiSplitAcrossByteTokens) {
  const test::LoadedTokenizer loaded = test::load_vocab("llama-spm");
  const Tokenizer& tok = *loaded.tokenizer;
  // The family emoji is several code points joined by U+200D; none has a token of its own.
  const std::string text =
      "Hi \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 "
      "\xF0\x9F\xA6\x99!";
  const std::vector<Token> tokens = tok.encode(text, true, false);

  StreamDecoder decoder(tok);
  size_t held_back = 0;
  std::string out;
  for (Token token : tokens) {
    const std::string chunk = decoder.push(token);
    ASSERT_TRUE(is_valid_utf8(chunk)) << testing::PrintToString(chunk);
    if (chunk.empty() && !tok.token_piece(token).empty()) ++held_back;
    out += chunk;
  }
  EXPECT_EQ(decoder.finish(), "");
  EXPECT_GT(held_back, 0u) << "the emoji bytes should have been buffered";
  EXPECT_EQ(out, " " + text);  // streaming keeps SentencePiece's leading space
}

TEST(StreamDecoder, ByteLevelTokensSplittingCharacters) {
  const test::LoadedTokenizer loaded = test::load_vocab("gpt-2");
  const std::string text =
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 \xE1\x9E\x80\xE1\x9E\xB6 caf\xC3\xA9";
  EXPECT_EQ(stream(*loaded.tokenizer, loaded.tokenizer->encode(text, false, false)), text);
}

TEST(StreamDecoder, InvalidAndUnfinishedBytesBecomeReplacementCharacters) {
  const test::LoadedTokenizer loaded = test::load_vocab("llama-spm");
  const Tokenizer& tok = *loaded.tokenizer;
  const auto byte = [&](const char* name) { return *tok.find_token(name); };
  const std::string replacement = "\xEF\xBF\xBD";

  StreamDecoder decoder(tok);
  EXPECT_EQ(decoder.push(byte("<0xFF>")), replacement);
  EXPECT_EQ(decoder.push(byte("<0x41>")), "A");
  EXPECT_EQ(decoder.push(byte("<0xF0>")), "");
  EXPECT_EQ(decoder.push(byte("<0x9F>")), "");
  // A lead byte where a continuation byte should be: the partial sequence is invalid.
  const std::string chunk = decoder.push(byte("<0x41>"));
  EXPECT_TRUE(is_valid_utf8(chunk));
  EXPECT_EQ(chunk, replacement + replacement + "A");
  EXPECT_EQ(decoder.push(byte("<0xE2>")), "");
  EXPECT_EQ(decoder.finish(), replacement);
  EXPECT_EQ(decoder.finish(), "");
}

}  // namespace
}  // namespace strata::tokenizer
