// The HTTP API end to end in-process: a real tokenizer, a fake generator, httplib clients.
#include "api/server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "api/chat_template.h"
#include "fake_generator.h"
#include "http_test_support.h"
#include "dreams_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace strata::api {
namespace {

using json = nlohmann::json;
using testing::FakeGenerator;

const std::string kModel = "aidreams260K";

struct Reply {
  int status = 0;
  json body;
};

std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> payloads;
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.find("\n\n", start);
    EXPECT_NE(end, std::string::npos) << "unterminated event: " << body.substr(start);
    if (end == std::string::npos) break;
    std::string event = body.substr(start, end - start);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    payloads.push_back(event.substr(6));
    start = end + 2;
  }
  return payloads;
}

class ApiServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = &testing::dreams_tokenizer(); }

  void TearDown() override {
    server_.reset();
    generator_.reset();
  }

  // Ordinary word pieces, so every token decodes to visible, valid text.
  static FakeGenerator::Options fake_options() {
    FakeGenerator::Options options;
    for (int token = 0; token < tokenizer_->vocab_size(); ++token) {
      std::string piece = tokenizer_->token_piece(token);
      bool printable = piece.size() >= 2 && std::all_of(piece.begin(), piece.end(), [](char c) {
                         return c >= 'a' && c <= 'z';
                       });
      if (!tokenizer_->is_control(token) && printable) options.vocabulary.push_back(token);
    }
    return options;
  }

  void start(FakeGenerator::Options fake = fake_options(), ServerOptions options = {},
             const std::string& chat_template = "") {
    options.host = "127.0.0.1";
    options.port = 0;
    generator_ = std::make_unique<FakeGenerator>(std::move(fake));
    server_ = std::make_unique<Server>(*generator_, *tokenizer_, kModel, chat_template, options);
    server_->start();
  }

  httplib::Client client() const {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(std::chrono::seconds(30));
    return client;
  }

  Reply post(const std::string& path, const std::string& body,
             const httplib::Headers& headers = {}) {
    auto result = client().Post(path, headers, body, "application/json");
    if (!result) {
      ADD_FAILURE() << "no response from " << path << ": " << httplib::to_string(result.error());
      return {};
    }
    return {result->status, json::parse(result->body, nullptr, false)};
  }
  Reply post(const std::string& path, const json& body) { return post(path, body.dump()); }

  Reply get(const std::string& path) {
    auto result = client().Get(path);
    if (!result) {
      ADD_FAILURE() << "no response from " << path << ": " << httplib::to_string(result.error());
      return {};
    }
    return {result->status, json::parse(result->body, nullptr, false)};
  }

  // The events of a streamed response; "[DONE]" stays a string, the rest are parsed.
  std::vector<json> post_stream(const std::string& path, const json& body) {
    auto result = client().Post(path, body.dump(), "application/json");
    if (!result) {
      ADD_FAILURE() << "no response from " << path;
      return {};
    }
    EXPECT_EQ(result->status, 200) << result->body;
    EXPECT_EQ(result->get_header_value("Content-Type"), "text/event-stream");
    std::vector<json> events;
    for (const auto& payload : sse_payloads(result->body)) {
      events.push_back(payload == "[DONE]" ? json(payload) : json::parse(payload));
    }
    return events;
  }

  static std::string decode(std::span<const engine::Token> tokens) {
    tokenizer::StreamDecoder decoder(*tokenizer_);
    std::string text;
    for (auto token : tokens) text += decoder.push(token);
    return text + decoder.finish();
  }

  std::vector<engine::Token> chat_prompt(const std::string& user_text) const {
    std::vector<ChatMessage> messages{{"user", user_text}};
    return chatml_prompt_tokens(*tokenizer_, messages);
  }

  std::string expected_text(std::span<const engine::Token> prompt, int count) const {
    return decode(generator_->tokens_for(prompt, count));
  }

  static json chat_body(const std::string& user_text, int max_tokens) {
    return {{"model", kModel},
            {"messages", {{{"role", "user"}, {"content", user_text}}}},
            {"max_tokens", max_tokens}};
  }

  static void expect_error(const Reply& reply, int status, const std::string& param,
                           const std::string& code) {
    EXPECT_EQ(reply.status, status) << reply.body.dump();
    ASSERT_TRUE(reply.body.is_object()) << reply.body.dump();
    ASSERT_TRUE(reply.body.contains("error")) << reply.body.dump();
    const json& error = reply.body["error"];
    EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty());
    EXPECT_TRUE(error["type"].is_string());
    EXPECT_EQ(error["param"], param.empty() ? json(nullptr) : json(param)) << error.dump();
    EXPECT_EQ(error["code"], code.empty() ? json(nullptr) : json(code)) << error.dump();
  }

  static inline const tokenizer::Tokenizer* tokenizer_ = nullptr;
  std::unique_ptr<FakeGenerator> generator_;
  std::unique_ptr<Server> server_;
};

TEST_F(ApiServerTest, HealthAndModels) {
  start();
  auto health = get("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, json({{"status", "ok"}}));

  auto models = get("/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  ASSERT_EQ(models.body["data"].size(), 1u);
  EXPECT_EQ(models.body["data"][0]["id"], kModel);
  EXPECT_EQ(models.body["data"][0]["object"], "model");
  EXPECT_TRUE(models.body["data"][0]["created"].is_number_integer());
  EXPECT_EQ(models.body["data"][0]["owned_by"], "strata");

  EXPECT_EQ(get("/v1/models/" + kModel).body["id"], kModel);
  expect_error(get("/v1/models/gpt-4"), 404, "model", "model_not_found");
  expect_error(get("/v1/nothing"), 404, "", "unknown_url");
}

TEST_F(ApiServerTest, ChatCompletionShapeAndUsage) {
  start();
  json body = chat_body("Hello there", 5);
  body["temperature"] = 0;
  body["seed"] = 7;
  body["top_k"] = 3;
  auto reply = post("/v1/chat/completions", body);
  ASSERT_EQ(reply.status, 200) << reply.body.dump();

  const auto request = generator_->last_request();
  EXPECT_EQ(request.prompt, chat_prompt("Hello there"));
  EXPECT_EQ(request.max_tokens, 5);
  EXPECT_EQ(request.sampling.temperature, 0.0f);
  EXPECT_EQ(request.sampling.seed, 7u);
  EXPECT_EQ(request.sampling.top_k, 3);
  EXPECT_FALSE(request.logprobs);  // not asked: the engine skips the log-softmax

  const json& r = reply.body;
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_GT(r["id"].get<std::string>().size(), 20u);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_NEAR(r["created"].get<double>(), double(std::time(nullptr)), 60);
  EXPECT_EQ(r["model"], kModel);
  ASSERT_EQ(r["choices"].size(), 1u);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], expected_text(request.prompt, 5));
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_TRUE(choice["logprobs"].is_null());
  const int prompt_tokens = int(request.prompt.size());
  EXPECT_EQ(r["usage"], json({{"prompt_tokens", prompt_tokens},
                              {"completion_tokens", 5},
                              {"total_tokens", prompt_tokens + 5},
                              {"prompt_tokens_details", {{"cached_tokens", 0}}},
                              {"completion_tokens_details",
                               {{"reasoning_tokens", 0},
                                {"accepted_prediction_tokens", 0},
                                {"rejected_prediction_tokens", 0}}}}));
}

TEST_F(ApiServerTest, CompletionShapeWithoutModelField) {
  start();
  auto reply = post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 4}});
  ASSERT_EQ(reply.status, 200) << reply.body.dump();
  const auto request = generator_->last_request();
  EXPECT_EQ(request.prompt, completion_prompt_tokens(*tokenizer_, "Once upon a time"));
  const json& r = reply.body;
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], kModel);
  EXPECT_EQ(r["choices"][0]["text"], expected_text(request.prompt, 4));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], request.prompt.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 4);

  auto as_array =
      post("/v1/completions", json{{"prompt", {"Once upon a time"}}, {"max_tokens", 4}});
  EXPECT_EQ(as_array.body["choices"][0]["text"], r["choices"][0]["text"]);
}

