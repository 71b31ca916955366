#include "api/anthropic.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

namespace strata::api {
namespace {

using json = nlohmann::json;

json chat_of(const json& anthropic, AnthropicEndpoint endpoint = AnthropicEndpoint::Messages) {
  return json::parse(chat_body_from_anthropic(endpoint, anthropic.dump()));
}

TEST(AnthropicRequest, ConversationBecomesChatMessages) {
  const json chat = chat_of({
      {"model", "m"},
      {"max_tokens", 64},
      {"system", json::array({{{"type", "text"}, {"text", "Be brief."}}})},
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Paris?"}},
        {{"role", "assistant"},
         {"content",
          {{{"type", "thinking"}, {"thinking", "Use the tool."}, {"signature", "x"}},
           {{"type", "text"}, {"text", "Checking."}},
           {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "weather"}, {"input", {{"city", "Paris"}}}}}}},
        {{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", "Thanks."}},
           {{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "18 C"}}}}}}},
      {"stop_sequences", {"END"}},
      {"temperature", 0.5},
      {"top_k", 7},
      {"stream", true},
      {"metadata", {{"user_id", "u"}}},
  });
  const json expected_messages = {
      {{"role", "system"}, {"content", {{{"type", "text"}, {"text", "Be brief."}}}}},
      {{"role", "user"}, {"content", "Weather in Paris?"}},
      {{"role", "assistant"},
       {"content", "Checking."},
       {"reasoning_content", "Use the tool."},
       {"tool_calls",
        {{{"id", "toolu_1"},
          {"type", "function"},
          {"function", {{"name", "weather"}, {"arguments", R"({"city":"Paris"})"}}}}}}},
      // The tool's result answers the call, so it comes before the user's words.
      {{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "18 C"}},
      {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Thanks."}}}}},
  };
  EXPECT_EQ(chat["messages"], expected_messages);
  EXPECT_EQ(chat["model"], "m");
  EXPECT_EQ(chat["max_tokens"], 64);
  EXPECT_EQ(chat["stop"], json::array({"END"}));
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["top_k"], 7);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_FALSE(chat.contains("metadata"));
}

TEST(AnthropicRequest, ToolsChoiceAndThinking) {
  const json schema = {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}};
  const json base = {{"max_tokens", 8},
                     {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"tools", {{{"name", "weather"}, {"description", "Weather now"}, {"input_schema", schema}}}}};
  json request = base;
  request["tool_choice"] = {{"type", "tool"}, {"name", "weather"}, {"disable_parallel_tool_use", true}};
  request["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  json chat = chat_of(request);
  EXPECT_EQ(chat["tools"], json::array({{{"type", "function"},
                                         {"function", {{"name", "weather"}, {"description", "Weather now"}, {"parameters", schema}}}}}));
  EXPECT_EQ(chat["tool_choice"], json({{"type", "function"}, {"function", {{"name", "weather"}}}}));
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(chat["chat_template_kwargs"], json({{"enable_thinking", true}}));
  request = base;
  request["tool_choice"] = {{"type", "any"}};
  EXPECT_EQ(chat_of(request)["tool_choice"], "required");
  request["tool_choice"] = {{"type", "none"}};
  EXPECT_EQ(chat_of(request)["tool_choice"], "none");
  request["thinking"] = {{"type", "disabled"}};
  EXPECT_EQ(chat_of(request)["chat_template_kwargs"], json({{"enable_thinking", false}}));
}

TEST(AnthropicRequest, SchemaKeysKeepTheirOrder) {
  const std::string body =
      R"({"max_tokens":1,"messages":[{"role":"user","content":"x"}],)"
      R"("tools":[{"name":"f","input_schema":{"type":"object","required":["b"],"properties":{"b":{},"a":{}}}}]})";
  const std::string chat = chat_body_from_anthropic(AnthropicEndpoint::Messages, body);
  EXPECT_NE(chat.find(R"({"type":"object","required":["b"],"properties":{"b":{},"a":{}}})"), std::string::npos) << chat;
}

