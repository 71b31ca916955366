// Arbitrary bytes as a chat template: parsing must either succeed or throw TemplateError, never
// crash, hang or throw anything else.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "template/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    strata::jinja::Template(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const strata::jinja::TemplateError&) {
  }
  return 0;
}