TEST_F(ApiServerTest, ContentPartsReadLikeAString) {
  start();
  auto plain = post("/v1/chat/completions", chat_body("Hello there", 6));
  json parts = chat_body("", 6);
  parts["messages"][0]["content"] = {{{"type", "text"}, {"text", "Hello "}},
                                     {{"type", "text"}, {"text", "there"}}};
  auto from_parts = post("/v1/chat/completions", parts);
  ASSERT_EQ(from_parts.status, 200) << from_parts.body.dump();
  EXPECT_EQ(from_parts.body["choices"][0]["message"], plain.body["choices"][0]["message"]);
}

TEST_F(ApiServerTest, EndOfGenerationFinishesWithStopAndIsNotShown) {
  auto fake = fake_options();
  fake.end_of_generation_at = 3;
  start(fake);
  auto reply = post("/v1/chat/completions", chat_body("Hi", 10));
  ASSERT_EQ(reply.status, 200) << reply.body.dump();
  const auto prompt = generator_->last_request().prompt;
  EXPECT_EQ(reply.body["choices"][0]["message"]["content"], expected_text(prompt, 3));
  EXPECT_EQ(reply.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(reply.body["usage"]["completion_tokens"], 4);  // the end token was generated too
}

TEST_F(ApiServerTest, StreamedChatShape) {
  start();
  json body = chat_body("Tell me a dream", 6);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto events = post_stream("/v1/chat/completions", body);
  ASSERT_GE(events.size(), 4u);
  const auto prompt = generator_->last_request().prompt;

  EXPECT_EQ(events.back(), "[DONE]");
  const json& usage_chunk = events[events.size() - 2];
  EXPECT_EQ(usage_chunk["choices"], json::array());
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 6);
  EXPECT_EQ(usage_chunk["usage"]["total_tokens"], prompt.size() + 6);
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  const std::string id = events[0]["id"];
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(events[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  std::string content;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json& chunk = events[i];
    EXPECT_EQ(chunk["id"], id);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_EQ(chunk["model"], kModel);
    EXPECT_TRUE(chunk.contains("usage") && chunk["usage"].is_null());
    ASSERT_EQ(chunk["choices"].size(), 1u);
    const json& choice = chunk["choices"][0];
    if (i > 0) {
      EXPECT_FALSE(choice["delta"].contains("role"));
    }
    content += choice["delta"].value("content", "");
    bool last = i + 3 == events.size();
    EXPECT_EQ(choice["finish_reason"], last ? json("length") : json(nullptr));
    if (last) {
      EXPECT_EQ(choice["delta"], json::object());
    }
  }
  EXPECT_EQ(content, expected_text(prompt, 6));
}

TEST_F(ApiServerTest, StreamedCompletionShapeWithoutUsage) {
  start();
  auto events = post_stream("/v1/completions",
                            json{{"prompt", "Once upon"}, {"max_tokens", 5}, {"stream", true}});
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["object"], "text_completion");
    EXPECT_FALSE(events[i].contains("usage"));
    ASSERT_EQ(events[i]["choices"].size(), 1u);
    text += events[i]["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(text, expected_text(generator_->last_request().prompt, 5));
}

// The raw body of a streamed response, and the SSE comment lines it began with.
std::pair<std::string, std::vector<std::string>> split_waiting_comments(std::string body) {
  std::vector<std::string> comments;
  while (body.starts_with(":")) {
    const size_t end = body.find("\n\n");
    if (end == std::string::npos) break;
    comments.push_back(body.substr(0, end));
    body = body.substr(end + 2);
  }
  return {body, comments};
}

TEST_F(ApiServerTest, AStreamBeforeTheModelIsReadySaysWhatItWaitsForThenRuns) {
  start();
  generator_->set_waiting_for("layers loading");
  auto reply = std::async(std::launch::async, [&] {
    return client().Post("/v1/completions", json{{"prompt", "Once upon"}, {"max_tokens", 4}, {"stream", true}}.dump(),
                         "application/json");
  });
  // Comments come a second apart: 3 s leaves room for two on a loaded machine.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  EXPECT_FALSE(generator_->wait_for_submissions(1, std::chrono::milliseconds(0))) << "submitted while waiting";
  generator_->set_waiting_for("");
  auto result = reply.get();
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  const auto [events, comments] = split_waiting_comments(result->body);
  ASSERT_GE(comments.size(), 2u) << result->body;
  for (const std::string& c : comments) EXPECT_EQ(c, ": waiting for layers loading");
  std::string text;
  const auto payloads = sse_payloads(events);
  for (const auto& payload : payloads) {
    if (payload != "[DONE]") text += json::parse(payload)["choices"][0].value("text", "");
  }
  EXPECT_EQ(payloads.back(), "[DONE]");
  EXPECT_EQ(text, expected_text(generator_->last_request().prompt, 4));
}

TEST_F(ApiServerTest, AStreamStillWaitingAfterTheStartupWaitEndsWithA503Event) {
  ServerOptions options;
  options.startup_wait = std::chrono::milliseconds(1200);
  start(fake_options(), options);
  generator_->set_waiting_for("a placement");
  auto result = client().Post("/v1/chat/completions",
                              json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"stream", true}}.dump(),
                              "application/json");
  ASSERT_TRUE(result);
  const auto [events, comments] = split_waiting_comments(result->body);
  EXPECT_GE(comments.size(), 1u) << result->body;
  const auto payloads = sse_payloads(events);
  ASSERT_EQ(payloads.size(), 1u) << result->body;
  const json error = json::parse(payloads[0])["error"];
  EXPECT_EQ(error["code"], "model_unavailable") << error.dump();
  EXPECT_NE(error["message"].get<std::string>().find("a placement"), std::string::npos) << error.dump();
  EXPECT_FALSE(generator_->wait_for_submissions(1, std::chrono::milliseconds(0)));
}

TEST_F(ApiServerTest, StopStringSpanningTokensIsRemoved) {
  start();
  const auto prompt = chat_prompt("Stop somewhere");
  const auto tokens = generator_->tokens_for(prompt, 12);
  // A stop string made of the end of token 4's text and the start of token 5's.
  const std::string before = decode(std::span(tokens).first(5));
  const std::string after = decode(std::span(tokens).first(6));
  const std::string stop = after.substr(before.size() - 2, 4);
  const std::string full = decode(tokens);
  const std::string expected = full.substr(0, full.find(stop));
  int tokens_until_stop = 1;
  while (decode(std::span(tokens).first(tokens_until_stop)).find(stop) == std::string::npos) {
    ++tokens_until_stop;
  }

  json body = chat_body("Stop somewhere", 12);
  body["stop"] = {"zzzzqqq", stop};
  auto reply = post("/v1/chat/completions", body);
  ASSERT_EQ(reply.status, 200) << reply.body.dump();
  EXPECT_EQ(reply.body["choices"][0]["message"]["content"], expected);
  EXPECT_EQ(reply.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(reply.body["usage"]["completion_tokens"], tokens_until_stop);
  EXPECT_TRUE(generator_->wait_for_refusal(std::chrono::seconds(5)));

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto events = post_stream("/v1/chat/completions", body);
  ASSERT_GE(events.size(), 3u);
  std::string streamed;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    streamed += events[i]["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(events[events.size() - 3]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[events.size() - 2]["usage"]["completion_tokens"], tokens_until_stop);
}

TEST_F(ApiServerTest, ChatLogprobs) {
  start();
  json body = chat_body("Numbers", 4);
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  auto reply = post("/v1/chat/completions", body);
  ASSERT_EQ(reply.status, 200) << reply.body.dump();
  const auto request = generator_->last_request();
  EXPECT_TRUE(request.logprobs);
  EXPECT_EQ(request.top_logprobs, 2);
  const auto tokens = generator_->tokens_for(request.prompt, 4);
  const json& content = reply.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const std::string piece = tokenizer_->token_piece(tokens[i]);
    EXPECT_EQ(content[i]["token"], piece);
    EXPECT_FLOAT_EQ(content[i]["logprob"].get<float>(), FakeGenerator::logprob_at(i));
    EXPECT_EQ(content[i]["bytes"], json(std::vector<int>(piece.begin(), piece.end())));
    ASSERT_EQ(content[i]["top_logprobs"].size(), 2u);
    EXPECT_EQ(content[i]["top_logprobs"][0]["token"], piece);
  }
}

TEST_F(ApiServerTest, CompletionLogprobs) {
  start();
  auto reply =
      post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 3}, {"logprobs", 1}});
  ASSERT_EQ(reply.status, 200) << reply.body.dump();
  const json& logprobs = reply.body["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 3u);
  ASSERT_EQ(logprobs["token_logprobs"].size(), 3u);
  ASSERT_EQ(logprobs["top_logprobs"].size(), 3u);
  ASSERT_EQ(logprobs["text_offset"].size(), 3u);
  std::string rebuilt;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(logprobs["text_offset"][i], rebuilt.size());
    rebuilt += logprobs["tokens"][i].get<std::string>();
    EXPECT_EQ(logprobs["top_logprobs"][i].size(), 1u);
  }
  EXPECT_EQ(rebuilt, reply.body["choices"][0]["text"]);
}

