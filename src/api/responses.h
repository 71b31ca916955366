// Response bodies in OpenAI's exact shapes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/api_error.h"
#include "api/completion_text.h"
#include "api/request.h"

namespace strata::api {

struct ResponseHeader {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::string id;  // chatcmpl-... or cmpl-...
  int64_t created = 0;
  std::string model;
  bool with_logprobs = false;
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

std::string error_body(const ApiError& error);
std::string models_body(const std::string& model, int64_t created);
std::string model_body(const std::string& model, int64_t created);

std::string completion_body(const ResponseHeader& header, const TextDelta& output,
                            std::string_view finish_reason, const Usage& usage);

// One SSE event, "data: ...\n\n". The first chat chunk carries the role.
std::string chunk_event(const ResponseHeader& header, const TextDelta& delta, bool first,
                        bool with_usage_field);
std::string final_chunk_event(const ResponseHeader& header, std::string_view finish_reason,
                              bool with_usage_field);
std::string usage_chunk_event(const ResponseHeader& header, const Usage& usage);
std::string error_event(const ApiError& error);
inline constexpr std::string_view kDoneEvent = "data: [DONE]\n\n";

}  // namespace strata::api
