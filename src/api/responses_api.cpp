#include "api/responses_api.h"

#include "api/json_body.h"

namespace strata::api {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

[[noreturn]] void not_text(const std::string& path, const std::string& type) {
  invalid_field(path, "the model reads text only; '" + type + "' cannot be given to it");
}

// A message's content: a string, or input_text / output_text parts as OpenAI text parts.
ojson message_content(const ojson& content, const std::string& path) {
  if (content.is_string()) return content;
  ojson parts = ojson::array();
  for (size_t i = 0; i < expect_array(content, path).size(); ++i) {
    const std::string at = path + "." + std::to_string(i);
    const std::string& type = type_of(content[i], at);
    if (type != "input_text" && type != "output_text") not_text(at, type);
    parts.push_back({{"type", "text"}, {"text", expect_string(member(content[i], "text"), at + ".text")}});
  }
  return parts;
}

// Input items as chat messages: function calls join the assistant turn before them (or make
// one), reasoning waits for the assistant turn after it.
class ChatHistory {
 public:
  void add(const ojson& item, const std::string& path) {
    const std::string type = item.contains("type") ? type_of(item, path) : "message";
    if (type == "message") {
      add_message(item, path);
    } else if (type == "function_call") {
      ojson& turn = assistant_turn();
      if (!turn.contains("tool_calls")) turn["tool_calls"] = ojson::array();
      turn["tool_calls"].push_back(
          {{"id", expect_string(member(item, "call_id"), path + ".call_id")},
           {"type", "function"},
           {"function",
            {{"name", expect_string(member(item, "name"), path + ".name")},
             {"arguments", expect_string(member(item, "arguments"), path + ".arguments")}}}});
    } else if (type == "function_call_output") {
      const ojson& output = member(item, "output");
      messages_.push_back({{"role", "tool"},
                           {"tool_call_id", expect_string(member(item, "call_id"), path + ".call_id")},
                           {"content", output.is_string() ? output : message_content(output, path + ".output")}});
    } else if (type == "reasoning") {
      for (const char* key : {"content", "summary"}) {
        const ojson& parts = member(item, key);
        if (parts.is_null()) continue;
        for (size_t i = 0; i < expect_array(parts, path + "." + key).size(); ++i) {
          reasoning_ += expect_string(member(parts[i], "text"), path + "." + key + "." + std::to_string(i) + ".text");
        }
        if (!reasoning_.empty()) break;  // the full text when given, else its summary
      }
    } else {
      invalid_field(path + ".type", "'" + type + "' items are not supported (messages, function_call, "
                                                "function_call_output and reasoning are)");
    }
  }

  void add_text(const std::string& role, const ojson& content) {
    messages_.push_back({{"role", role}, {"content", content}});
  }

  ojson take() { return std::move(messages_); }

 private:
  void add_message(const ojson& item, const std::string& path) {
    std::string role = expect_string(member(item, "role"), path + ".role");
    if (role == "developer") role = "system";
    if (role != "user" && role != "assistant" && role != "system") {
      invalid_field(path + ".role", "expected 'user', 'assistant', 'system' or 'developer'");
    }
    ojson message = {{"role", role}, {"content", message_content(member(item, "content"), path + ".content")}};
    if (role == "assistant") attach_reasoning(message);
    messages_.push_back(std::move(message));
  }

  ojson& assistant_turn() {
    if (messages_.empty() || messages_.back()["role"] != "assistant") {
      ojson turn = {{"role", "assistant"}, {"content", ""}};
      attach_reasoning(turn);
      messages_.push_back(std::move(turn));
    }
    return messages_.back();
  }

  void attach_reasoning(ojson& message) {
    if (!reasoning_.empty()) message["reasoning_content"] = std::move(reasoning_);
    reasoning_.clear();
  }

