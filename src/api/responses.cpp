#include "api/responses.h"

#include <nlohmann/json.hpp>

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

json logprobs_field(const ResponseHeader& header, const std::vector<TokenLogprobs>& tokens) {
  if (!header.with_logprobs) return nullptr;
  return header.endpoint == Endpoint::ChatCompletions ? chat_logprobs(tokens)
                                                      : completion_logprobs(tokens);
}

json usage_field(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", 0}}}};
}

json envelope(const ResponseHeader& header, bool chunk, json choices) {
  const bool chat = header.endpoint == Endpoint::ChatCompletions;
  return {{"id", header.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", header.created},
          {"model", header.model},
          {"choices", std::move(choices)}};
}

json finish_field(std::string_view finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(finish_reason);
}

json chunk_choice(const ResponseHeader& header, json delta, const std::string& text,
                  const std::vector<TokenLogprobs>& logprobs, std::string_view finish_reason) {
  json choice = {{"index", 0}};
  if (header.endpoint == Endpoint::ChatCompletions) choice["delta"] = std::move(delta);
  else choice["text"] = text;
  choice["logprobs"] = logprobs.empty() ? json(nullptr) : logprobs_field(header, logprobs);
  choice["finish_reason"] = finish_field(finish_reason);
  return choice;
}

}  // namespace

std::string error_body(const ApiError& error) {
  return dump({{"error",
                {{"message", error.what()},
                 {"type", error.type},
                 {"param", nullable(error.param)},
                 {"code", nullable(error.code)}}}});
}

std::string model_body(const std::string& model, int64_t created) {
  return dump({{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "strata"}});
}

std::string models_body(const std::string& model, int64_t created) {
  return dump({{"object", "list"}, {"data", {json::parse(model_body(model, created))}}});
}

std::string completion_body(const ResponseHeader& header, const TextDelta& output,
                            std::string_view finish_reason, const Usage& usage) {
  json choice = {{"index", 0}};
  if (header.endpoint == Endpoint::ChatCompletions) {
    choice["message"] = {{"role", "assistant"}, {"content", output.text}, {"refusal", nullptr}};
  } else {
    choice["text"] = output.text;
  }
  choice["logprobs"] = logprobs_field(header, output.logprobs);
  choice["finish_reason"] = finish_field(finish_reason);
  json body = envelope(header, false, json::array({std::move(choice)}));
  body["usage"] = usage_field(usage);
  return dump(body);
}

std::string chunk_event(const ResponseHeader& header, const TextDelta& delta, bool first,
                        bool with_usage_field) {
  json chat_delta = json::object();
  if (first) chat_delta["role"] = "assistant";
  chat_delta["content"] = delta.text;
  json body = envelope(header, true,
                       json::array({chunk_choice(header, std::move(chat_delta), delta.text,
                                                 delta.logprobs, {})}));
  if (with_usage_field) body["usage"] = nullptr;
  return event(body);
}

std::string final_chunk_event(const ResponseHeader& header, std::string_view finish_reason,
                              bool with_usage_field) {
  json body = envelope(header, true,
                       json::array({chunk_choice(header, json::object(), "", {}, finish_reason)}));
  if (with_usage_field) body["usage"] = nullptr;
  return event(body);
}

std::string usage_chunk_event(const ResponseHeader& header, const Usage& usage) {
  json body = envelope(header, true, json::array());
  body["usage"] = usage_field(usage);
  return event(body);
}

std::string error_event(const ApiError& error) { return "data: " + error_body(error) + "\n\n"; }

}  // namespace strata::api
