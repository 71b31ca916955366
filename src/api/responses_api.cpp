#include "api/responses_api.h"

#include <algorithm>

#include "api/json_body.h"

namespace strata::api {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

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
                           {"content", output.is_string() ? output : text_content(output, path + ".output", {"input_text", "output_text"})}});
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
    ojson message = {{"role", role}, {"content", text_content(member(item, "content"), path + ".content", {"input_text", "output_text"})}};
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
          {"output_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

std::string dump(const ojson& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// One output item: the reasoning, the message, or a function call, in the order they came.
struct OutputItem {
  enum class Kind { Reasoning, Message, Call } kind;
  std::string id;
  std::string text;  // the reasoning's or the message's text; a call's arguments
  chat::ToolCall call;

  static ojson text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
  }

  // As the item stands: while `status` is in_progress without its text, as streams announce it.
  ojson json_with(const char* status) const {
    const bool started = std::string_view(status) == "in_progress";
    switch (kind) {
      case Kind::Reasoning:
        return {{"id", id},
                {"type", "reasoning"},
                {"summary", ojson::array()},
                {"content", started ? ojson::array() : ojson::array({{{"type", "reasoning_text"}, {"text", text}}})}};
      case Kind::Message:
        return {{"id", id},
                {"type", "message"},
                {"status", status},
                {"role", "assistant"},
                {"content", started ? ojson::array() : ojson::array({text_part(text)})}};
      case Kind::Call:
        break;
    }
    return {{"id", id},          {"type", "function_call"},           {"status", status},
            {"call_id", call.id}, {"name", call.name}, {"arguments", started ? "" : call.arguments}};
  }
};

// The answer as output items: its reasoning, its message (always one, empty when nothing was
// said), its function calls.
class ResponsesWriter final : public ResponseWriter {
 public:
  ResponsesWriter(std::string model, ojson settings)
      : model_(std::move(model)), settings_(std::move(settings)), id_(random_id("resp_")), created_at_(unix_time()) {}

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
    std::string events;
    if (!delta.reasoning.empty()) events += stream_text(OutputItem::Kind::Reasoning, delta.reasoning);
    if (!delta.text.empty()) events += stream_text(OutputItem::Kind::Message, delta.text);
    for (const auto& call : delta.tool_calls) {
      events += close_open_item();
      items_.push_back({OutputItem::Kind::Call, random_id("fc_"), {}, call});
      const int index = static_cast<int>(items_.size()) - 1;
      const OutputItem& item = items_.back();
      events += event("response.output_item.added", {{"output_index", index}, {"item", item.json_with("in_progress")}});
      events += event("response.function_call_arguments.delta",
                      {{"item_id", item.id}, {"output_index", index}, {"delta", call.arguments}});
      events += event("response.function_call_arguments.done",
                      {{"item_id", item.id}, {"output_index", index}, {"arguments", call.arguments}});
      events += event("response.output_item.done", {{"output_index", index}, {"item", item.json_with("completed")}});
    }
    return events;
  }

  std::string stream_end(const Finish& finish, const Usage& usage) override {
    complete_ = finish.reason != "length";
    std::string events;
    if (!has(OutputItem::Kind::Message)) events += stream_text(OutputItem::Kind::Message, "");
    events += close_open_item();
    return events + event(complete_ ? "response.completed" : "response.incomplete",
                          {{"response", final_object(usage)}});
  }

  std::string stream_error(const ApiError& error) override {
    return event("error", {{"code", error.code.empty() ? ojson(nullptr) : ojson(error.code)},
                           {"message", error.what()},
                           {"param", error.param.empty() ? ojson(nullptr) : ojson(error.param)}});
  }

  std::string whole(const TextDelta& output, const Finish& finish, const Usage& usage) override {
    complete_ = finish.reason != "length";
    if (!output.reasoning.empty()) items_.push_back({OutputItem::Kind::Reasoning, random_id("rs_"), output.reasoning, {}});
    // In the order a stream gives them: a message with nothing said comes after the calls.
    const OutputItem message{OutputItem::Kind::Message, random_id("msg_"), output.text, {}};
    if (!output.text.empty()) items_.push_back(message);
    for (const auto& call : output.tool_calls) items_.push_back({OutputItem::Kind::Call, random_id("fc_"), {}, call});
    if (output.text.empty()) items_.push_back(message);
    return dump(final_object(usage));
  }

 private:
  std::string event(const char* type, ojson data) {
    ojson body = {{"type", type}};
    for (auto& [key, value] : data.items()) body[key] = std::move(value);
    body["sequence_number"] = sequence_number_++;
    return std::string("event: ") + type + "\ndata: " + dump(body) + "\n\n";
  }

  bool has(OutputItem::Kind kind) const {
    return std::any_of(items_.begin(), items_.end(), [&](const OutputItem& item) { return item.kind == kind; });
  }

  const char* text_delta_event(OutputItem::Kind kind) const {
    return kind == OutputItem::Kind::Reasoning ? "response.reasoning_text.delta" : "response.output_text.delta";
  }

  // Text joins the open item of its kind, or opens one (closing the other).
  std::string stream_text(OutputItem::Kind kind, const std::string& text) {
    std::string events;
    if (open_ < 0 || items_[size_t(open_)].kind != kind) {
      events += close_open_item();
      items_.push_back({kind, random_id(kind == OutputItem::Kind::Reasoning ? "rs_" : "msg_"), {}, {}});
      open_ = static_cast<int>(items_.size()) - 1;
      const OutputItem& item = items_.back();
      events += event("response.output_item.added", {{"output_index", open_}, {"item", item.json_with("in_progress")}});
      if (kind == OutputItem::Kind::Message) {
        events += event("response.content_part.added", {{"item_id", item.id},
                                                        {"output_index", open_},
                                                        {"content_index", 0},
                                                        {"part", OutputItem::text_part("")}});
      }
    }
    OutputItem& item = items_[size_t(open_)];
    item.text += text;
    if (text.empty()) return events;
    ojson delta = {{"item_id", item.id}, {"output_index", open_}, {"content_index", 0}, {"delta", text}};
    if (kind == OutputItem::Kind::Message) delta["logprobs"] = ojson::array();
    return events + event(text_delta_event(kind), std::move(delta));
  }

  std::string close_open_item() {
    if (open_ < 0) return {};
    const OutputItem& item = items_[size_t(open_)];
    const int index = open_;
    open_ = -1;
    std::string events;
    if (item.kind == OutputItem::Kind::Reasoning) {
      events += event("response.reasoning_text.done",
                      {{"item_id", item.id}, {"output_index", index}, {"content_index", 0}, {"text", item.text}});
    } else {
      events += event("response.output_text.done", {{"item_id", item.id},
                                                    {"output_index", index},
                                                    {"content_index", 0},
                                                    {"text", item.text},
                                                    {"logprobs", ojson::array()}});
      events += event("response.content_part.done", {{"item_id", item.id},
                                                     {"output_index", index},
                                                     {"content_index", 0},
                                                     {"part", OutputItem::text_part(item.text)}});
    }
    return events + event("response.output_item.done", {{"output_index", index}, {"item", item.json_with(status())}});
  }

  const char* status() const { return complete_ ? "completed" : "incomplete"; }

  ojson final_object(const Usage& usage) const {
    ojson output = ojson::array();
    for (const auto& item : items_) output.push_back(item.json_with(status()));
    ojson response = response_object(status(), std::move(output), usage_json(usage));
    if (!complete_) response["incomplete_details"] = {{"reason", "max_output_tokens"}};
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
  const int64_t created_at_;
  int sequence_number_ = 0;
  std::vector<OutputItem> items_;
  int open_ = -1;  // the item whose text is streaming, if any
  bool complete_ = true;
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
