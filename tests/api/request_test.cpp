#include "api/request.h"

#include <gtest/gtest.h>

#include <functional>

#include "api/api_error.h"
#include "constrain/grammar.h"
#include "constrain/matcher.h"

namespace strata::api {
namespace {

CompletionRequest chat(const std::string& body) {
  return parse_completion_request(Endpoint::ChatCompletions, body);
}

TEST(RequestTest, ReadsChatFields) {
  auto request = chat(R"({"model":"m","messages":[{"role":"developer","content":"Be kind."},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"name":"x"},
      {"role":"assistant","content":null}],
      "max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":5,"min_p":0.1,"seed":-1,
      "stop":"END","presence_penalty":1,"frequency_penalty":-1,"stream":true,
      "stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3,"user":"u"})");
  EXPECT_EQ(request.model, "m");
  ASSERT_EQ(request.messages.size(), 3u);
  EXPECT_EQ(request.messages[0].role, "system");
  EXPECT_EQ(request.messages[1].content, "ab");
  EXPECT_EQ(request.messages[2].content, "");
  EXPECT_EQ(request.max_tokens, 7);
  EXPECT_FLOAT_EQ(request.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(request.sampling.top_p, 0.9f);
  EXPECT_EQ(request.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(request.sampling.min_p, 0.1f);
  EXPECT_EQ(request.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(request.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(request.sampling.presence_penalty, 1.0f);
  EXPECT_FLOAT_EQ(request.sampling.frequency_penalty, -1.0f);
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
  EXPECT_TRUE(request.logprobs);
  EXPECT_EQ(request.top_logprobs, 3);
}

TEST(RequestTest, MaxCompletionTokensWinsAndWholeFloatsAreIntegers) {
  auto request = chat(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":3,
                          "max_completion_tokens":5.0})");
  EXPECT_EQ(request.max_tokens, 5);
}

TEST(RequestTest, CompletionLogprobsIsTheAlternativeCount) {
  auto request = parse_completion_request(Endpoint::Completions, R"({"prompt":"x","logprobs":2})");
  EXPECT_TRUE(request.logprobs);
  EXPECT_EQ(request.top_logprobs, 2);
  EXPECT_FALSE(request.max_tokens);
}

TEST(RequestTest, ErrorsNameTheParameter) {
  try {
    chat(R"({"messages":[{"role":"user","content":"x"}],"seed":"1"})");
    FAIL();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, "seed");
    EXPECT_NE(std::string(error.what()).find("seed"), std::string::npos);
  }
}

// A content part carries what its type says, as OpenAI requires: a text part without its text,
// or content without any part, is a 400 naming the field, not an empty message.
TEST(RequestTest, ContentPartsCarryWhatTheirTypeSays) {
  for (const auto& [content, param] :
       {std::pair(R"([{"type":"text"}])", "messages[0].content[0].text"),
        std::pair(R"([{"type":"text","text":"a"},{"type":"text"}])", "messages[0].content[1].text"),
        std::pair("[]", "messages[0].content")}) {
    try {
      chat(std::string(R"({"messages":[{"role":"user","content":)") + content + "}]}");
      ADD_FAILURE() << content << " was accepted";
    } catch (const ApiError& error) {
      EXPECT_EQ(error.status, 400) << content;
      EXPECT_EQ(error.param, param) << content;
      EXPECT_NE(std::string(error.what()).find(param), std::string::npos) << error.what();
    }
  }
  EXPECT_EQ(chat(R"({"messages":[{"role":"user","content":[{"type":"text","text":""}]}]})").messages[0].content, "");
}

TEST(RequestTest, ADrainBodyIsEmptyOrSaysWhetherToForce) {
  EXPECT_FALSE(parse_drain_force(""));
  EXPECT_FALSE(parse_drain_force(" \n"));
  EXPECT_FALSE(parse_drain_force("{}"));
  EXPECT_FALSE(parse_drain_force(R"({"force":false})"));
  EXPECT_TRUE(parse_drain_force(R"({"force":true})"));
  for (const char* body : {R"({"force":"yes"})", R"({"now":true})", "[]", "{"}) {
    try {
      parse_drain_force(body);
      ADD_FAILURE() << body << " was accepted";
    } catch (const ApiError& error) {
      EXPECT_EQ(error.status, 400) << body;
    }
  }
}

TEST(RequestTest, DeepOrHugeInputIsRejectedNotFatal) {
  EXPECT_THROW(chat(std::string(100000, '[')), ApiError);
  EXPECT_THROW(chat(R"({"messages":[{"role":"user","content":"x"}],"top_k":7e70000})"), ApiError);
  EXPECT_THROW(chat(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1e300})"),
               ApiError);
  EXPECT_THROW(chat(R"({"messages":[{"role":"user","content":"x"}],"seed":18446744073709551615})"),
               ApiError);
  EXPECT_THROW(chat("{\"messages\":\"\xff\"}"), ApiError);
}

TEST(RequestTest, DeepNestingIsRefusedWhileParsing) {
  const auto nested = [](int depth) {
    return R"({"prompt":"x","user":)" + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  EXPECT_NO_THROW(parse_completion_request(Endpoint::Completions, nested(60)));
  try {
    parse_completion_request(Endpoint::Completions, nested(65));
    ADD_FAILURE() << "65 levels were accepted";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.code, "invalid_json");
    EXPECT_NE(std::string(error.what()).find("nested"), std::string::npos) << error.what();
  }
  // 8 MB of brackets: refused at the limit, long before the end of the body.
  const std::string brackets(size_t{8} << 20, '[');
  EXPECT_THROW(parse_ollama_request(OllamaEndpoint::Generate, brackets), ApiError);
}

// Whether the request's grammar accepts exactly `text`.
bool grammar_accepts(const CompletionRequest& request, const std::string& text) {
  constrain::Matcher m(constrain::parse_gbnf(request.grammar),
                       std::make_shared<const constrain::Vocabulary>(std::vector<std::string>{}, std::vector<constrain::Token>{}));
  return m.accept_bytes(text) && m.complete();
}

std::string error_param(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param + ": " + e.what();
  }
  return "accepted";
}

TEST(RequestTest, ResponseFormatBecomesTheGrammarOfItsSchema) {
  const std::string user = R"("messages":[{"role":"user","content":"x"}])";
  EXPECT_TRUE(chat("{" + user + R"(,"response_format":{"type":"text"}})").grammar.empty());
  const auto object = chat("{" + user + R"(,"response_format":{"type":"json_object"}})");
  EXPECT_TRUE(grammar_accepts(object, R"({"a": [1]})"));
  EXPECT_FALSE(grammar_accepts(object, "[1]"));
  const auto schema = chat("{" + user + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"p",
      "strict":true,"schema":{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"boolean"}},
      "required":["z","a"]}}}})");
  // Properties come in the body's order, not sorted.
  EXPECT_TRUE(grammar_accepts(schema, R"({"z": 1, "a": true})"));
  EXPECT_FALSE(grammar_accepts(schema, R"({"a": true, "z": 1})"));
  const auto completion = parse_completion_request(Endpoint::Completions, R"({"prompt":"x","grammar":"root ::= [ab]+"})");
  EXPECT_TRUE(grammar_accepts(completion, "abba"));
}

