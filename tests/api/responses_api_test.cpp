#include "api/responses_api.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

namespace strata::api {
namespace {

using json = nlohmann::json;

json chat_of(const json& request) { return json::parse(read_responses_request(request.dump()).chat_body); }

TEST(ResponsesRequest, ItemsBecomeChatMessages) {
  const json chat = chat_of({
      {"model", "m"},
      {"instructions", "Be brief."},
      {"input",
       {{{"role", "developer"}, {"content", "Use tools."}},
        {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather?"}}}}},
        {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", {{{"type", "summary_text"}, {"text", "Ask the tool."}}}}},
        {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "weather"}, {"arguments", R"({"city":"Paris"})"}},
        {{"type", "function_call"}, {"call_id", "call_2"}, {"name", "time"}, {"arguments", "{}"}},
        {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "18 C"}},
        {{"type", "function_call_output"}, {"call_id", "call_2"}, {"output", "noon"}},
        {{"role", "assistant"}, {"content", {{{"type", "output_text"}, {"text", "18 C at noon."}}}}}}},
      {"max_output_tokens", 32},
      {"temperature", 0},
      {"stream", true},
      {"store", true},
      {"reasoning", {{"effort", "low"}}},
  });
  const json call = [](const char* id, const char* name, const char* arguments) {
    return json{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
  }("call_1", "weather", R"({"city":"Paris"})");
  const json expected = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "system"}, {"content", "Use tools."}},
      {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Weather?"}}}}},
      {{"role", "assistant"},
       {"content", ""},
       {"reasoning_content", "Ask the tool."},
       {"tool_calls", {call, {{"id", "call_2"}, {"type", "function"}, {"function", {{"name", "time"}, {"arguments", "{}"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}},
      {{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", "noon"}},
      {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "18 C at noon."}}}}},
  };
  EXPECT_EQ(chat["messages"], expected);
  EXPECT_EQ(chat["max_tokens"], 32);
  EXPECT_EQ(chat["temperature"], 0);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["reasoning_effort"], "low");
  EXPECT_FALSE(chat.contains("store"));
}

TEST(ResponsesRequest, ToolsAndTextFormat) {
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  const ResponsesRequest read = read_responses_request(
      json{{"input", "hi"},
           {"tools", {{{"type", "function"}, {"name", "f"}, {"description", "d"}, {"parameters", schema}, {"strict", true}}}},
           {"tool_choice", {{"type", "function"}, {"name", "f"}}},
           {"text", {{"format", {{"type", "json_schema"}, {"name", "out"}, {"schema", schema}, {"strict", true}}}}}}
          .dump());
  const json chat = json::parse(read.chat_body);
  EXPECT_EQ(chat["tools"], json::array({{{"type", "function"},
                                         {"function", {{"name", "f"}, {"description", "d"}, {"parameters", schema}, {"strict", true}}}}}));
  EXPECT_EQ(chat["tool_choice"], json({{"type", "function"}, {"function", {{"name", "f"}}}}));
  EXPECT_EQ(chat["response_format"],
            json({{"type", "json_schema"}, {"json_schema", {{"name", "out"}, {"schema", schema}, {"strict", true}}}}));
  // The response object repeats the settings as given.
  EXPECT_EQ(json(read.settings["tool_choice"]), json({{"type", "function"}, {"name", "f"}}));
  EXPECT_EQ(read.settings["store"], false);
  EXPECT_EQ(chat_of({{"input", "hi"}, {"text", {{"format", {{"type", "json_object"}}}}}})["response_format"],
            json({{"type", "json_object"}}));
  EXPECT_EQ(chat_of({{"input", "hi"}, {"text", {{"format", {{"type", "text"}}}}}})["response_format"],
            json({{"type", "text"}}));
}

void expect_refused(const json& request, const std::string& field) {
  try {
    read_responses_request(request.dump());
    ADD_FAILURE() << "accepted " << request.dump();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, field) << error.what();
  }
}

TEST(ResponsesRequest, RefusesWhatItCannotMean) {
  expect_refused(json::object(), "input");
  expect_refused({{"input", "x"}, {"previous_response_id", "resp_1"}}, "previous_response_id");
  expect_refused({{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}},
                 "input.0.content.0");
  expect_refused({{"input", {{{"type", "web_search_call"}}}}}, "input.0.type");
  expect_refused({{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, "tools.0.type");
  expect_refused({{"input", "x"}, {"truncation", "auto"}}, "truncation");
  expect_refused({{"input", {{{"role", "tool"}, {"content", "x"}}}}}, "input.0.role");
  expect_refused({{"input", "x"}, {"background", true}}, "background");
}

std::vector<json> events_of(const std::string& stream) {
  std::vector<json> events;
  for (size_t start = 0; start < stream.size();) {
    const size_t end = stream.find("\n\n", start);
    const std::string event = stream.substr(start, end - start);
    start = end + 2;
    const size_t newline = event.find('\n');
    json data = json::parse(event.substr(newline + 7));
    EXPECT_EQ(event.substr(7, newline - 7), data["type"].get<std::string>());
    events.push_back(std::move(data));
  }
  return events;
}

TEST(ResponsesWriter, EventsInOrderWithTheWholeTextAtTheEnd) {
  auto writer = responses_api_writer("m", read_responses_request(R"({"input":"x"})").settings);
  std::string stream = writer->stream_start({});
  stream += writer->stream_delta({"Hel", {}});
  stream += writer->stream_delta({"lo", {}});
  stream += writer->stream_end({"stop", ""}, Usage{.prompt_tokens = 5, .completion_tokens = 2, .cached_tokens = 1});
  const auto events = events_of(stream);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    types.push_back(events[i]["type"]);
    EXPECT_EQ(events[i]["sequence_number"], i);
  }
  EXPECT_EQ(types, (std::vector<std::string>{
                       "response.created", "response.in_progress", "response.output_item.added",
                       "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                       "response.output_text.done", "response.content_part.done", "response.output_item.done",
                       "response.completed"}));
  const json& done = events.back()["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(done["usage"]["input_tokens"], 5);
  EXPECT_EQ(done["usage"]["input_tokens_details"]["cached_tokens"], 1);
  EXPECT_EQ(done["usage"]["total_tokens"], 7);
}

TEST(ResponsesWriter, ReasoningMessageAndCallsAreItemsInOrder) {
  auto writer = responses_api_writer("m", read_responses_request(R"({"input":"x"})").settings);
  std::string stream = writer->stream_start({});
  stream += writer->stream_delta({.text = "", .logprobs = {}, .reasoning = "Think.", .tool_calls = {}});
  stream += writer->stream_delta({.text = "", .logprobs = {}, .reasoning = "",
                                  .tool_calls = {{"call_1", "weather", R"({"city":"Paris"})"}}});
  stream += writer->stream_end({"tool_calls", ""}, Usage{.completion_tokens = 9, .reasoning_tokens = 3});
  const auto events = events_of(stream);
  std::vector<std::string> added;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    if (events[i]["type"] == "response.output_item.added") added.push_back(events[i]["item"]["type"]);
  }
  // The message comes last here: an answer always has one, empty when only calls came.
  EXPECT_EQ(added, (std::vector<std::string>{"reasoning", "function_call", "message"}));
  const json& output = events.back()["response"]["output"];
  ASSERT_EQ(output.size(), 3u);
  EXPECT_EQ(output[0]["content"][0], json({{"type", "reasoning_text"}, {"text", "Think."}}));
  EXPECT_EQ(output[1]["call_id"], "call_1");
  EXPECT_EQ(output[1]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(output[1]["status"], "completed");
  EXPECT_EQ(events.back()["response"]["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
  const auto arguments = std::find_if(events.begin(), events.end(), [](const json& event) {
    return event["type"] == "response.function_call_arguments.done";
  });
  ASSERT_NE(arguments, events.end());
  EXPECT_EQ((*arguments)["arguments"], R"({"city":"Paris"})");
}

TEST(ResponsesWriter, RunningOutOfTokensIsIncomplete) {
  auto writer = responses_api_writer("m", read_responses_request(R"({"input":"x"})").settings);
  const json whole = json::parse(writer->whole({"abc", {}}, {"length", ""}, {}));
  EXPECT_EQ(whole["status"], "incomplete");
  EXPECT_EQ(whole["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(whole["output"][0]["status"], "incomplete");
}

}  // namespace
}  // namespace strata::api