TEST_F(ApiServerTest, BadRequestsGetOpenAiErrors) {
  start();
  struct Case {
    std::string path, body;
    int status;
    std::string param, code;
  };
  const std::string chat = "/v1/chat/completions", completions = "/v1/completions";
  const std::string user = R"("messages":[{"role":"user","content":"hi"}])";
  const std::vector<Case> cases = {
      {chat, "{", 400, "", "invalid_json"},
      {chat, "[1,2]", 400, "", "invalid_json"},
      {chat, "", 400, "", "invalid_json"},
      {chat, R"({"model":")" + kModel + "\"}", 400, "messages", "missing_required_parameter"},
      {chat, R"({"messages":"hi"})", 400, "messages", "invalid_type"},
      {chat, R"({"messages":[]})", 400, "messages", "invalid_value"},
      {chat, R"({"messages":[{"content":"hi"}]})", 400, "messages[0].role",
       "missing_required_parameter"},
      {chat, R"({"messages":[{"role":"function","content":"x"}]})", 400, "messages[0].role",
       "unsupported_parameter"},
      {chat, R"({"messages":[{"role":"user","content":5}]})", 400, "messages[0].content",
       "invalid_type"},
      {chat, R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       400, "messages[0].content[0]", "unsupported_parameter"},
      {chat, "{" + user + R"(,"max_tokens":"5"})", 400, "max_tokens", "invalid_type"},
      {chat, "{" + user + R"(,"max_tokens":0})", 400, "max_tokens", "invalid_value"},
      {chat, "{" + user + R"(,"max_tokens":2.5})", 400, "max_tokens", "invalid_type"},
      {chat, "{" + user + R"(,"temperature":3})", 400, "temperature", "invalid_value"},
      {chat, "{" + user + R"(,"temperature":"hot"})", 400, "temperature", "invalid_type"},
      {chat, "{" + user + R"(,"top_p":true})", 400, "top_p", "invalid_type"},
      {chat, "{" + user + R"(,"stream":"yes"})", 400, "stream", "invalid_type"},
      {chat, "{" + user + R"(,"stop":["a","b","c","d","e"]})", 400, "stop", "invalid_value"},
      {chat, "{" + user + R"(,"stop":[1]})", 400, "stop[0]", "invalid_type"},
      {chat, "{" + user + R"(,"n":2})", 400, "n", "unsupported_parameter"},
      {chat, "{" + user + R"(,"logprobs":true,"top_logprobs":21})", 400, "top_logprobs",
       "invalid_value"},
      {chat, "{" + user + R"(,"top_logprobs":2})", 400, "top_logprobs", "invalid_value"},
      {chat, "{" + user + R"(,"stream_options":{"include_usage":true}})", 400, "stream_options",
       "invalid_value"},
      {chat, "{" + user + R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"pattern":"a"}}}})", 400,
       "response_format.json_schema.schema", "invalid_value"},
      {chat, "{" + user + R"(,"frobnicate":1})", 400, "frobnicate", "unknown_parameter"},
      {chat, "{" + user + R"(,"model":"gpt-4o"})", 404, "model", "model_not_found"},
      {chat, "{" + user + R"(,"model":7})", 400, "model", "invalid_type"},
      {completions, R"({"max_tokens":3})", 400, "prompt", "missing_required_parameter"},
      {completions, R"({"prompt":[1,2,3]})", 400, "prompt", "unsupported_parameter"},
      {completions, R"({"prompt":"x","echo":true})", 400, "echo", "unsupported_parameter"},
      {completions, R"({"prompt":"x","logprobs":true})", 400, "logprobs", "invalid_type"},
      {completions, R"({"prompt":"x","messages":[]})", 400, "messages", "unknown_parameter"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body);
    expect_error(post(c.path, c.body), c.status, c.param, c.code);
  }
}

TEST_F(ApiServerTest, HarmlessFieldsAndNullsAreAccepted) {
  start();
  json body = chat_body("Hi", 2);
  body["user"] = "someone";
  body["store"] = false;
  body["n"] = 1;
  body["logit_bias"] = json::object();
  body["response_format"] = {{"type", "text"}};
  body["temperature"] = nullptr;
  body["stop"] = nullptr;
  body["max_completion_tokens"] = 3;
  auto reply = post("/v1/chat/completions", body);
  ASSERT_EQ(reply.status, 200) << reply.body.dump();
  EXPECT_EQ(reply.body["usage"]["completion_tokens"], 3);
}

TEST_F(ApiServerTest, PromptAndCompletionOverTheContextAre400WithCounts) {
  start();
  auto reply = post("/v1/chat/completions", chat_body("Hello", 120));
  expect_error(reply, 400, "messages", "context_length_exceeded");
  const int prompt_tokens = int(chat_prompt("Hello").size());
  const std::string message = reply.body["error"]["message"];
  EXPECT_NE(message.find("128"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(prompt_tokens + 120)), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(prompt_tokens) + " in the messages"), std::string::npos)
      << message;

  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "word ";
  expect_error(post("/v1/completions", json{{"prompt", long_prompt}}), 400, "prompt",
               "context_length_exceeded");

  // Without max_tokens the completion may use the rest of the context.
  auto fits = post("/v1/completions", json{{"prompt", "Once"}});
  ASSERT_EQ(fits.status, 200) << fits.body.dump();
  EXPECT_EQ(generator_->last_request().max_tokens + generator_->last_request().prompt.size(), 128u);
}

// Megabytes of text are refused by their size, without tokenizing them.
TEST_F(ApiServerTest, AHugePromptIsRefusedBeforeTokenizing) {
  start();
  const std::string huge(size_t{4} << 20, 'a');
  auto reply = post("/v1/completions", json{{"prompt", huge}, {"max_tokens", 1}});
  expect_error(reply, 400, "prompt", "context_length_exceeded");
  EXPECT_NE(reply.body["error"]["message"].get<std::string>().find(std::to_string(huge.size()) + " bytes"),
            std::string::npos) << reply.body.dump();
  reply = post("/api/chat", json{{"messages", {{{"role", "user"}, {"content", huge}}}}, {"stream", false}});
  EXPECT_EQ(reply.status, 400) << reply.body.dump();
}

