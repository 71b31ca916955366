#include "api/responses.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

namespace strata::api {
namespace {

using json = nlohmann::json;

// Token pieces can be partial UTF-8 sequences; they must not make serialisation throw.
std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string event(const json& value) { return "data: " + dump(value) + "\n\n"; }

json nullable(const std::string& text) { return text.empty() ? json(nullptr) : json(text); }

json utf8_bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char byte : text) bytes.push_back(byte);
  return bytes;
}

json chat_logprobs(const std::vector<TokenLogprobs>& tokens) {
  json content = json::array();
  for (const auto& token : tokens) {
    json top = json::array();
    for (const auto& alternative : token.top) {
      top.push_back({{"token", alternative.text},
                     {"logprob", alternative.logprob},
                     {"bytes", utf8_bytes(alternative.text)}});
    }
    content.push_back({{"token", token.text},
                       {"logprob", token.logprob},
                       {"bytes", utf8_bytes(token.text)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs(const std::vector<TokenLogprobs>& tokens) {
  json texts = json::array(), logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  for (const auto& token : tokens) {
    texts.push_back(token.text);
    logprobs.push_back(token.logprob);
    json top = json::object();
    for (const auto& alternative : token.top) top[alternative.text] = alternative.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(token.text_offset);
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json usage_field(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
          {"completion_tokens_details",
           {{"reasoning_tokens", usage.reasoning_tokens},
            {"accepted_prediction_tokens", usage.accepted_prediction_tokens},
            {"rejected_prediction_tokens", usage.rejected_prediction_tokens}}}};
}

json finish_field(std::string_view finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(finish_reason);
}

}  // namespace

std::string random_id(std::string_view prefix) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 random{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(random)];
  return id;
}

namespace {
json openai_tool_call(const chat::ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

class OpenAiWriter final : public ResponseWriter {
 public:
  explicit OpenAiWriter(OpenAiResponseOptions options)
      : options_(std::move(options)),
        chat_(options_.endpoint == Endpoint::ChatCompletions),
        id_(random_id(chat_ ? "chatcmpl-" : "cmpl-")),
        created_(unix_time()) {}

  std::string_view content_type(bool stream) const override {
    return stream ? "text/event-stream" : "application/json";
  }

  std::string stream_start(const Usage&) override {
    json delta = {{"role", "assistant"}, {"content", ""}};
    return event(chunk(choice(std::move(delta), "", {}, {})));
  }

  // As OpenAI streams a call: a chunk with its index, id, type and name (and empty
  // arguments), then its arguments.
  std::string stream_delta(const TextDelta& delta) override {
    if (!chat_ || (delta.reasoning.empty() && delta.tool_calls.empty()))
      return event(chunk(choice({{"content", delta.text}}, delta.text, delta.logprobs, {})));
    std::string events;
    json text_delta = json::object();
    if (!delta.reasoning.empty()) text_delta["reasoning_content"] = delta.reasoning;
    if (!delta.text.empty()) text_delta["content"] = delta.text;
    if (!text_delta.empty() || !delta.logprobs.empty())
      events += event(chunk(choice(std::move(text_delta), "", delta.logprobs, {})));
    for (const auto& call : delta.tool_calls) {
      const int index = streamed_calls_++;
      json opening = {{"index", index}, {"id", call.id}, {"type", "function"},
                      {"function", {{"name", call.name}, {"arguments", ""}}}};
      events += event(chunk(choice({{"tool_calls", json::array({std::move(opening)})}}, "", {}, {})));
      json arguments = {{"index", index}, {"function", {{"arguments", call.arguments}}}};
      events += event(chunk(choice({{"tool_calls", json::array({std::move(arguments)})}}, "", {}, {})));
    }
    return events;
  }

  std::string stream_end(const Finish& finish, const Usage& usage) override {
    std::string events = event(chunk(choice(json::object(), "", {}, finish.reason)));
    if (options_.include_usage) {
      json usage_chunk = envelope(true, json::array());
      usage_chunk["usage"] = usage_field(usage);
      events += event(usage_chunk);
    }
    return events + "data: [DONE]\n\n";
  }

  std::string stream_error(const ApiError& error) override {
    return "data: " + openai_error_body(error) + "\n\n";
  }

  // An SSE comment line: clients skip it, and neither they nor a proxy take the wait for a hang.
  std::string stream_waiting(const std::string& why) override { return ": waiting for " + why + "\n\n"; }

  std::string whole(const TextDelta& output, const Finish& finish, const Usage& usage) override {
    json choice = {{"index", 0}};
    if (chat_) {
      json message = {{"role", "assistant"},
                      {"content", output.text.empty() && !output.tool_calls.empty() ? json(nullptr)
                                                                                   : json(output.text)},
                      {"refusal", nullptr}};
      if (!output.reasoning.empty()) message["reasoning_content"] = output.reasoning;
      if (!output.tool_calls.empty()) {
        message["tool_calls"] = json::array();
        for (const auto& call : output.tool_calls) message["tool_calls"].push_back(openai_tool_call(call));
      }
      choice["message"] = std::move(message);
    } else {
      choice["text"] = output.text;
    }
    choice["logprobs"] = options_.with_logprobs ? logprobs(output.logprobs) : json(nullptr);
    choice["finish_reason"] = finish_field(finish.reason);
    json body = envelope(false, json::array({std::move(choice)}));
    body["usage"] = usage_field(usage);
    return dump(body);
  }

 private:
  json envelope(bool chunk, json choices) const {
    return {{"id", id_},
            {"object",
             chat_ ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", created_},
            {"model", options_.model},
            {"choices", std::move(choices)}};
  }

  // With include_usage every chunk carries "usage": null, as OpenAI's do.
  json chunk(json choice) const {
    json body = envelope(true, json::array({std::move(choice)}));
    if (options_.include_usage) body["usage"] = nullptr;
    return body;
  }

  json choice(json chat_delta, const std::string& text, const std::vector<TokenLogprobs>& tokens,
              std::string_view finish_reason) const {
    json choice = {{"index", 0}};
    if (chat_) {
      choice["delta"] = std::move(chat_delta);
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] =
        tokens.empty() || !options_.with_logprobs ? json(nullptr) : logprobs(tokens);
    choice["finish_reason"] = finish_field(finish_reason);
    return choice;
  }

  json logprobs(const std::vector<TokenLogprobs>& tokens) const {
    return chat_ ? chat_logprobs(tokens) : completion_logprobs(tokens);
  }

  const OpenAiResponseOptions options_;
  const bool chat_;
  const std::string id_;
  const int64_t created_;
  int streamed_calls_ = 0;
};

// RFC 3339 in UTC with nanoseconds, as Ollama writes its timestamps.
std::string rfc3339_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto nanoseconds =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count() %
      1000000000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long long>(nanoseconds));
  return text;
}

class OllamaWriter final : public ResponseWriter {
 public:
  OllamaWriter(OllamaEndpoint endpoint, std::string model)
      : chat_(endpoint == OllamaEndpoint::Chat), model_(std::move(model)) {}

  std::string_view content_type(bool stream) const override {
    return stream ? "application/x-ndjson" : "application/json";
  }

  std::string stream_start(const Usage&) override { return {}; }

  std::string stream_delta(const TextDelta& delta) override { return line(message(delta, false)); }

  std::string stream_end(const Finish& finish, const Usage& usage) override {
    return line(final_message({}, finish.reason, usage));
  }

  std::string stream_error(const ApiError& error) override {
    return ollama_error_body(error) + "\n";
  }

  // Newline-delimited JSON has no comments, and Ollama's clients take every line for an answer
  // chunk: its streams say nothing while they wait, as Ollama's own do while a model loads.
  std::string stream_waiting(const std::string&) override { return {}; }

  std::string whole(const TextDelta& output, const Finish& finish, const Usage& usage) override {
    return dump(final_message(output, finish.reason, usage));
  }

 private:
  using Clock = std::chrono::steady_clock;

  static std::string line(const json& value) { return dump(value) + "\n"; }

  // Ollama's calls carry their arguments as an object, and no id.
  json message(const TextDelta& delta, bool done) const {
    json body = {{"model", model_}, {"created_at", rfc3339_now()}};
    if (chat_) {
      json message = {{"role", "assistant"}, {"content", delta.text}};
      if (!delta.reasoning.empty()) message["thinking"] = delta.reasoning;
      if (!delta.tool_calls.empty()) {
        message["tool_calls"] = json::array();
        for (const auto& call : delta.tool_calls)
          message["tool_calls"].push_back(
              {{"function", {{"name", call.name}, {"arguments", json::parse(call.arguments)}}}});
      }
      body["message"] = std::move(message);
    } else {
      body["response"] = delta.text;
      if (!delta.reasoning.empty()) body["thinking"] = delta.reasoning;
    }
    body["done"] = done;
    return body;
  }

  json final_message(const TextDelta& output, std::string_view finish_reason,
                     const Usage& usage) const {
    auto nanoseconds = [](Clock::duration duration) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count();
    };
    const auto end = Clock::now();
    const auto first_token = usage.first_token_at.value_or(end);
    json body = message(output, true);
    body["done_reason"] = finish_reason == "tool_calls" ? "stop" : finish_reason;  // Ollama has no other
    body["total_duration"] = nanoseconds(end - start_);
    body["load_duration"] = 0;
    // As Ollama counts it: the prompt tokens computed, not those its cache already held.
    body["prompt_eval_count"] = usage.prompt_tokens - usage.cached_tokens;
    body["prompt_eval_duration"] = nanoseconds(first_token - start_);
    body["eval_count"] = usage.completion_tokens;
    body["eval_duration"] = nanoseconds(end - first_token);
    return body;
  }

  const bool chat_;
  const std::string model_;
  const Clock::time_point start_ = Clock::now();
};

}  // namespace

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::unique_ptr<ResponseWriter> ollama_response_writer(OllamaEndpoint endpoint, std::string model) {
  return std::make_unique<OllamaWriter>(endpoint, std::move(model));
}

std::string ollama_error_body(const ApiError& error) { return dump({{"error", error.what()}}); }

namespace {

json ollama_details(const ModelFacts& facts) {
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", facts.architecture},
          {"families", facts.architecture.empty() ? json(nullptr) : json::array({facts.architecture})},
          {"parameter_size", facts.parameter_size},
          {"quantization_level", facts.quantization_level}};
}

json ollama_model_entry(const std::string& model, const ModelFacts& facts) {
  return {{"name", model},
          {"model", model},
          {"size", facts.size_bytes},
          {"digest", facts.digest},
          {"details", ollama_details(facts)}};
}

}  // namespace

std::string ollama_tags_body(const std::string& model, const ModelFacts& facts) {
  json entry = ollama_model_entry(model, facts);
  entry["modified_at"] = rfc3339_now();
  return dump({{"models", json::array({std::move(entry)})}});
}

std::string ollama_ps_body(const std::string& model, const ModelFacts& facts, int context_size) {
  json entry = ollama_model_entry(model, facts);
  // The model stays loaded for as long as the server runs.
  entry["expires_at"] = "9999-12-31T23:59:59Z";
  entry["size_vram"] = 0;
  entry["context_length"] = context_size;
  return dump({{"models", json::array({std::move(entry)})}});
}

std::string ollama_show_body(const ModelFacts& facts, const std::string& chat_template, int context_size) {
  json info = facts.model_info_json.empty() ? json::object() : json::parse(facts.model_info_json);
  return dump({{"modelfile", ""},
               {"parameters", "num_ctx " + std::to_string(context_size)},
               {"template", chat_template},
               {"details", ollama_details(facts)},
               {"model_info", std::move(info)},
               {"capabilities", json::array({"completion"})},
               {"modified_at", rfc3339_now()}});
}

std::string ollama_version_body() { return dump({{"version", std::string(kVersion)}}); }

std::unique_ptr<ResponseWriter> openai_response_writer(OpenAiResponseOptions options) {
  return std::make_unique<OpenAiWriter>(std::move(options));
}

std::string openai_error_body(const ApiError& error) {
  return dump({{"error",
                {{"message", error.what()},
                 {"type", error.type},
                 {"param", nullable(error.param)},
                 {"code", nullable(error.code)}}}});
}

std::string openai_model_body(const std::string& model, int64_t created) {
  return dump({{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "strata"}});
}

std::string openai_models_body(const std::string& model, int64_t created) {
  return dump({{"object", "list"}, {"data", {json::parse(openai_model_body(model, created))}}});
}

}  // namespace strata::api