TEST(RequestTest, BadResponseFormatsAndGrammarsName400sParameter) {
  const std::string user = R"("messages":[{"role":"user","content":"x"}])";
  const auto param = [&](const std::string& rest) { return error_param([&] { chat("{" + user + "," + rest + "}"); }); };
  EXPECT_EQ(param(R"("response_format":{"type":"yaml"})").rfind("response_format.type:", 0), 0u);
  EXPECT_EQ(param(R"("response_format":{"type":"json_schema"})").rfind("response_format.json_schema:", 0), 0u);
  EXPECT_EQ(param(R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})").rfind("response_format.json_schema.schema:", 0), 0u);
  EXPECT_EQ(param(R"("response_format":{"type":"json_schema","json_schema":{"schema":{},"extra":1}})").rfind("response_format.json_schema.extra:", 0), 0u);
  const std::string unsupported = param(R"("response_format":{"type":"json_schema","json_schema":{"schema":{"properties":{"a":{"type":"string","format":"date"}}}}})");
  EXPECT_EQ(unsupported.rfind("response_format.json_schema.schema:", 0), 0u) << unsupported;
  EXPECT_NE(unsupported.find("/properties/a: unsupported keyword: format"), std::string::npos) << unsupported;
  EXPECT_EQ(param(R"("grammar":"root ::= (")").rfind("grammar:", 0), 0u);
  EXPECT_EQ(param(R"("grammar":"root ::= \"a\"","response_format":{"type":"json_object"})").rfind("grammar:", 0), 0u);
}

TEST(RequestTest, OllamaFormatIsJsonOrASchema) {
  const auto ollama = [](const std::string& format) {
    return parse_ollama_request(OllamaEndpoint::Chat, R"({"messages":[{"role":"user","content":"x"}],"format":)" + format + "}");
  };
  EXPECT_TRUE(ollama(R"("")").grammar.empty());
  EXPECT_TRUE(grammar_accepts(ollama(R"("json")"), R"({"k": null})"));
  const auto schema = ollama(R"({"type":"array","items":{"enum":["x"]},"maxItems":1})");
  EXPECT_TRUE(grammar_accepts(schema, R"(["x"])"));
  EXPECT_FALSE(grammar_accepts(schema, R"(["x","x"])"));
  EXPECT_EQ(error_param([&] { ollama(R"("yaml")"); }).rfind("format:", 0), 0u);
  EXPECT_EQ(error_param([&] { ollama(R"({"type":"object","minProperties":1})"); }).rfind("format:", 0), 0u);
}

}  // namespace
}  // namespace strata::api