TEST_F(ApiServerTest, BodyTooLargeIs413) {
  ServerOptions options;
  options.limits.max_body_bytes = 1024;
  start(fake_options(), options);
  json body = chat_body(std::string(4096, 'a'), 2);
  expect_error(post("/v1/chat/completions", body), 413, "", "request_too_large");
}

TEST_F(ApiServerTest, ApiKeyIsRequiredWhenSet) {
  ServerOptions options;
  options.api_key = "sesame";
  start(fake_options(), options);
  const std::string body = chat_body("Hi", 2).dump();
  expect_error(post("/v1/chat/completions", body), 401, "", "invalid_api_key");
  expect_error(post("/v1/chat/completions", body, {{"Authorization", "Bearer sesamf"}}), 401, "",
               "invalid_api_key");
  expect_error(post("/v1/chat/completions", body, {{"Authorization", "sesame"}}), 401, "",
               "invalid_api_key");
  EXPECT_EQ(post("/v1/chat/completions", body, {{"Authorization", "Bearer sesame"}}).status, 200);
  // RFC 7235: the scheme is case-insensitive.
  EXPECT_EQ(post("/v1/chat/completions", body, {{"Authorization", "bearer sesame"}}).status, 200);
  EXPECT_EQ(post("/v1/chat/completions", body, {{"Authorization", "BEARER  sesame"}}).status, 200);
  expect_error(post("/v1/chat/completions", body, {{"Authorization", "Basic sesame"}}), 401, "",
               "invalid_api_key");
  expect_error(post("/v1/chat/completions", body, {{"Authorization", "Bearersesame"}}), 401, "",
               "invalid_api_key");
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/v1/models").status, 401);
}

TEST_F(ApiServerTest, AnEmptyApiKeyIsRefused) {
  ServerOptions options;
  options.api_key = "";
  EXPECT_THROW(start(fake_options(), options), std::invalid_argument);
}

TEST_F(ApiServerTest, FullQueueIs429) {
  auto fake = fake_options();
  fake.queue_full = true;
  start(fake);
  auto reply = post("/v1/chat/completions", chat_body("Hi", 2));
  expect_error(reply, 429, "", "queue_full");
  EXPECT_EQ(reply.body["error"]["type"], "rate_limit_error");
  json streamed = chat_body("Hi", 2);
  streamed["stream"] = true;
  expect_error(post("/v1/chat/completions", streamed), 429, "", "queue_full");
}

TEST_F(ApiServerTest, ClosingTheStreamStopsTheGeneration) {
  auto fake = fake_options();
  fake.token_delay = std::chrono::milliseconds(50);
  start(fake);
  json body = chat_body("A long story", 60);  // 3 s unless the hang-up stops it
  body["stream"] = true;
  auto c = client();
  EXPECT_EQ(testing::post_and_hang_up(c, "/v1/chat/completions", body.dump(), 3), 3);
  EXPECT_TRUE(generator_->wait_for_refusal(std::chrono::seconds(10)));
}

// Without streaming nothing is written until the end, so the server must notice the closed
// connection itself.
TEST_F(ApiServerTest, AClientThatGivesUpOnAWholeAnswerStopsTheGeneration) {
  auto fake = fake_options();
  fake.token_delay = std::chrono::milliseconds(50);
  start(fake);
  auto c = client();
  c.set_read_timeout(std::chrono::milliseconds(300));  // then the client closes the connection
  const auto result = c.Post("/v1/chat/completions", chat_body("A long story", 60).dump(), "application/json");
  EXPECT_FALSE(result) << "the answer should have taken 3 s: " << (result ? result->body : "");
  EXPECT_TRUE(generator_->wait_for_refusal(std::chrono::seconds(5)));
}

TEST_F(ApiServerTest, SixteenParallelRequestsAllComplete) {
  auto fake = fake_options();
  fake.token_delay = std::chrono::milliseconds(2);
  start(fake);
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < 16; ++i) {
    replies.push_back(std::async(std::launch::async, [this, i] {
      return post("/v1/chat/completions", chat_body("request " + std::to_string(i), 8));
    }));
  }
  for (int i = 0; i < 16; ++i) {
    Reply reply = replies[i].get();
    ASSERT_EQ(reply.status, 200) << reply.body.dump();
    const auto prompt = chat_prompt("request " + std::to_string(i));
    EXPECT_EQ(reply.body["choices"][0]["message"]["content"], expected_text(prompt, 8));
    EXPECT_EQ(reply.body["usage"]["prompt_tokens"], prompt.size());
  }
}

TEST_F(ApiServerTest, StopEndsInFlightRequestsWithoutHanging) {
  auto fake = fake_options();
  fake.token_delay = std::chrono::milliseconds(50);
  start(fake);
  auto whole = std::async(std::launch::async,
                          [this] { return post("/v1/chat/completions", chat_body("Slow", 60)); });
  auto streamed = std::async(std::launch::async, [this] {
    json body = chat_body("Slow stream", 60);
    body["stream"] = true;
    auto result = client().Post("/v1/chat/completions", body.dump(), "application/json");
    return result ? result->body : std::string();
  });
  // Both in flight, however slowly this machine got them there (a fixed wait was not always enough).
  ASSERT_TRUE(generator_->wait_for_submissions(2, std::chrono::seconds(10)));
  const auto began = std::chrono::steady_clock::now();
  server_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(10));
  expect_error(whole.get(), 503, "", "generation_failed");
  const std::string stream_body = streamed.get();
  EXPECT_NE(stream_body.find(R"("error")"), std::string::npos) << stream_body;
  EXPECT_EQ(stream_body.find("[DONE]"), std::string::npos) << stream_body;
}

TEST_F(ApiServerTest, OllamaTags) {
  start();
  auto tags = get("/api/tags");
  ASSERT_EQ(tags.status, 200);
  ASSERT_EQ(tags.body["models"].size(), 1u);
  EXPECT_EQ(tags.body["models"][0]["name"], kModel);
  EXPECT_EQ(tags.body["models"][0]["model"], kModel);
}

ModelFacts example_facts() {
  ModelFacts facts;
  facts.digest = "00ff";
  facts.size_bytes = 1234;
  facts.architecture = "llama";
  facts.parameter_size = "263.7K";
  facts.quantization_level = "F32";
  facts.model_info_json = R"({"llama.block_count":4})";
  return facts;
}

TEST_F(ApiServerTest, OllamaModelDescriptions) {
  ServerOptions options;
  options.model_facts = example_facts();
  start(fake_options(), options);
  for (const char* path : {"/api/tags", "/api/ps"}) {
    const auto listed = get(path);
    ASSERT_EQ(listed.status, 200) << path;
    const json& entry = listed.body["models"][0];
    EXPECT_EQ(entry["name"], kModel) << path;
    EXPECT_EQ(entry["digest"], "00ff") << path;
    EXPECT_EQ(entry["size"], 1234) << path;
    EXPECT_EQ(entry["details"]["family"], "llama") << path;
    EXPECT_EQ(entry["details"]["parameter_size"], "263.7K") << path;
    EXPECT_EQ(entry["details"]["quantization_level"], "F32") << path;
  }
  EXPECT_EQ(get("/api/ps").body["models"][0]["context_length"], generator_->limits().context_size);

  const auto shown = post("/api/show", json{{"model", kModel}});
  ASSERT_EQ(shown.status, 200);
  EXPECT_EQ(shown.body["model_info"]["llama.block_count"], 4);
  EXPECT_EQ(shown.body["details"]["family"], "llama");
  EXPECT_EQ(shown.body["template"], "");
  EXPECT_EQ(shown.body["capabilities"], json::array({"completion"}));
  EXPECT_EQ(post("/api/show", json{{"name", kModel}}).status, 200);
  const auto other = post("/api/show", json{{"model", "other"}});
  EXPECT_EQ(other.status, 404);
  EXPECT_TRUE(other.body["error"].is_string());
  EXPECT_EQ(post("/api/show", json{{"model", kModel}, {"unknown", 1}}).status, 400);

  const auto version = get("/api/version");
  ASSERT_EQ(version.status, 200);
  EXPECT_EQ(version.body["version"], std::string(kVersion));
}

