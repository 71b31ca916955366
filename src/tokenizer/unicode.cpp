#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace strata::tokenizer::unicode {

CodepointClass classify(char32_t cp) {
  const CodepointRange* end = kCodepointClassRanges + kCodepointClassRangeCount;
  const CodepointRange* it = std::upper_bound(
      kCodepointClassRanges, end, cp,
      [](char32_t value, const CodepointRange& range) { return value < range.first; });
  if (it == kCodepointClassRanges) return CodepointClass::Other;
  --it;
  return cp <= it->last ? it->cls : CodepointClass::Other;
}

bool is_whitespace(char32_t cp) {
  // Python's unicodedata does not expose White_Space, and the list is short and stable.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

Utf8Decoded decode_utf8_at(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[pos + i]); };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return {lead, 1, Utf8Status::Valid};

  size_t length = 0;
  char32_t cp = 0;
  // The second byte's range is narrower than 80..BF for some leads: that is how overlong forms,
  // surrogates and values past U+10FFFF are excluded.
  uint8_t second_min = 0x80, second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    cp = lead & 0x0F;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    cp = lead & 0x07;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return {kReplacementCharacter, 1, Utf8Status::Invalid};
  }

  for (size_t i = 1; i < length; ++i) {
    if (pos + i >= text.size()) {
      return {kReplacementCharacter, text.size() - pos, Utf8Status::Incomplete};
    }
    const uint8_t next = byte(i);
    const uint8_t min = i == 1 ? second_min : 0x80;
    const uint8_t max = i == 1 ? second_max : 0xBF;
    if (next < min || next > max) return {kReplacementCharacter, 1, Utf8Status::Invalid};
    cp = (cp << 6) | (next & 0x3F);
  }
  return {cp, length, Utf8Status::Valid};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Printable Latin-1 bytes map to themselves; the remaining 68 bytes take the code points from
// U+0100 upwards, in byte order.
constexpr std::array<char32_t, 256> make_byte_to_codepoint() {
  std::array<char32_t, 256> table{};
  char32_t next_unprintable = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next_unprintable++;
  }
  return table;
}

constexpr std::array<char32_t, 256> kByteToCodepoint = make_byte_to_codepoint();

// Every mapped code point is below U+0144 (256 bytes, 68 of them moved up from U+0100).
constexpr size_t kMappedCodepointLimit = 0x100 + 68;

constexpr std::array<int16_t, kMappedCodepointLimit> make_codepoint_to_byte() {
  std::array<int16_t, kMappedCodepointLimit> table{};
  table.fill(-1);
  for (size_t b = 0; b < 256; ++b) table[kByteToCodepoint[b]] = static_cast<int16_t>(b);
  return table;
}

constexpr std::array<int16_t, kMappedCodepointLimit> kCodepointToByte = make_codepoint_to_byte();

}  // namespace

char32_t byte_to_codepoint(uint8_t byte) { return kByteToCodepoint[byte]; }

std::optional<uint8_t> codepoint_to_byte(char32_t cp) {
  if (cp >= kMappedCodepointLimit || kCodepointToByte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(kCodepointToByte[cp]);
}

}  // namespace strata::tokenizer::unicode
