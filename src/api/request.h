// Parsing and validation of request bodies, separate from the socket so it can be tested and
// fuzzed.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/output_format.h"
#include "sampling/params.h"

namespace strata::api {

enum class Endpoint { ChatCompletions, Completions };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool" ("developer" is read as "system")
  std::string content;            // null or absent: empty
  std::string reasoning_content;  // assistant: an earlier turn's reasoning
  // Assistant: the calls it made; `arguments` as the client sent it, normally JSON text.
  std::vector<chat::ToolCall> tool_calls;
  std::string tool_call_id;  // tool: the call it answers
  std::string name;          // the speaker's name; for a tool message, the function's
};

struct ToolChoice {
  enum class Mode { Auto, None, Required, Function } mode = Mode::Auto;
  std::string function;  // Function: the tool that must be called
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::optional<std::string> model;
  std::vector<ChatMessage> messages;  // chat only
  // Chat only: the tools offered, each {"type": "function", "function": {...}} as the client
  // wrote it (keys in its order), checked; and how the model may use them.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  // More variables for the chat template: enable_thinking, reasoning_effort and the
  // chat_template_kwargs object's.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  std::string prompt;                 // completions only
  std::optional<int> max_tokens;      // absent: until the context is full
  sampling::SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;
  // GBNF the output must follow (constrain/grammar.h), from response_format, a grammar, or
  // Ollama's format; empty: none.
  std::string grammar;
};

// Throws ApiError (status 400, naming the offending parameter) for anything not acceptable.
CompletionRequest parse_completion_request(Endpoint endpoint, std::string_view body);

// The top-level fields accepted and ignored because ignoring them cannot change the output.
const std::vector<std::string_view>& ignored_request_fields();

enum class OllamaEndpoint { Chat, Generate };

// Ollama's /api/chat and /api/generate bodies, read into the same request. /api/generate renders
// its prompt (and system text) with the chat template unless "raw" is set, as Ollama does.
CompletionRequest parse_ollama_request(OllamaEndpoint endpoint, std::string_view body);

// Ollama options accepted and ignored: resource and speed settings that cannot change the output.
const std::vector<std::string_view>& ignored_ollama_options();

// The model that Ollama's POST /api/show asks about ("model", or the older "name"); nullopt
// when neither is given. Throws ApiError (400) for a body that is not such an object.
std::optional<std::string> parse_ollama_show_model(std::string_view body);

// POST /cluster/drain's body, empty or {"force": bool}: whether the node leaves even when the
// others cannot do without it. Throws ApiError (400) for anything else.
bool parse_drain_force(std::string_view body);

}  // namespace strata::api