TEST_F(ApiServerTest, OllamaChatWhole) {
  start();
  json body = {
      {"model", kModel},
      {"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
      {"stream", false},
      {"keep_alive", "5m"},
      {"options", {{"num_predict", 5}, {"temperature", 0}, {"seed", 3}, {"num_ctx", 4096}}}};
  auto reply = post("/api/chat", body);
  ASSERT_EQ(reply.status, 200) << reply.body.dump();
  const auto request = generator_->last_request();
  EXPECT_EQ(request.prompt, chat_prompt("Hello there"));
  EXPECT_EQ(request.sampling.temperature, 0.0f);
  EXPECT_EQ(request.sampling.seed, 3u);
  const json& r = reply.body;
  EXPECT_EQ(r["model"], kModel);
  EXPECT_TRUE(r["created_at"].is_string());
  EXPECT_EQ(r["message"],
            json({{"role", "assistant"}, {"content", expected_text(request.prompt, 5)}}));
  EXPECT_EQ(r["done"], true);
  EXPECT_EQ(r["done_reason"], "length");
  EXPECT_EQ(r["prompt_eval_count"], request.prompt.size());
  EXPECT_EQ(r["eval_count"], 5);
  EXPECT_TRUE(r["total_duration"].is_number_integer());
}

// Prompt evaluation lasts until the first token, evaluation from there to the end.
TEST_F(ApiServerTest, OllamaWholeAnswerTimings) {
  auto fake = fake_options();
  fake.token_delay = std::chrono::milliseconds(30);
  start(fake);
  json body = {{"prompt", "Time it"}, {"stream", false}, {"options", {{"num_predict", 5}}}};
  auto reply = post("/api/generate", body);
  ASSERT_EQ(reply.status, 200) << reply.body.dump();
  const int64_t total = reply.body["total_duration"], eval = reply.body["eval_duration"],
                prompt_eval = reply.body["prompt_eval_duration"];
  EXPECT_GE(eval, 4 * 30'000'000) << reply.body.dump();  // four delays after the first token
  EXPECT_GE(prompt_eval, 30'000'000) << reply.body.dump();
  EXPECT_EQ(prompt_eval + eval, total) << reply.body.dump();
}

TEST_F(ApiServerTest, OllamaChatStreamsNdjsonByDefault) {
  start();
  json body = {{"messages", {{{"role", "user"}, {"content", "Stream it"}}}},
               {"options", {{"num_predict", 6}}}};
  auto result = client().Post("/api/chat", body.dump(), "application/json");
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(result->get_header_value("Content-Type"), "application/x-ndjson");
  std::vector<json> lines;
  std::istringstream stream(result->body);
  for (std::string line; std::getline(stream, line);) lines.push_back(json::parse(line));
  ASSERT_GE(lines.size(), 2u);
  std::string content;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["done"], i + 1 == lines.size());
    content += lines[i]["message"]["content"].get<std::string>();
  }
  const auto prompt = generator_->last_request().prompt;
  EXPECT_EQ(content, expected_text(prompt, 6));
  EXPECT_EQ(lines.back()["done_reason"], "length");
  EXPECT_EQ(lines.back()["eval_count"], 6);
}

TEST_F(ApiServerTest, OllamaGenerateUsesTheTemplateUnlessRaw) {
  start();
  auto templated = post("/api/generate", json{{"prompt", "Hello"},
                                              {"system", "Be brief."},
                                              {"stream", false},
                                              {"options", {{"num_predict", 3}}}});
  ASSERT_EQ(templated.status, 200) << templated.body.dump();
  const std::vector<ChatMessage> messages{{"system", "Be brief."}, {"user", "Hello"}};
  const auto prompt = chatml_prompt_tokens(*tokenizer_, messages);
  EXPECT_EQ(generator_->last_request().prompt, prompt);
  EXPECT_EQ(templated.body["response"], expected_text(prompt, 3));
  EXPECT_EQ(templated.body["done"], true);

  auto raw = post("/api/generate", json{{"prompt", "Once upon"},
                                        {"raw", true},
                                        {"stream", false},
                                        {"options", {{"num_predict", 3}}}});
  ASSERT_EQ(raw.status, 200) << raw.body.dump();
  EXPECT_EQ(generator_->last_request().prompt, completion_prompt_tokens(*tokenizer_, "Once upon"));
}

TEST_F(ApiServerTest, OllamaErrorsUseItsShape) {
  start();
  struct Case {
    std::string path, body;
    int status;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {"/api/chat", "{", 400, "JSON"},
      {"/api/chat", R"({"stream":false})", 400, "messages"},
      {"/api/chat", R"({"messages":[{"role":"user","content":"x","images":["aGk="]}]})", 400,
       "images"},
      {"/api/chat", R"({"messages":[{"role":"user","content":"x"}],"format":"yaml"})", 400,
       "format"},
      {"/api/chat", R"({"messages":[{"role":"user","content":"x"}],"options":{"mirostat":2}})", 400,
       "options.mirostat"},
      {"/api/chat", R"({"messages":[{"role":"user","content":"x"}],"options":{"num_predict":"5"}})",
       400, "options.num_predict"},
      {"/api/generate", R"({"prompt":"x","model":"llama3"})", 404, "llama3"},
      {"/api/generate", R"({"raw":true})", 400, "prompt"},
      {"/api/generate", R"({"prompt":"x","frobnicate":1})", 400, "frobnicate"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body);
    auto reply = post(c.path, c.body);
    EXPECT_EQ(reply.status, c.status);
    ASSERT_TRUE(reply.body.is_object() && reply.body["error"].is_string()) << reply.body.dump();
    EXPECT_NE(reply.body["error"].get<std::string>().find(c.mentions), std::string::npos)
        << reply.body.dump();
  }
}

TEST_F(ApiServerTest, BrokenUtf8FromTheModelStillGivesValidJson) {
  auto fake = fake_options();
  fake.vocabulary.clear();
  for (int token = 0; token < tokenizer_->vocab_size(); ++token) {
    const std::string piece = tokenizer_->token_piece(token);
    if (piece.size() == 1 && static_cast<unsigned char>(piece[0]) >= 0x80)
      fake.vocabulary.push_back(token);
  }
  ASSERT_FALSE(fake.vocabulary.empty());
  start(fake);
  json body = chat_body("Bytes", 20);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  auto whole = post("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200);
  ASSERT_TRUE(whole.body.is_object());
  EXPECT_EQ(whole.body["choices"][0]["logprobs"]["content"].size(), 20u);
  body["stream"] = true;
  auto events = post_stream("/v1/chat/completions", body);
  EXPECT_EQ(events.back(), "[DONE]");
}

// Hostile and careless clients (issue 12). Raw connections send what an HTTP library would not.

using testing::RawConnection;
using testing::raw_status;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous for a loaded 2-core machine; the server's own deadlines in these tests are 1 s.
constexpr milliseconds kPromptly{5000};

std::string raw_request(const std::string& method, const std::string& path, const std::string& body,
                        const std::string& extra_headers = "") {
  return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// Sends one byte every 200 ms until the server closes the connection or `give_up` passes.
bool trickle_until_closed(RawConnection& connection, milliseconds give_up) {
  const auto until = std::chrono::steady_clock::now() + give_up;
  while (std::chrono::steady_clock::now() < until) {
    if (!connection.send("x") || connection.closed_within(milliseconds(200))) return true;
  }
  return false;
}

TEST_F(ApiServerTest, ASlowHeaderIsCutOffAtItsDeadline) {
  ServerOptions options;
  options.limits.header_timeout = seconds(1);
  start(fake_options(), options);
  RawConnection slow(server_->port());
  ASSERT_TRUE(slow.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
  EXPECT_TRUE(trickle_until_closed(slow, seconds(8)));
}

TEST_F(ApiServerTest, ASlowBodyIsCutOffAtItsDeadline) {
  ServerOptions options;
  options.limits.body_timeout = seconds(1);
  start(fake_options(), options);
  RawConnection slow(server_->port());
  ASSERT_TRUE(slow.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        "Content-Length: 1000\r\n\r\n{"));
  EXPECT_TRUE(trickle_until_closed(slow, seconds(8)));
}

// 200 connections that send half a header or nothing at all, from the same address as everyone.
TEST_F(ApiServerTest, SlowAndSilentConnectionsDoNotDelayOthers) {
  start();
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server_->port()));
    if (i % 2 == 0) idle.back()->send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX: ");
  }
  const auto began = std::chrono::steady_clock::now();
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(post("/v1/chat/completions", chat_body("Still here?", 4)).status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - began, kPromptly);
}