void expect_refused(const json& request, const std::string& field, AnthropicEndpoint endpoint = AnthropicEndpoint::Messages) {
  try {
    chat_body_from_anthropic(endpoint, request.dump());
    ADD_FAILURE() << "accepted " << request.dump();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, field) << error.what();
  }
}

TEST(AnthropicRequest, RefusesWhatItCannotMean) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  expect_refused({{"messages", {user}}}, "max_tokens");
  EXPECT_NO_THROW(chat_of({{"messages", {user}}}, AnthropicEndpoint::CountTokens));
  expect_refused({{"messages", {user}}, {"stream", true}}, "stream", AnthropicEndpoint::CountTokens);
  expect_refused({{"max_tokens", 1}}, "messages");
  expect_refused({{"max_tokens", 1}, {"messages", {{{"role", "system"}, {"content", "x"}}}}}, "messages.0.role");
  expect_refused({{"max_tokens", 1},
                  {"messages", {{{"role", "user"}, {"content", {{{"type", "image"}, {"source", json::object()}}}}}}}},
                 "messages.0.content.0");
  expect_refused({{"max_tokens", 1},
                  {"messages", {{{"role", "user"}, {"content", {{{"type", "tool_result"}, {"content", "x"}}}}}}}},
                 "messages.0.content.0.tool_use_id");
  expect_refused({{"max_tokens", 1}, {"messages", {user}}, {"tools", {{{"type", "web_search_20250305"}, {"name", "web_search"}}}}},
                 "tools.0.type");
  expect_refused({{"max_tokens", 1}, {"messages", {user}}, {"tool_choice", {{"type", "sometimes"}}}}, "tool_choice.type");
  expect_refused({{"max_tokens", 1}, {"messages", {user}}, {"mcp_servers", json::array()}}, "mcp_servers");
}

std::vector<json> events_of(const std::string& stream) {
  std::vector<json> events;
  size_t start = 0;
  while (start < stream.size()) {
    const size_t end = stream.find("\n\n", start);
    const std::string event = stream.substr(start, end - start);
    start = end + 2;
    const size_t newline = event.find('\n');
    EXPECT_EQ(event.rfind("event: ", 0), 0u) << event;
    json data = json::parse(event.substr(newline + 7));
    EXPECT_EQ(event.substr(7, newline - 7), data["type"].get<std::string>());
    events.push_back(std::move(data));
  }
  return events;
}

TEST(AnthropicWriter, StreamsOneTextBlockBetweenMessageEvents) {
  auto writer = anthropic_response_writer("m");
  Usage prompt{.prompt_tokens = 10, .cached_tokens = 4};
  std::string stream = writer->stream_start(prompt);
  stream += writer->stream_delta({"Hel", {}});
  stream += writer->stream_delta({"lo", {}});
  Usage done = prompt;
  done.completion_tokens = 2;
  stream += writer->stream_end({"stop", "END"}, done);
  const auto events = events_of(stream);
  std::vector<std::string> types;
  for (const auto& event : events) types.push_back(event["type"]);
  EXPECT_EQ(types, (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_stop", "message_delta",
                                             "message_stop"}));
  EXPECT_EQ(events[0]["message"]["usage"]["input_tokens"], 6);
  EXPECT_EQ(events[0]["message"]["usage"]["cache_read_input_tokens"], 4);
  EXPECT_EQ(events[3]["delta"], json({{"type", "text_delta"}, {"text", "Hel"}}));
  EXPECT_EQ(events[6]["delta"], json({{"stop_reason", "stop_sequence"}, {"stop_sequence", "END"}}));
  EXPECT_EQ(events[6]["usage"]["output_tokens"], 2);
}

