#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

namespace strata::tokenizer::unicode {
namespace {

TEST(Unicode, ClassifiesGeneralCategories) {
  EXPECT_EQ(classify('A'), CodepointClass::UppercaseLetter);
  EXPECT_EQ(classify('a'), CodepointClass::LowercaseLetter);
  EXPECT_EQ(classify(0x01C5), CodepointClass::TitlecaseLetter);  // ǅ
  EXPECT_EQ(classify(0x02B0), CodepointClass::ModifierLetter);   // ʰ
  EXPECT_EQ(classify(0x4E2D), CodepointClass::OtherLetter);      // 中
  EXPECT_EQ(classify(0x0663), CodepointClass::Number);  // Arabic-Indic three
  EXPECT_EQ(classify(0x00BD), CodepointClass::Number);  // ½
  EXPECT_EQ(classify('!'), CodepointClass::Punctuation);
  EXPECT_EQ(classify('$'), CodepointClass::Symbol);
  EXPECT_EQ(classify(0x1F999), CodepointClass::Symbol);  // 🦙
  EXPECT_EQ(classify(0x0301), CodepointClass::Mark);     // combining acute
  EXPECT_EQ(classify(' '), CodepointClass::Other);
  EXPECT_EQ(classify(0x200D), CodepointClass::Other);  // zero-width joiner
  EXPECT_EQ(classify(0x10FFFF), CodepointClass::Other);
}

TEST(Unicode, EveryKindOfLetterIsALetter) {
  for (char32_t cp : {U'A', U'a', U'\u01C5', U'\u02B0', U'\u4E2D'}) {
    EXPECT_TRUE(is_letter(cp)) << static_cast<uint32_t>(cp);
  }
  for (char32_t cp : {U'1', U'\u0301', U'$', U' '}) {
    EXPECT_FALSE(is_letter(cp)) << static_cast<uint32_t>(cp);
  }
}

TEST(Unicode, WhiteSpaceProperty) {
  for (char32_t cp : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u0085', U'\u00A0', U'\u3000'}) {
    EXPECT_TRUE(is_whitespace(cp)) << static_cast<uint32_t>(cp);
  }
  for (char32_t cp : {U'a', U'\u001C', U'\u200B', U'\u200D'}) {
    EXPECT_FALSE(is_whitespace(cp)) << static_cast<uint32_t>(cp);
  }
}

TEST(Unicode, DecodesValidSequences) {
  const Utf8Decoded llama = decode_utf8_at("\xF0\x9F\xA6\x99", 0);
  EXPECT_EQ(llama.codepoint, 0x1F999u);
  EXPECT_EQ(llama.length, 4u);
  EXPECT_EQ(llama.status, Utf8Status::Valid);
}

TEST(Unicode, RejectsMalformedSequences) {
  for (std::string_view bad : {"\x80", "\xC0\x80", "\xE0\x80\x80", "\xED\xA0\x80",
                               "\xF4\x90\x80\x80", "\xF8\x88\x80\x80\x80", "\xC3\x41"}) {
    const Utf8Decoded decoded = decode_utf8_at(bad, 0);
    EXPECT_EQ(decoded.status, Utf8Status::Invalid) << testing::PrintToString(bad);
    EXPECT_EQ(decoded.length, 1u);
    EXPECT_EQ(decoded.codepoint, kReplacementCharacter);
  }
}

TEST(Unicode, ReportsTruncatedSequencesAsIncomplete) {
  const Utf8Decoded decoded = decode_utf8_at("a\xF0\x9F\xA6", 1);
  EXPECT_EQ(decoded.status, Utf8Status::Incomplete);
  EXPECT_EQ(decoded.length, 3u);
}

TEST(Nfc, ComposesBaseAndMarks) {
  EXPECT_EQ(to_nfc("Cafe\u0301"), "Caf\u00E9");
  // ư + hook above: two marks on one base, composed one after the other.
  EXPECT_EQ(to_nfc("Cu\u031B\u0309a"), "C\u1EEDa");
  EXPECT_EQ(to_nfc("Vie\u0323\u0302t"), "Vi\u1EC7t");
}

TEST(Nfc, OrdersMarksByCombiningClassFirst) {
  // Dot below (class 220) goes before acute (230) whichever was typed first; ạ then composes and
  // the acute, which no precomposed letter has with it, stays.
  EXPECT_EQ(to_nfc("a\u0301\u0323"), "\u1EA1\u0301");
  EXPECT_EQ(to_nfc("a\u0323\u0301"), "\u1EA1\u0301");
}

TEST(Nfc, SingletonsAndExclusionsStayDecomposed) {
  EXPECT_EQ(to_nfc("\u212B"), "\u00C5");  // ANGSTROM SIGN -> Å
  EXPECT_EQ(to_nfc("\u2126"), "\u03A9");  // OHM SIGN -> Ω
  EXPECT_EQ(to_nfc("\u0958"), "\u0915\u093C");  // क़ is excluded from composition
}

TEST(Nfc, HangulJamoComposeIntoSyllables) {
  EXPECT_EQ(to_nfc("\u1100\u1161\u11A8"), "\uAC01");  // 각
  EXPECT_EQ(to_nfc("\u1100\u1161"), "\uAC00");         // 가
  EXPECT_EQ(to_nfc("\uAC00\u11A8"), "\uAC01");
}

TEST(Nfc, LeavesNormalizedAndInvalidTextAlone) {
  for (std::string_view text : {"", "plain ASCII", "Caf\u00E9 \u4E2D\u6587 \xF0\x9F\xA6\x99",
                                "\u0301 leading mark", "a\xFF\u0301", "e\xC3"}) {
    EXPECT_EQ(to_nfc(text), text) << testing::PrintToString(text);
  }
}

TEST(Unicode, ByteLevelAlphabetIsABijection) {
  EXPECT_EQ(byte_to_codepoint(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_to_codepoint('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_to_codepoint('A'), U'A');
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(codepoint_to_byte(byte_to_codepoint(static_cast<uint8_t>(b))), b);
  }
  EXPECT_EQ(codepoint_to_byte(0x20), std::nullopt);
  EXPECT_EQ(codepoint_to_byte(0x4E2D), std::nullopt);
}

}  // namespace
}  // namespace strata::tokenizer::unicode
