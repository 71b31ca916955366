// OpenAI's Responses API (POST /v1/responses) on the chat completion path, stateless: a body is
// read into the Chat Completions request it means, which the chat parser then checks like any
// other, and the answer is written as a response object or its stream of typed events.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "api/responses.h"

namespace strata::api {

struct ResponsesRequest {
  std::string chat_body;  // the Chat Completions body (JSON text)
  // The request's settings that every response object repeats (instructions, tools,
  // tool_choice, temperature, text.format...), as the client gave them or their defaults.
  nlohmann::ordered_json settings;
};

// `instructions` become the system message; `input` a string (one user message) or items:
// messages (input_text / output_text parts), function_call items (the assistant's tool_calls),
// function_call_output items (tool messages), reasoning items (the next assistant turn's
// reasoning_content). `text.format` becomes response_format, `reasoning.effort` the template's
// reasoning_effort, `max_output_tokens` max_tokens. Nothing is stored: previous_response_id is
// a 400 that says to send the conversation as input. Throws ApiError (400, naming the field) for
// that, images and files (the model reads text only), built-in tools, and unknown fields.
ResponsesRequest read_responses_request(std::string_view body);

std::unique_ptr<ResponseWriter> responses_api_writer(std::string model, nlohmann::ordered_json settings);

}  // namespace strata::api