TEST(AnthropicWriter, AnEmptyAnswerStillHasATextBlock) {
  auto writer = anthropic_response_writer("m");
  const auto events = events_of(writer->stream_start({}) + writer->stream_end({"length", ""}, {}));
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[2]["content_block"], json({{"type", "text"}, {"text", ""}}));
  EXPECT_EQ(events[4]["delta"]["stop_reason"], "max_tokens");
  const json whole = json::parse(anthropic_response_writer("m")->whole({"", {}}, {"stop", ""}, {}));
  EXPECT_EQ(whole["content"], json::array({{{"type", "text"}, {"text", ""}}}));
  EXPECT_EQ(whole["stop_reason"], "end_turn");
  EXPECT_TRUE(whole["stop_sequence"].is_null());
}

TEST(AnthropicWriter, ReasoningAndToolCallsAreBlocksOfTheirOwn) {
  TextDelta reasoning{.text = "", .logprobs = {}, .reasoning = "Think.", .tool_calls = {}};
  TextDelta said{.text = "Calling.", .logprobs = {}, .reasoning = "", .tool_calls = {}};
  TextDelta calls{.text = "", .logprobs = {}, .reasoning = "",
                  .tool_calls = {{"call_1", "weather", R"({"city":"Paris"})"}, {"call_2", "time", "{}"}}};
  auto writer = anthropic_response_writer("m");
  std::string stream = writer->stream_start({});
  for (const TextDelta* delta : {&reasoning, &said, &calls}) stream += writer->stream_delta(*delta);
  stream += writer->stream_end({"tool_calls", ""}, {});
  const auto events = events_of(stream);
  std::vector<std::string> starts;
  for (const auto& event : events) {
    if (event["type"] == "content_block_start") starts.push_back(event["content_block"]["type"]);
  }
  EXPECT_EQ(starts, (std::vector<std::string>{"thinking", "text", "tool_use", "tool_use"}));
  EXPECT_EQ(events[3]["delta"], json({{"type", "thinking_delta"}, {"thinking", "Think."}}));
  const auto first_call = std::find_if(events.begin(), events.end(), [](const json& event) {
    return event["type"] == "content_block_start" && event["content_block"]["type"] == "tool_use";
  });
  EXPECT_EQ((*first_call)["content_block"], json({{"type", "tool_use"}, {"id", "call_1"}, {"name", "weather"}, {"input", json::object()}}));
  EXPECT_EQ(json::parse((*(first_call + 1))["delta"]["partial_json"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(events[events.size() - 2]["delta"]["stop_reason"], "tool_use");

  TextDelta whole_output = reasoning;
  whole_output.append(TextDelta(said));
  whole_output.append(TextDelta(calls));
  const json whole = json::parse(anthropic_response_writer("m")->whole(whole_output, {"tool_calls", ""}, {}));
  ASSERT_EQ(whole["content"].size(), 4u);
  EXPECT_EQ(whole["content"][0], json({{"type", "thinking"}, {"thinking", "Think."}, {"signature", ""}}));
  EXPECT_EQ(whole["content"][1], json({{"type", "text"}, {"text", "Calling."}}));
  EXPECT_EQ(whole["content"][2]["input"], json({{"city", "Paris"}}));
  EXPECT_EQ(whole["content"][3]["name"], "time");
  EXPECT_EQ(whole["stop_reason"], "tool_use");
}

TEST(AnthropicErrors, TypesFollowTheStatus) {
  const auto type_of = [](int status) {
    return json::parse(anthropic_error_body(ApiError(status, "why")))["error"]["type"].get<std::string>();
  };
  EXPECT_EQ(type_of(400), "invalid_request_error");
  EXPECT_EQ(type_of(401), "authentication_error");
  EXPECT_EQ(type_of(404), "not_found_error");
  EXPECT_EQ(type_of(429), "rate_limit_error");
  EXPECT_EQ(type_of(500), "api_error");
  EXPECT_EQ(type_of(503), "overloaded_error");
  EXPECT_EQ(json::parse(anthropic_error_body(ApiError(400, "why")))["type"], "error");
}

}  // namespace
}  // namespace strata::api
