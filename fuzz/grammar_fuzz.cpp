// Arbitrary bytes as GBNF text (first byte even) or as a JSON schema (odd): reading must either
// succeed or throw GrammarError / SchemaError, never crash, hang or throw anything else; what
// is read then matches the rest of the input's bytes the same way.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "constrain/grammar.h"
#include "constrain/json_schema.h"
#include "constrain/matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  // The grammar's text, then the bytes to match after a NUL.
  const size_t split = input.find('\0');
  const std::string_view text = input.substr(0, split);
  const std::string_view bytes = split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  using strata::constrain::Vocabulary;
  static const auto vocabulary = std::make_shared<const Vocabulary>(
      std::vector<std::string>{"{", "}", "\"", "a", "1", " ", "\xC3", "\xA9", "[", "]", ",", ":", "ab\"", ""},
      std::vector<strata::constrain::Token>{13});
  try {
    std::string gbnf;
    if (data[0] % 2 == 0) {
      gbnf = std::string(text);
    } else {
      const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return 0;
      gbnf = strata::constrain::json_schema_grammar(schema);
    }
    strata::constrain::Matcher matcher(strata::constrain::parse_gbnf(gbnf), vocabulary);
    for (char c : bytes) {
      matcher.allowed_tokens();
      matcher.accept_bytes(std::string_view(&c, 1));
    }
  } catch (const strata::constrain::GrammarError&) {
  } catch (const strata::constrain::SchemaError&) {
  }
  return 0;
}