  ojson messages_ = ojson::array();
  std::string reasoning_;
};

ojson chat_tools(const ojson& tools) {
  ojson converted = ojson::array();
  for (size_t i = 0; i < expect_array(tools, "tools").size(); ++i) {
    const std::string at = "tools." + std::to_string(i);
    const std::string& type = type_of(tools[i], at);
    if (type != "function") {
      invalid_field(at + ".type", "'" + type + "' is a built-in tool of OpenAI's, which this server does not run");
    }
    ojson function = {{"name", expect_string(member(tools[i], "name"), at + ".name")}};
    for (const char* key : {"description", "parameters", "strict"}) {
      if (tools[i].contains(key)) function[key] = tools[i][key];
    }
    converted.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return converted;
}

ojson chat_tool_choice(const ojson& choice) {
  if (choice.is_string()) return choice;
  const std::string& type = type_of(choice, "tool_choice");
  if (type != "function") invalid_field("tool_choice.type", "expected 'function'");
  return {{"type", "function"}, {"function", {{"name", expect_string(member(choice, "name"), "tool_choice.name")}}}};
}

ojson chat_response_format(const ojson& text) {
  expect_object(text, "text");
  for (const auto& [key, value] : text.items()) {
    if (key != "format" && key != "verbosity") invalid_field("text." + key, "unknown field");
  }
  const ojson& format = member(text, "format");
  if (format.is_null()) return nullptr;
  const std::string& type = type_of(format, "text.format");
  if (type != "json_schema") return {{"type", type}};
  ojson schema = {{"name", expect_string(member(format, "name"), "text.format.name")}};
  for (const char* key : {"schema", "strict", "description"}) {
    if (format.contains(key)) schema[key] = format[key];
  }
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

ojson usage_json(const Usage& usage) {
  return {{"input_tokens", usage.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
          {"output_tokens", usage.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

std::string dump(const ojson& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// The answer as one message item with one output_text part.
class ResponsesWriter final : public ResponseWriter {
 public:
  ResponsesWriter(std::string model, ojson settings)
      : model_(std::move(model)),
        settings_(std::move(settings)),
        id_(random_id("resp_")),
        message_id_(random_id("msg_")),
        created_at_(unix_time()) {}

  std::string_view content_type(bool stream) const override {
    return stream ? "text/event-stream" : "application/json";
  }

  std::string stream_start(const Usage&) override {
    ojson response = response_object("in_progress", ojson::array(), nullptr);
    std::string events = event("response.created", {{"response", response}});
    return events + event("response.in_progress", {{"response", response}});
  }

  // An SSE comment line, which the clients skip.
  std::string stream_waiting(const std::string& why) override { return ": waiting for " + why + "\n\n"; }

  std::string stream_delta(const TextDelta& delta) override {
    if (delta.text.empty()) return {};
    std::string events = open_message();
    text_ += delta.text;
    return events + event("response.output_text.delta", {{"item_id", message_id_},
                                                         {"output_index", 0},
                                                         {"content_index", 0},
                                                         {"delta", delta.text},
                                                         {"logprobs", ojson::array()}});
  }

  std::string stream_end(const Finish& finish, const Usage& usage) override {
    std::string events = open_message();
    const ojson part = text_part(text_);
    events += event("response.output_text.done", {{"item_id", message_id_},
                                                  {"output_index", 0},
                                                  {"content_index", 0},
                                                  {"text", text_},
                                                  {"logprobs", ojson::array()}});
    events += event("response.content_part.done",
                    {{"item_id", message_id_}, {"output_index", 0}, {"content_index", 0}, {"part", part}});
    const bool complete = finish.reason != "length";
    events += event("response.output_item.done",
                    {{"output_index", 0}, {"item", message_item(text_, complete ? "completed" : "incomplete")}});
    return events + event(complete ? "response.completed" : "response.incomplete",
                          {{"response", final_object(finish, text_, usage)}});
  }

  std::string stream_error(const ApiError& error) override {
    return event("error", {{"code", error.code.empty() ? ojson(nullptr) : ojson(error.code)},
                           {"message", error.what()},
                           {"param", error.param.empty() ? ojson(nullptr) : ojson(error.param)}});
  }

  std::string whole(const TextDelta& output, const Finish& finish, const Usage& usage) override {
    return dump(final_object(finish, output.text, usage));
  }

 private:
  std::string event(const char* type, ojson data) {
    ojson body = {{"type", type}};
    for (auto& [key, value] : data.items()) body[key] = std::move(value);
    body["sequence_number"] = sequence_number_++;
    return std::string("event: ") + type + "\ndata: " + dump(body) + "\n\n";
  }

  std::string open_message() {
    if (message_open_) return {};
    message_open_ = true;
    std::string events =
        event("response.output_item.added", {{"output_index", 0}, {"item", message_item("", "in_progress")}});
    return events + event("response.content_part.added",
                          {{"item_id", message_id_}, {"output_index", 0}, {"content_index", 0}, {"part", text_part("")}});
  }

  static ojson text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
  }

  ojson message_item(const std::string& text, const char* status) const {
    ojson content = status == std::string_view("in_progress") ? ojson::array() : ojson::array({text_part(text)});
    return {{"id", message_id_}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
  }

  ojson final_object(const Finish& finish, const std::string& text, const Usage& usage) const {
    const bool complete = finish.reason != "length";
    ojson response = response_object(complete ? "completed" : "incomplete",
                                     ojson::array({message_item(text, complete ? "completed" : "incomplete")}),
                                     usage_json(usage));
    if (!complete) response["incomplete_details"] = {{"reason", "max_output_tokens"}};
    return response;
  }

  ojson response_object(const char* status, ojson output, ojson usage) const {
    ojson response = {{"id", id_},
                      {"object", "response"},
                      {"created_at", created_at_},
                      {"status", status},
                      {"error", nullptr},
                      {"incomplete_details", nullptr},
                      {"model", model_},
                      {"output", std::move(output)},
                      {"usage", std::move(usage)}};
    for (const auto& [key, value] : settings_.items()) response[key] = value;
    return response;
  }

  const std::string model_;
  const ojson settings_;
  const std::string id_;
  const std::string message_id_;
  const int64_t created_at_;
  int sequence_number_ = 0;
  bool message_open_ = false;
  std::string text_;
};

}  // namespace

std::unique_ptr<ResponseWriter> responses_api_writer(std::string model, nlohmann::ordered_json settings) {
  return std::make_unique<ResponsesWriter>(std::move(model), std::move(settings));
}

ResponsesRequest read_responses_request(std::string_view body) {
  const ojson root = parse_ordered_json_object(body);
  ResponsesRequest request;
  ojson converted = ojson::object();
  ojson settings = {{"instructions", nullptr}, {"max_output_tokens", nullptr}, {"parallel_tool_calls", true},
                    {"previous_response_id", nullptr}, {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
                    {"store", false}, {"temperature", nullptr}, {"text", {{"format", {{"type", "text"}}}}},
                    {"tool_choice", "auto"}, {"tools", ojson::array()}, {"top_p", nullptr},
                    {"truncation", "disabled"}, {"metadata", ojson::object()}};
  ChatHistory history;
  if (root.contains("instructions") && !root["instructions"].is_null()) {
    history.add_text("system", expect_string(root["instructions"], "instructions"));
  }
  if (!root.contains("input")) invalid_field("input", "missing");
  const ojson& input = root["input"];
  if (input.is_string()) {
    history.add_text("user", input);
  } else {
    for (size_t i = 0; i < expect_array(input, "input").size(); ++i) history.add(input[i], "input." + std::to_string(i));
  }
  converted["messages"] = history.take();
  for (const auto& [key, value] : root.items()) {
    if (key == "input") continue;
    if (key == "instructions" || key == "tools" || key == "tool_choice" || key == "temperature" || key == "top_p" ||
        key == "max_output_tokens" || key == "parallel_tool_calls" || key == "text" || key == "metadata") {
      settings[key] = value;
    }
    if (key == "model" || key == "temperature" || key == "top_p" || key == "stream" || key == "parallel_tool_calls") {
      converted[key] = value;
    } else if (key == "instructions" || key == "metadata" || key == "user" || key == "safety_identifier" ||
               key == "prompt_cache_key" || key == "service_tier") {
      // The system message above, or who asks and how: none changes the answer.
    } else if (key == "max_output_tokens") {
      converted["max_tokens"] = value;
    } else if (key == "tools") {
      converted["tools"] = chat_tools(value);
    } else if (key == "tool_choice") {
      converted["tool_choice"] = chat_tool_choice(value);
    } else if (key == "text") {
      if (ojson format = chat_response_format(value); !format.is_null()) converted["response_format"] = std::move(format);
    } else if (key == "reasoning") {
      const ojson& effort = member(expect_object(value, "reasoning"), "effort");
      if (!effort.is_null()) converted["reasoning_effort"] = expect_string(effort, "reasoning.effort");
      settings["reasoning"]["effort"] = effort;
    } else if (key == "store") {
      expect_bool(value, "store");  // nothing is kept either way; every response says store false
    } else if (key == "previous_response_id") {
      if (!value.is_null()) {
        invalid_field("previous_response_id",
                      "responses are not stored here; send the whole conversation as input items instead");
      }
    } else if (key == "truncation") {
      if (expect_string(value, "truncation") != "disabled") {
        invalid_field("truncation", "only 'disabled': an input too long for the context is a 400, never cut");
      }
    } else {
      invalid_field(key, "unknown or unsupported parameter");
    }
  }
  request.chat_body = converted.dump();
  request.settings = std::move(settings);
  return request;
}

}  // namespace strata::api
