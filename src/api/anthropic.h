// Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens) on the chat
// completion path: a body is read into the Chat Completions request it means, which the chat
// parser then checks like any other, and the answer is written in Anthropic's shapes and events.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "api/api_error.h"
#include "api/responses.h"

namespace strata::api {

enum class AnthropicEndpoint { Messages, CountTokens };

// The Chat Completions body (JSON text) of an Anthropic request: system text first, tool_use
// blocks as the assistant's tool_calls, tool_result blocks as tool messages, thinking blocks as
// reasoning_content, tools and tool_choice in OpenAI's shapes, `thinking` as the template's
// enable_thinking. Throws ApiError (400, naming the Anthropic field) for what it cannot mean:
// a missing max_tokens, images and documents (the model reads text only), server tools.
std::string chat_body_from_anthropic(AnthropicEndpoint endpoint, std::string_view body);

std::unique_ptr<ResponseWriter> anthropic_response_writer(std::string model);
std::string anthropic_error_body(const ApiError& error);
std::string anthropic_count_tokens_body(int input_tokens);

}  // namespace strata::api