TEST_F(ApiServerTest, ConnectionsPerClientAreCapped) {
  ServerOptions options;
  options.limits.max_connections_per_client = 8;
  start(fake_options(), options);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(std::make_unique<RawConnection>(server_->port()));
  EXPECT_EQ(get("/health").status, 200);  // takes the place of the oldest idle one
  int closed = 0;
  for (auto& connection : idle) closed += connection->closed_within(milliseconds(100));
  EXPECT_GE(closed, 20 - 8 + 1);
}

// When every connection of a client is busy with an answer, a new one is refused, not queued.
TEST_F(ApiServerTest, ConnectionsBeyondTheCapWhileAllAreAnsweringGet503) {
  auto fake = fake_options();
  fake.token_delay = milliseconds(50);
  ServerOptions options;
  options.limits.max_connections_per_client = 1;
  start(fake, options);
  auto busy = std::async(std::launch::async,
                         [this] { return post("/v1/chat/completions", chat_body("Slow", 60)); });
  ASSERT_TRUE(generator_->wait_for_submissions(1, seconds(10)));
  RawConnection refused(server_->port());
  const std::string answer = refused.read_until_closed(seconds(10));
  EXPECT_EQ(raw_status(answer), 503) << answer;
  EXPECT_NE(answer.find("Retry-After: 1"), std::string::npos) << answer;
  EXPECT_EQ(busy.get().status, 200);
}

TEST_F(ApiServerTest, TheBodyLimitHoldsForChunkedBodies) {
  ServerOptions options;
  options.limits.max_body_bytes = 1024;
  start(fake_options(), options);
  const auto chunked = [&](const std::string& body) {
    std::string request =
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n";
    for (size_t at = 0; at < body.size(); at += 100) {
      const std::string piece = body.substr(at, 100);
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
      request += size + piece + "\r\n";
    }
    RawConnection connection(server_->port());
    connection.send(request + "0\r\n\r\n");
    return connection.read_until_closed(seconds(10));
  };
  const std::string fits = json{{"prompt", "Once"}, {"max_tokens", 2}}.dump();
  EXPECT_EQ(raw_status(chunked(fits)), 200);
  const std::string over = json{{"prompt", std::string(4096, 'a')}}.dump();
  const std::string refused = chunked(over);
  EXPECT_EQ(raw_status(refused), 413) << refused;
  EXPECT_NE(refused.find("request_too_large"), std::string::npos) << refused;
}

TEST_F(ApiServerTest, CompressedBodiesAre415) {
  start();
  RawConnection connection(server_->port());
  connection.send(raw_request("POST", "/v1/completions", std::string("\x1f\x8b\x08\x00", 4),
                              "Content-Encoding: gzip\r\n"));
  const std::string answer = connection.read_until_closed(seconds(10));
  EXPECT_EQ(raw_status(answer), 415) << answer;
  EXPECT_NE(answer.find("unsupported_media_type"), std::string::npos) << answer;
}

TEST_F(ApiServerTest, HeaderFloodsAre431) {
  start();
  const auto flood = [&](int fields, const std::string& field) {
    std::string request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    for (int i = 0; i < fields; ++i) request += field;
    RawConnection connection(server_->port());
    connection.send(request + "\r\n");
    return connection.read_until_closed(seconds(10));
  };
  EXPECT_EQ(raw_status(flood(3000, "X-Flood: 1234567890\r\n")), 431);  // too many bytes
  EXPECT_EQ(raw_status(flood(150, "X: y\r\n")), 431);                 // too many fields
  EXPECT_EQ(raw_status(flood(20, "X: y\r\n")), 200);
}

TEST_F(ApiServerTest, TwoDifferentContentLengthsAre400) {
  start();
  RawConnection connection(server_->port());
  connection.send(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
      "Content-Length: 30\r\n\r\n{}");
  EXPECT_EQ(raw_status(connection.read_until_closed(seconds(10))), 400);
}

TEST_F(ApiServerTest, PipelinedRequestsAreAnsweredInOrder) {
  start();
  RawConnection connection(server_->port());
  connection.send(
      "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
      "GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
      "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  const std::string answers = connection.read_until_closed(seconds(10));
  const size_t health = answers.find(R"({"status":"ok"})");
  const size_t tags = answers.find(R"({"models")");
  const size_t models = answers.find(R"("object":"list")");
  ASSERT_NE(health, std::string::npos) << answers;
  ASSERT_NE(tags, std::string::npos) << answers;
  ASSERT_NE(models, std::string::npos) << answers;
  EXPECT_LT(health, tags);
  EXPECT_LT(tags, models);
}

TEST_F(ApiServerTest, RangeIsIgnored) {
  start();
  auto whole = post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 3}}.dump(),
                    {{"Range", "bytes=0-5"}});
  EXPECT_EQ(whole.status, 200);
  EXPECT_TRUE(whole.body.is_object()) << whole.body.dump();
  auto result = client().Post("/v1/completions", {{"Range", "bytes=0-5"}},
                              json{{"prompt", "Once"}, {"max_tokens", 3}, {"stream", true}}.dump(),
                              "application/json");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  EXPECT_NE(result->body.find("[DONE]"), std::string::npos) << result->body;
}

// A page on another site that rebinds its name to 127.0.0.1 sends its own name as Host.
TEST_F(ApiServerTest, OnlyKnownHostNamesAreAnswered) {
  ServerOptions options;
  options.host_names = {"strata.lan"};
  start(fake_options(), options);
  const auto status_for = [&](const std::string& host) {
    RawConnection connection(server_->port());
    connection.send("GET /health HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n");
    return raw_status(connection.read_until_closed(seconds(10)));
  };
  EXPECT_EQ(status_for("evil.example"), 403);
  EXPECT_EQ(status_for("evil.example:8080"), 403);
  EXPECT_EQ(status_for("127.0.0.1:8080"), 200);
  EXPECT_EQ(status_for("localhost:8080"), 200);
  EXPECT_EQ(status_for("[::1]:8080"), 200);
  EXPECT_EQ(status_for("STRATA.LAN:8080"), 200);
}

TEST_F(ApiServerTest, NoCorsHeadersUnlessConfigured) {
  start();
  auto plain = client().Get("/health", {{"Origin", "http://app.example"}});
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->has_header("Access-Control-Allow-Origin"));
}

