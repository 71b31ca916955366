// Arbitrary bytes as a request body: parsing must either succeed or throw ApiError, never crash,
// hang or throw anything else.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "api/api_error.h"
#include "api/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto endpoint = data[0] % 2 ? strata::api::Endpoint::Completions
                                    : strata::api::Endpoint::ChatCompletions;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    strata::api::parse_completion_request(endpoint, body);
  } catch (const strata::api::ApiError&) {
  }
  return 0;
}
