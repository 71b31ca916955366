// Model output through every family's tool-call and reasoning parser, whole and in pieces: no
// input may crash it, every call it returns has JSON-object arguments, and the pieces give what
// the whole gives.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "chat/output_format.h"

namespace {

using strata::chat::Family;

constexpr Family kFamilies[] = {Family::None,    Family::Hermes,   Family::QwenXml, Family::Llama3,
                                Family::Mistral, Family::Harmony,  Family::DeepSeek, Family::Glm,
                                Family::Kimi};

void check(const strata::chat::OutputDelta& out) {
  for (const auto& call : out.tool_calls) {
    if (!nlohmann::json::parse(call.arguments, nullptr, false).is_object()) std::abort();
  }
}

bool same(const strata::chat::OutputDelta& a, const strata::chat::OutputDelta& b) {
  if (a.content != b.content || a.reasoning != b.reasoning || a.tool_calls.size() != b.tool_calls.size())
    return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    const auto &x = a.tool_calls[i], &y = b.tool_calls[i];
    if (x.id != y.id || x.name != y.name || x.arguments != y.arguments) return false;
  }
  return true;
}

}  // namespace

// The first byte picks the family and the flags, the second the piece size.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const strata::chat::OutputFormat format{kFamilies[data[0] % 9], (data[0] & 16) != 0, (data[0] & 32) != 0,
                                          (data[0] & 64) == 0};
  const size_t piece = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const strata::chat::OutputDelta whole = strata::chat::parse_output(format, text);
  check(whole);
  strata::chat::OutputParser parser(format);
  strata::chat::OutputDelta streamed;
  for (size_t at = 0; at < text.size(); at += piece) streamed.append(parser.push(text.substr(at, piece)));
  streamed.append(parser.finish());
  if (!same(whole, streamed)) std::abort();
  return 0;
}