namespace strata::api {
namespace {

TEST(RequestTest, ReadsToolsHistoryAndTemplateVariables) {
  auto request = parse_completion_request(Endpoint::ChatCompletions, R"({"messages":[
      {"role":"user","content":"Weather?"},
      {"role":"assistant","content":null,"reasoning_content":"Look it up.","tool_calls":[
        {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","name":"get_weather","content":[{"type":"text","text":"cold"}]}],
      "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"},"strict":true}}],
      "tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false,
      "reasoning_effort":"high","chat_template_kwargs":{"enable_thinking":false,"custom":[1]}})");
  ASSERT_EQ(request.messages.size(), 3u);
  const ChatMessage& call = request.messages[1];
  EXPECT_EQ(call.content, "");
  EXPECT_EQ(call.reasoning_content, "Look it up.");
  ASSERT_EQ(call.tool_calls.size(), 1u);
  EXPECT_EQ(call.tool_calls[0].id, "call_1");
  EXPECT_EQ(call.tool_calls[0].name, "get_weather");
  EXPECT_EQ(call.tool_calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(request.messages[2].tool_call_id, "call_1");
  EXPECT_EQ(request.messages[2].name, "get_weather");
  EXPECT_EQ(request.messages[2].content, "cold");
  ASSERT_EQ(request.tools.size(), 1u);
  EXPECT_EQ(request.tool_choice.mode, ToolChoice::Mode::Function);
  EXPECT_EQ(request.tool_choice.function, "get_weather");
  EXPECT_FALSE(request.parallel_tool_calls);
  EXPECT_EQ(request.template_kwargs["reasoning_effort"], "high");
  EXPECT_EQ(request.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(request.template_kwargs["custom"], nlohmann::ordered_json::array({1}));
}

TEST(RequestTest, OllamaToolsThinkAndArgumentObjects) {
  auto request = parse_ollama_request(OllamaEndpoint::Chat, R"({"messages":[
      {"role":"user","content":"Weather?"},
      {"role":"assistant","content":"","thinking":"Hm.","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Oslo","days":2}}}]},
      {"role":"tool","tool_name":"get_weather","content":"cold"}],
      "tools":[{"type":"function","function":{"name":"get_weather"}}],"think":true})");
  ASSERT_EQ(request.messages.size(), 3u);
  EXPECT_EQ(request.messages[1].reasoning_content, "Hm.");
  ASSERT_EQ(request.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(request.messages[1].tool_calls[0].arguments, R"({"city":"Oslo","days":2})");  // keys in order
  EXPECT_EQ(request.messages[2].name, "get_weather");
  EXPECT_EQ(request.template_kwargs["enable_thinking"], true);
  EXPECT_THROW(parse_ollama_request(OllamaEndpoint::Chat, R"({"messages":[{"role":"user","content":"x"}],"think":"max"})"),
               ApiError);
}

TEST(RequestTest, RefusesMalformedToolRequests) {
  const std::string user = R"("messages":[{"role":"user","content":"x"}])";
  for (const std::string& body : std::vector<std::string>{
           "{" + user + R"(,"tools":{"type":"function"}})",
           "{" + user + R"(,"tools":[{"type":"function","function":{"name":"bad name"}}]})",
           "{" + user + R"(,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]})",
           "{" + user + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":"{}"}}]})",
           "{" + user + R"(,"tools":[{"type":"function","function":{"name":"f","color":"red"}}]})",
           "{" + user + R"(,"reasoning_effort":"maximal"})",
           "{" + user + R"(,"chat_template_kwargs":[]})",
           R"({"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]})",
           R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{}}}]}]})",
           R"({"messages":[{"role":"tool","content":"x"}]})",
           R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})",
       }) {
    EXPECT_THROW(parse_completion_request(Endpoint::ChatCompletions, body), ApiError) << body;
  }
}

}  // namespace
}  // namespace strata::api

namespace strata::api {
namespace {

// Objects keep their members' order (the tools reach the template as the client wrote them),
// which costs a search per member: objects are bounded so that no body can take long to parse.
TEST(RequestTest, RefusesObjectsOfMoreThan256Members) {
  auto body_with = [](int members) {
    std::string metadata = "{";
    for (int i = 0; i < members; ++i) metadata += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
    return R"({"messages":[{"role":"user","content":"x"}],"metadata":)" + metadata + "}}";
  };
  EXPECT_NO_THROW(parse_completion_request(Endpoint::ChatCompletions, body_with(256)));
  try {
    parse_completion_request(Endpoint::ChatCompletions, body_with(257));
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_json");
    EXPECT_NE(std::string(e.what()).find("256 members"), std::string::npos) << e.what();
  }
}

TEST(RequestTest, ToolsKeepTheClientsKeyOrder) {
  auto request = parse_completion_request(Endpoint::ChatCompletions, R"({"messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"z":{},"a":{}}}}}]})");
  EXPECT_EQ(request.tools.dump(),
            R"([{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"z":{},"a":{}}}}}])");
}

}  // namespace
}  // namespace strata::api
