#include "api/anthropic.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "api/json_body.h"

namespace strata::api {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

void append_user(const ojson& content, const std::string& field, ojson& messages) {
  if (content.is_string()) {
    messages.push_back({{"role", "user"}, {"content", content}});
    return;
  }
  // Tool results answer the assistant's calls, so they come before the user's own words.
  ojson parts = ojson::array();
  for (size_t i = 0; i < expect_array(content, field).size(); ++i) {
    const std::string at = field + "." + std::to_string(i);
    const ojson& block = content[i];
    const std::string& type = type_of(block, at);
    if (type == "text") {
      parts.push_back({{"type", "text"}, {"text", expect_string(member(block, "text"), at + ".text")}});
    } else if (type == "tool_result") {
      ojson result = {{"role", "tool"},
                      {"tool_call_id", expect_string(member(block, "tool_use_id"), at + ".tool_use_id")},
                      {"content", block.contains("content") ? text_content(block["content"], at + ".content", {"text"}) : ojson("")}};
      messages.push_back(std::move(result));
    } else {
      not_text(at, type);
    }
  }
  if (!parts.empty()) messages.push_back({{"role", "user"}, {"content", std::move(parts)}});
}

void append_assistant(const ojson& content, const std::string& field, ojson& messages) {
  if (content.is_string()) {
    messages.push_back({{"role", "assistant"}, {"content", content}});
    return;
  }
  std::string text, reasoning;
  ojson calls = ojson::array();
  for (size_t i = 0; i < expect_array(content, field).size(); ++i) {
    const std::string at = field + "." + std::to_string(i);
    const ojson& block = content[i];
    const std::string& type = type_of(block, at);
    if (type == "text") {
      text += expect_string(member(block, "text"), at + ".text");
    } else if (type == "thinking") {
      reasoning += expect_string(member(block, "thinking"), at + ".thinking");
    } else if (type == "redacted_thinking") {
      // Encrypted reasoning of another provider's model: nothing this model can read.
    } else if (type == "tool_use") {
      const ojson input = block.value("input", ojson::object());
      calls.push_back({{"id", expect_string(member(block, "id"), at + ".id")},
                       {"type", "function"},
                       {"function",
                        {{"name", expect_string(member(block, "name"), at + ".name")},
                         {"arguments", expect_object(input, at + ".input").dump()}}}});
    } else {
      not_text(at, type);
    }
  }
  ojson message = {{"role", "assistant"}, {"content", text}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  messages.push_back(std::move(message));
}

ojson chat_tools(const ojson& tools) {
  ojson converted = ojson::array();
  for (size_t i = 0; i < expect_array(tools, "tools").size(); ++i) {
    const std::string at = "tools." + std::to_string(i);
    const ojson& tool = expect_object(tools[i], at);
    if (tool.contains("type") && expect_string(tool["type"], at + ".type") != "custom") {
      invalid_field(at + ".type", "'" + tool["type"].get<std::string>() +
                                "' is one of Anthropic's server tools, which this server does not run");
    }
    ojson function = {{"name", expect_string(member(tool, "name"), at + ".name")}};
    if (tool.contains("description")) function["description"] = tool["description"];
    if (!tool.contains("input_schema")) invalid_field(at + ".input_schema", "missing");
    function["parameters"] = tool["input_schema"];
    converted.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return converted;
}

void add_tool_choice(const ojson& choice, ojson& chat) {
  const std::string& type = type_of(choice, "tool_choice");
  if (type == "auto" || type == "none") {
    chat["tool_choice"] = type;
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "tool") {
    chat["tool_choice"] = {{"type", "function"},
                           {"function", {{"name", expect_string(member(choice, "name"), "tool_choice.name")}}}};
  } else {
    invalid_field("tool_choice.type", "expected 'auto', 'any', 'tool' or 'none'");
  }
  if (choice.contains("disable_parallel_tool_use")) {
    chat["parallel_tool_calls"] = !expect_bool(choice["disable_parallel_tool_use"], "tool_choice.disable_parallel_tool_use");
  }
}

bool thinking_enabled(const ojson& thinking) {
  const std::string& type = type_of(thinking, "thinking");
  if (type != "enabled" && type != "disabled") invalid_field("thinking.type", "expected 'enabled' or 'disabled'");
  return type == "enabled";
}

std::string sse(const char* name, const json& data) {
  return std::string("event: ") + name + "\ndata: " +
         data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string stop_reason(const Finish& finish) {
  if (finish.reason == "length") return "max_tokens";
  if (finish.reason == "tool_calls") return "tool_use";
  return finish.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

json stop_sequence(const Finish& finish) {
  return finish.stop_sequence.empty() ? json(nullptr) : json(finish.stop_sequence);
}

// Anthropic counts the prompt tokens that came from a cache apart from the others.
json usage_json(const Usage& usage) {
  return {{"input_tokens", usage.prompt_tokens - usage.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", usage.cached_tokens},
          {"output_tokens", usage.completion_tokens}};
}

// A call's arguments as the object Anthropic's tool_use input is; the output parser gives calls
// only with JSON arguments, and anything else would be an empty input.
json tool_input(const chat::ToolCall& call) {
  json input = json::parse(call.arguments, nullptr, false);
  return input.is_object() ? input : json::object();
}

json tool_use_block(const chat::ToolCall& call, json input) {
  return {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", std::move(input)}};
}

// The answer as content blocks: its reasoning (a thinking block), its text, its tool calls
// (tool_use blocks); with nothing else to say, one empty text block.
class AnthropicWriter final : public ResponseWriter {
 public:
  explicit AnthropicWriter(std::string model) : model_(std::move(model)), id_(random_id("msg_")) {}

  std::string_view content_type(bool stream) const override {
    return stream ? "text/event-stream" : "application/json";
  }

  std::string stream_start(const Usage& prompt) override {
    json message = envelope();
    message["content"] = json::array();
    message["stop_reason"] = nullptr;
    message["usage"] = usage_json(prompt);
    return sse("message_start", {{"type", "message_start"}, {"message", std::move(message)}}) +
           sse("ping", {{"type", "ping"}});
  }

  // An SSE comment line, which Anthropic's clients skip like any other.
  std::string stream_waiting(const std::string& why) override { return ": waiting for " + why + "\n\n"; }

  std::string stream_delta(const TextDelta& delta) override {
    std::string events;
    if (!delta.reasoning.empty()) {
      events += open_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      events += block_delta({{"type", "thinking_delta"}, {"thinking", delta.reasoning}});
    }
    if (!delta.text.empty()) {
      events += open_block("text", {{"type", "text"}, {"text", ""}});
      events += block_delta({{"type", "text_delta"}, {"text", delta.text}});
    }
    for (const auto& call : delta.tool_calls) {
      // Each call is a block of its own, even beside another call.
      events += close_block();
      events += open_block("tool_use", tool_use_block(call, json::object()));
      events += block_delta({{"type", "input_json_delta"}, {"partial_json", tool_input(call).dump()}});
      events += close_block();
    }
    return events;
  }

  std::string stream_end(const Finish& finish, const Usage& usage) override {
    std::string events = open_block_if_none();
    events += close_block();
    events += sse("message_delta", {{"type", "message_delta"},
                                    {"delta", {{"stop_reason", stop_reason(finish)}, {"stop_sequence", stop_sequence(finish)}}},
                                    {"usage", {{"output_tokens", usage.completion_tokens}}}});
    return events + sse("message_stop", {{"type", "message_stop"}});
  }

  std::string stream_error(const ApiError& error) override {
    return sse("error", json::parse(anthropic_error_body(error)));
  }

  std::string whole(const TextDelta& output, const Finish& finish, const Usage& usage) override {
    json body = envelope();
    json content = json::array();
    if (!output.reasoning.empty()) {
      content.push_back({{"type", "thinking"}, {"thinking", output.reasoning}, {"signature", ""}});
    }
    if (!output.text.empty() || output.tool_calls.empty()) content.push_back({{"type", "text"}, {"text", output.text}});
    for (const auto& call : output.tool_calls) content.push_back(tool_use_block(call, tool_input(call)));
    body["content"] = std::move(content);
    body["stop_reason"] = stop_reason(finish);
    body["stop_sequence"] = stop_sequence(finish);
    body["usage"] = usage_json(usage);
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
  }

 private:
  json envelope() const {
    return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"stop_sequence", nullptr}};
  }

  // Closes the open block unless it is of `kind`, then opens one of it.
  std::string open_block(const std::string& kind, json start) {
    if (open_kind_ == kind) return {};
    std::string events = close_block();
    ++block_index_;
    open_kind_ = kind;
    return events + sse("content_block_start",
                        {{"type", "content_block_start"}, {"index", block_index_}, {"content_block", std::move(start)}});
  }

  std::string block_delta(json delta) {
    return sse("content_block_delta",
               {{"type", "content_block_delta"}, {"index", block_index_}, {"delta", std::move(delta)}});
  }

  std::string open_block_if_none() {
    return block_index_ < 0 ? open_block("text", {{"type", "text"}, {"text", ""}}) : std::string();
  }

  std::string close_block() {
    if (open_kind_.empty()) return {};
    open_kind_.clear();
    return sse("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
  }

  const std::string model_;
  const std::string id_;
  int block_index_ = -1;
  std::string open_kind_;  // empty: none open
};

}  // namespace

std::unique_ptr<ResponseWriter> anthropic_response_writer(std::string model) {
  return std::make_unique<AnthropicWriter>(std::move(model));
}

std::string anthropic_error_body(const ApiError& error) {
  std::string type;
  switch (error.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: type = error.status >= 500 ? "api_error" : "invalid_request_error";
  }
  return json{{"type", "error"}, {"error", {{"type", type}, {"message", error.what()}}}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

std::string anthropic_count_tokens_body(int input_tokens) { return json{{"input_tokens", input_tokens}}.dump(); }

std::string chat_body_from_anthropic(AnthropicEndpoint endpoint, std::string_view body) {
  const ojson root = parse_ordered_json_object(body);
  const bool counting = endpoint == AnthropicEndpoint::CountTokens;
  ojson chat = ojson::object();
  ojson messages = ojson::array();
  if (root.contains("system")) {
    messages.push_back({{"role", "system"}, {"content", text_content(root["system"], "system", {"text"})}});
  }
  if (!root.contains("messages")) invalid_field("messages", "missing");
  const ojson& given = expect_array(root["messages"], "messages");
  for (size_t i = 0; i < given.size(); ++i) {
    const std::string at = "messages." + std::to_string(i);
    const ojson& message = expect_object(given[i], at);
    const std::string& role = expect_string(member(message, "role"), at + ".role");
    if (!message.contains("content")) invalid_field(at + ".content", "missing");
    if (role == "user") {
      append_user(message["content"], at + ".content", messages);
    } else if (role == "assistant") {
      append_assistant(message["content"], at + ".content", messages);
    } else {
      invalid_field(at + ".role", "expected 'user' or 'assistant' (the system prompt is the top-level 'system')");
    }
  }
  chat["messages"] = std::move(messages);
  if (!counting && !root.contains("max_tokens")) invalid_field("max_tokens", "missing");
  for (const auto& [key, value] : root.items()) {
    if (key == "system" || key == "messages") continue;
    if (key == "model" || key == "temperature" || key == "top_p" || key == "top_k" ||
        (!counting && (key == "max_tokens" || key == "stream"))) {
      chat[key] = value;
    } else if (key == "stop_sequences" && !counting) {
      chat["stop"] = value;
    } else if (key == "tools") {
      chat["tools"] = chat_tools(value);
    } else if (key == "tool_choice") {
      add_tool_choice(value, chat);
    } else if (key == "thinking") {
      chat["chat_template_kwargs"] = {{"enable_thinking", thinking_enabled(value)}};
    } else if (key == "metadata" || key == "service_tier") {
      // Who asks and how urgently: neither can change the answer.
    } else {
      invalid_field(key, "unknown or unsupported parameter");
    }
  }
  return chat.dump();
}

}  // namespace strata::api
