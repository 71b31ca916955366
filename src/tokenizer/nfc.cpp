// NFC as Unicode Standard Annex #15 defines it, over the tables scripts/gen_unicode_tables.py
// writes, with Hangul syllables decomposed and composed by their formula.
#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tokenizer/unicode.h"

namespace strata::tokenizer::unicode {

namespace {

constexpr char32_t kHangulSyllableFirst = 0xAC00;
constexpr char32_t kLeadingJamoFirst = 0x1100;
constexpr char32_t kVowelJamoFirst = 0x1161;
constexpr char32_t kTrailingJamoBase = 0x11A7;  // one before the first trailing consonant
constexpr char32_t kLeadingJamoCount = 19;
constexpr char32_t kVowelJamoCount = 21;
constexpr char32_t kTrailingJamoCount = 28;  // with "none"
constexpr char32_t kSyllablesPerLeadingJamo = kVowelJamoCount * kTrailingJamoCount;
constexpr char32_t kHangulSyllableCount = kLeadingJamoCount * kSyllablesPerLeadingJamo;

// Below U+0300 every character is its own NFC and none composes with what precedes it.
constexpr char32_t kFirstCodepointNfcCanChange = 0x300;

bool is_hangul_syllable(char32_t cp) {
  return cp >= kHangulSyllableFirst && cp < kHangulSyllableFirst + kHangulSyllableCount;
}

void decompose(char32_t cp, std::u32string& out) {
  if (is_hangul_syllable(cp)) {
    const char32_t index = cp - kHangulSyllableFirst;
    out += kLeadingJamoFirst + index / kSyllablesPerLeadingJamo;
    out += kVowelJamoFirst + index % kSyllablesPerLeadingJamo / kTrailingJamoCount;
    if (index % kTrailingJamoCount != 0) out += kTrailingJamoBase + index % kTrailingJamoCount;
    return;
  }
  const Decomposition* end = kDecompositions + kDecompositionCount;
  const Decomposition* it =
      std::lower_bound(kDecompositions, end, cp,
                       [](const Decomposition& d, char32_t value) { return d.codepoint < value; });
  if (it == end || it->codepoint != cp) {
    out += cp;
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

std::optional<char32_t> compose(char32_t first, char32_t second) {
  if (first >= kLeadingJamoFirst && first < kLeadingJamoFirst + kLeadingJamoCount &&
      second >= kVowelJamoFirst && second < kVowelJamoFirst + kVowelJamoCount) {
    return kHangulSyllableFirst +
           ((first - kLeadingJamoFirst) * kVowelJamoCount + (second - kVowelJamoFirst)) *
               kTrailingJamoCount;
  }
  if (is_hangul_syllable(first) && (first - kHangulSyllableFirst) % kTrailingJamoCount == 0 &&
      second > kTrailingJamoBase && second < kTrailingJamoBase + kTrailingJamoCount) {
    return first + (second - kTrailingJamoBase);
  }
  const Composition* end = kCompositions + kCompositionCount;
  const Composition* it =
      std::lower_bound(kCompositions, end, std::pair{first, second},
                       [](const Composition& c, const std::pair<char32_t, char32_t>& value) {
                         return std::pair{c.first, c.second} < value;
                       });
  if (it == end || it->first != first || it->second != second) return std::nullopt;
  return it->composite;
}

// NFC of valid text, given as code points.
std::u32string normalize(std::u32string_view text) {
  std::u32string s;
  for (char32_t cp : text) decompose(cp, s);
  std::vector<uint8_t> classes(s.size());
  std::transform(s.begin(), s.end(), classes.begin(), combining_class);

  // Canonical order: each run of non-starters sorted by class, stably, in n log n: text from
  // outside may hold a run of any length.
  std::vector<std::pair<uint8_t, char32_t>> run;
  for (size_t begin = 0; begin < s.size();) {
    if (classes[begin] == 0) {
      ++begin;
      continue;
    }
    size_t end = begin;
    while (end < s.size() && classes[end] != 0) ++end;
    run.clear();
    for (size_t i = begin; i < end; ++i) run.emplace_back(classes[i], s[i]);
    std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = begin; i < end; ++i) std::tie(classes[i], s[i]) = run[i - begin];
    begin = end;
  }

  // Canonical composition: a character joins the last starter unless something between them
  // blocks it (a starter, or a mark of the same or a higher class).
  if (s.empty()) return s;
  size_t starter = 0;
  // Of the last character kept after the starter; 0 while nothing is, more than any class when
  // the text starts with a non-starter, which then has no starter to join.
  int last_class = classes[0] == 0 ? 0 : 256;
  size_t kept = 1;
  for (size_t i = 1; i < s.size(); ++i) {
    const int cls = classes[i];
    const std::optional<char32_t> composite = compose(s[starter], s[i]);
    if (composite && (last_class == 0 || last_class < cls)) {
      s[starter] = *composite;
      continue;
    }
    if (cls == 0) starter = kept;
    last_class = cls;
    s[kept++] = s[i];
  }
  s.resize(kept);
  return s;
}

}  // namespace

uint8_t combining_class(char32_t cp) {
  const CombiningClassRange* end = kCombiningClassRanges + kCombiningClassRangeCount;
  const CombiningClassRange* it = std::upper_bound(
      kCombiningClassRanges, end, cp,
      [](char32_t value, const CombiningClassRange& range) { return value < range.first; });
  if (it == kCombiningClassRanges) return 0;
  --it;
  return cp <= it->last ? it->combining_class : 0;
}

std::string to_nfc(std::string_view text) {
  std::string result;
  result.reserve(text.size());
  std::u32string valid_run;  // code points since the last invalid byte
  bool run_can_change = false;
  size_t run_start = 0;
  const auto flush = [&](size_t end) {
    if (run_can_change) {
      for (char32_t cp : normalize(valid_run)) append_utf8(result, cp);
    } else {
      result.append(text.substr(run_start, end - run_start));
    }
    valid_run.clear();
    run_can_change = false;
  };
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Decoded decoded = decode_utf8_at(text, pos);
    if (decoded.status == Utf8Status::Valid) {
      valid_run += decoded.codepoint;
      run_can_change |= decoded.codepoint >= kFirstCodepointNfcCanChange;
    } else {
      flush(pos);
      result.append(text.substr(pos, decoded.length));
      run_start = pos + decoded.length;
    }
    pos += decoded.length;
  }
  flush(text.size());
  return result;
}

}  // namespace strata::tokenizer::unicode