TEST_F(ApiServerTest, ConfiguredCorsOriginsAreAllowed) {
  ServerOptions options;
  options.cors_origins = {"http://app.example"};
  options.api_key = "sesame";
  start(fake_options(), options);
  auto allowed = client().Get("/health", {{"Origin", "http://app.example"}});
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  auto other = client().Get("/health", {{"Origin", "http://other.example"}});
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  // Browsers send the preflight without the key.
  auto preflight = client().Options("/v1/chat/completions",
                                    {{"Origin", "http://app.example"},
                                     {"Access-Control-Request-Method", "POST"},
                                     {"Access-Control-Request-Headers", "authorization"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Authorization"),
            std::string::npos);
}

TEST_F(ApiServerTest, AFullQueueSaysWhenToRetry) {
  auto fake = fake_options();
  fake.queue_full = true;
  start(fake);
  auto result = client().Post("/v1/chat/completions", chat_body("Hi", 2).dump(), "application/json");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 429);
  EXPECT_EQ(result->get_header_value("Retry-After"), "1");
}

// curl -d sends form encoding; Ollama reads any body as JSON, and so does Strata.
TEST_F(ApiServerTest, AnyContentTypeIsReadAsJson) {
  auto fake = fake_options();
  fake.limits.context_size = 1 << 16;
  start(fake);
  std::string prompt;
  while (prompt.size() < 20000) prompt += "dream ";
  auto reply = post("/api/generate",
                    json{{"prompt", prompt}, {"stream", false}, {"options", {{"num_predict", 2}}}}.dump(),
                    {{"Content-Type", "application/x-www-form-urlencoded"}});
  EXPECT_EQ(reply.status, 200) << reply.body.dump();
}

// A stream whose client leaves while it waits in the queue gives its place up at once, not when
// the engine would have reached it.
TEST_F(ApiServerTest, ADroppedQueuedStreamFreesItsPlaceAtOnce) {
  auto fake = fake_options();
  fake.limits = {1024, 1, 1};
  fake.token_delay = milliseconds(50);
  start(fake);
  auto busy = std::async(std::launch::async,
                         [this] { return post("/v1/chat/completions", chat_body("Busy", 120)); });
  ASSERT_TRUE(generator_->wait_for_running(1, seconds(10)));  // so that the next one queues
  {
    RawConnection queued(server_->port());
    json body = chat_body("Queued", 4);
    body["stream"] = true;
    queued.send(raw_request("POST", "/v1/chat/completions", body.dump()));
    const std::string start = queued.read_until_closed(seconds(1));
    EXPECT_EQ(raw_status(start), 200) << start;
    ASSERT_TRUE(generator_->wait_for_submissions(2, seconds(10)));
  }  // the client goes away
  EXPECT_TRUE(generator_->wait_for_queue_drop(seconds(5)));
  EXPECT_EQ(busy.wait_for(milliseconds(0)), std::future_status::timeout) << "the busy request ended first";
  // The freed place takes the next request rather than a 429.
  auto next = std::async(std::launch::async,
                         [this] { return post("/v1/chat/completions", chat_body("Next", 2)); });
  EXPECT_TRUE(generator_->wait_for_submissions(3, seconds(5)));
  server_->stop();
  busy.get();
  EXPECT_NE(next.get().status, 429);
}

TEST_F(ApiServerTest, StopDoesNotWaitForSlowClients) {
  ServerOptions options;
  start(fake_options(), options);
  RawConnection trickling(server_->port()), silent(server_->port()), slow_body(server_->port());
  trickling.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
  slow_body.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{");
  std::atomic<bool> stopped{false};
  std::thread trickle([&] {
    while (!stopped && trickling.send("x")) std::this_thread::sleep_for(milliseconds(100));
  });
  const auto began = std::chrono::steady_clock::now();
  server_->stop();
  stopped = true;
  trickle.join();
  EXPECT_LT(std::chrono::steady_clock::now() - began, seconds(kStopGraceSeconds));
  EXPECT_TRUE(silent.closed_within(seconds(1)));
}

// Before a node has a model, /health says what it waits for and every other request gets a
// 503 saying the same, behind the API key like the server's.
TEST(WaitingServerTest, SaysWhatItWaitsForUntilTheModelIsHere) {
  ServerOptions options;
  options.port = 0;
  options.api_key = "sesame";
  const WaitingServer waiting(options, [] { return std::string("the model's manifest from peer 127.0.0.1:9"); });
  httplib::Client client("127.0.0.1", waiting.port());
  const auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(json::parse(health->body),
            (json{{"status", "waiting"}, {"waiting_for", "the model's manifest from peer 127.0.0.1:9"}}));
  const auto anonymous = client.Post("/v1/completions", R"({"prompt":"hi"})", "application/json");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  const auto completion = client.Post("/v1/completions", {{"Authorization", "Bearer sesame"}}, R"({"prompt":"hi"})",
                                      "application/json");
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->status, 503);
  EXPECT_EQ(completion->get_header_value("Retry-After"), "1");
  const json error = json::parse(completion->body)["error"];
  EXPECT_EQ(error["code"], "model_unavailable");
  EXPECT_NE(error["message"].get<std::string>().find("waiting for the model's manifest from peer 127.0.0.1:9"),
            std::string::npos)
      << error;
}

// Tool calling and reasoning through the API, with Qwen3's real template (Hermes calls, <think>
// reasoning) and a generator that writes a scripted answer.
class ToolCallingTest : public ApiServerTest {
 protected:
  static std::string shared_template(const std::string& name) {
    std::ifstream in(std::string(STRATA_SHARED_DIR) + "/templates/" + name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  void start_with_answer(const std::string& answer, const std::string& chat_template = "Qwen-Qwen3-0.6B.jinja") {
    FakeGenerator::Options fake = fake_options();
    fake.limits.context_size = 4096;  // the template's tool instructions are long in these tokens
    fake.script = [answer = tokenizer_->encode(answer, false, false)](auto) { return answer; };
    start(std::move(fake), {}, shared_template(chat_template));
  }

  static json tools() {
    return json::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city, today",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}])");
  }

  static json request(json extra = json::object()) {
    json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                 {"tools", tools()}, {"max_tokens", 1000}, {"seed", 11}};
    for (auto& [key, value] : extra.items()) body[key] = value;
    return body;
  }

  std::string prompt_text() const {
    const auto prompt = generator_->last_request().prompt;
    return decode(prompt);
  }
};

const std::string kThinkAndCall =
    "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

TEST_F(ToolCallingTest, AnswerWithReasoningAndACall) {
  start_with_answer(kThinkAndCall);
  const Reply reply = post("/v1/chat/completions", request());
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json& choice = reply.body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const json& message = choice["message"];
  EXPECT_TRUE(message["content"].is_null()) << message;
  EXPECT_EQ(message["reasoning_content"], "The user wants the weather.");
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  const json& call = message["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_")) << call;
  const json& usage = reply.body["usage"];
  const int reasoning = usage["completion_tokens_details"]["reasoning_tokens"];
  // The reasoning's tokens: at least those of its text, fewer than the whole answer's.
  EXPECT_GE(reasoning, int(tokenizer_->encode("The user wants the weather.", false, false).size()));
  EXPECT_LT(reasoning, usage["completion_tokens"].get<int>());

  // The template was given the tools.
  const std::string prompt = prompt_text();
  EXPECT_NE(prompt.find("The weather in a city, today"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<tools>"), std::string::npos) << prompt;
}

TEST_F(ToolCallingTest, CallIdsFollowTheSeed) {
  start_with_answer(kThinkAndCall);
  auto id = [&](int seed) {
    return post("/v1/chat/completions", request({{"seed", seed}})).body["choices"][0]["message"]["tool_calls"][0]["id"];
  };
  EXPECT_EQ(id(5), id(5));
  EXPECT_NE(id(5), id(6));
}

TEST_F(ToolCallingTest, StreamsReasoningThenTheCallAsOpenAiDoes) {
  start_with_answer(kThinkAndCall);
  const auto events = post_stream("/v1/chat/completions", request({{"stream", true}}));
  ASSERT_GE(events.size(), 4u);
  std::string reasoning, content;
  std::vector<json> call_deltas;
  std::string finish;
  for (const auto& event : events) {
    if (event == "[DONE]") continue;
    const json& choice = event["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls")) call_deltas.push_back(delta["tool_calls"][0]);
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(reasoning, "The user wants the weather.");
  EXPECT_EQ(content, "");  // no markup leaks into the content
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(call_deltas.size(), 2u);
  EXPECT_EQ(call_deltas[0]["index"], 0);
  EXPECT_TRUE(call_deltas[0]["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(call_deltas[0]["type"], "function");
  EXPECT_EQ(call_deltas[0]["function"]["name"], "get_weather");
  EXPECT_EQ(call_deltas[1]["index"], 0);
  EXPECT_FALSE(call_deltas[1].contains("id"));
  EXPECT_EQ(json::parse(call_deltas[1]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
}

TEST_F(ToolCallingTest, ToolChoiceNoneLeavesTheCallAsText) {
  start_with_answer(kThinkAndCall);
  const Reply reply = post("/v1/chat/completions", request({{"tool_choice", "none"}}));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json& choice = reply.body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_NE(choice["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos);
  EXPECT_EQ(choice["message"]["reasoning_content"], "The user wants the weather.");
}

TEST_F(ToolCallingTest, OnlyTheFirstCallWithoutParallelCalls) {
  const std::string second = "\n<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
  start_with_answer(kThinkAndCall + second);
  const Reply both = post("/v1/chat/completions", request());
  ASSERT_EQ(both.status, 200) << both.body;
  EXPECT_EQ(both.body["choices"][0]["message"]["tool_calls"].size(), 2u) << both.body;
  const Reply first = post("/v1/chat/completions", request({{"parallel_tool_calls", false}}));
  ASSERT_EQ(first.status, 200) << first.body;
  ASSERT_EQ(first.body["choices"][0]["message"]["tool_calls"].size(), 1u) << first.body;
  EXPECT_EQ(first.body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
}

// A tool loop's history reaches the template as Hugging Face passes it: the call's arguments as
// an object (the template writes it with tojson), the tool's answer, the kwargs.
TEST_F(ToolCallingTest, HistoryWithCallsAndResultsReachesTheTemplate) {
  start_with_answer("It is sunny.");
  json body = request({{"chat_template_kwargs", {{"enable_thinking", false}}}});
  body["messages"].push_back({{"role", "assistant"}, {"content", nullptr}, {"reasoning_content", "Look it up."},
                              {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                               {"function", {{"name", "get_weather"},
                                                             {"arguments", "{\"city\":\"Paris\"}"}}}}}}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny, 24 C"}});
  const Reply reply = post("/v1/chat/completions", body);
  ASSERT_EQ(reply.status, 200) << reply.body;
  // The text as the tokens decode (SentencePiece puts a space in front), untouched by parsing.
  EXPECT_EQ(reply.body["choices"][0]["message"]["content"], decode(tokenizer_->encode("It is sunny.", false, false)));
  EXPECT_EQ(reply.body["choices"][0]["finish_reason"], "stop");
  const std::string prompt = prompt_text();
  EXPECT_NE(prompt.find("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"), std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<tool_response>\nsunny, 24 C\n</tool_response>"), std::string::npos) << prompt;
  EXPECT_TRUE(prompt.ends_with("<think>\n\n</think>\n\n")) << prompt;  // enable_thinking false
}

// gpt-oss: the analysis channel is the reasoning, the final channel the answer; the effort
// reaches the template.
TEST_F(ToolCallingTest, HarmonyChannelsAndReasoningEffort) {
  start_with_answer("<|channel|>analysis<|message|>Just greet.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
                    "openai-gpt-oss-120b.jinja");
  json body = request({{"reasoning_effort", "high"}, {"stream", true}});
  body.erase("tools");
  std::string reasoning, content;
  for (const auto& event : post_stream("/v1/chat/completions", body)) {
    if (event == "[DONE]") continue;
    const json& delta = event["choices"][0]["delta"];
    reasoning += delta.value("reasoning_content", "");
    content += delta.value("content", "");
  }
  EXPECT_EQ(reasoning, "Just greet.");
  EXPECT_EQ(content, "Hello!");
  EXPECT_NE(prompt_text().find("Reasoning: high"), std::string::npos) << prompt_text();
}

TEST_F(ToolCallingTest, OllamaChatTakesToolsAndAnswersWithArgumentObjects) {
  start_with_answer(kThinkAndCall);
  const Reply reply = post("/api/chat", json{{"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
                                             {"tools", tools()}, {"stream", false}});
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json& message = reply.body["message"];
  ASSERT_EQ(message["tool_calls"].size(), 1u) << reply.body;
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
  EXPECT_EQ(message["thinking"], "The user wants the weather.");
  EXPECT_EQ(reply.body["done_reason"], "stop");
}

TEST_F(ToolCallingTest, BadToolRequestsAreRefusedSayingWhy) {
  start_with_answer("x");
  struct Case {
    json body;
    std::string param, code;
  };
  json orphan = request();
  orphan["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_9"}, {"content", "?"}});
  json image = request();
  image["messages"][0]["content"] = json::parse(R"([{"type":"image_url","image_url":{"url":"x"}}])");
  json unnamed = request();
  unnamed["tools"][0]["function"].erase("name");
  const std::vector<Case> cases = {
      {request({{"tool_choice", {{"type", "function"}, {"function", {{"name", "fly"}}}}}}),
       "tool_choice.function.name", "invalid_value"},
      {orphan, "messages[1].tool_call_id", "invalid_value"},
      {image, "messages[0].content[0]", "unsupported_parameter"},
      {unnamed, "tools[0].function.name", "missing_required_parameter"},
      {request({{"tools", json::parse(R"([{"type":"retrieval"}])")}}), "tools[0].type", "unsupported_parameter"},
      {request({{"tool_choice", "sometimes"}}), "tool_choice", "invalid_value"},
      {json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tool_choice", "required"}}, "tool_choice",
       "invalid_value"},
      {request({{"chat_template_kwargs", {{"tools", 1}}}}), "chat_template_kwargs.tools", "invalid_value"},
  };
  for (const auto& c : cases) {
    const Reply reply = post("/v1/chat/completions", c.body);
    EXPECT_EQ(reply.status, 400) << c.body;
    EXPECT_EQ(reply.body["error"]["param"], c.param) << reply.body;
    EXPECT_EQ(reply.body["error"]["code"], c.code) << reply.body;
  }
}

// A GGUF's tokenizer.chat_template.tool_use renders the requests that offer tools.
TEST_F(ToolCallingTest, TheToolUseTemplateRendersRequestsWithTools) {
  FakeGenerator::Options fake = fake_options();
  fake.limits.context_size = 4096;
  ServerOptions options;
  options.tool_use_chat_template = shared_template("Qwen-Qwen3-0.6B.jinja");
  start(std::move(fake), options, "{% for m in messages %}{{ m.content }}{% endfor %} -> ");
  ASSERT_EQ(post("/v1/chat/completions", request()).status, 200);
  EXPECT_NE(prompt_text().find("<tools>"), std::string::npos) << prompt_text();
  json without_tools = request();
  without_tools.erase("tools");
  ASSERT_EQ(post("/v1/chat/completions", without_tools).status, 200);
  EXPECT_EQ(prompt_text(), decode(tokenizer_->encode("Weather in Paris? -> ", false, false)));
}

// Without a template of its own the model has nowhere to be told of tools.
TEST_F(ApiServerTest, ToolsNeedTheModelsOwnTemplate) {
  start();
  const Reply reply = post("/v1/chat/completions",
                           json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                {"tools", json::parse(R"([{"type":"function","function":{"name":"f"}}])")}});
  EXPECT_EQ(reply.status, 400);
  EXPECT_EQ(reply.body["error"]["param"], "tools");
}

TEST(ModelNameTest, IsTheFileNameWithoutGguf) {
  EXPECT_EQ(model_name_from_path("/models/llama-3-8b.Q4_0.gguf"), "llama-3-8b.Q4_0");
  EXPECT_EQ(model_name_from_path("weights.bin"), "weights.bin");
}

}  // namespace
}  // namespace strata::api
