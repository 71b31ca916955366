// How answers are written: OpenAI's JSON and server-sent events here, Ollama's in ollama.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "api/api_error.h"
#include "api/completion_text.h"
#include "api/model_facts.h"
#include "api/request.h"

namespace strata::api {

// What a generation used: its tokens, and when its first token came (Ollama's timings).
struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int reasoning_tokens = 0;  // of the completion, spent in the model's reasoning
  int cached_tokens = 0;  // of the prompt, whose keys and values came from the prefix cache
  std::optional<std::chrono::steady_clock::time_point> first_token_at;
  // Speculative decoding's draft tokens that the model confirmed, and those it did not.
  int accepted_prediction_tokens = 0;
  int rejected_prediction_tokens = 0;
};

// How a generation ended, as an answer reports it.
struct Finish {
  std::string_view reason;    // OpenAI's finish_reason: "stop", "length"
  std::string stop_sequence;  // the stop string that ended it, if one did
};

// Writes one request's answer, whole or as a stream.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual std::string_view content_type(bool stream) const = 0;
  // What a stream starts with, sent before the first token so clients see it has begun.
  virtual std::string stream_start(const Usage& prompt) = 0;
  // Sent about once a second while the request waits for the model to be ready: what for.
  virtual std::string stream_waiting(const std::string& why) = 0;
  virtual std::string stream_delta(const TextDelta& delta) = 0;
  virtual std::string stream_end(const Finish& finish, const Usage& usage) = 0;
  // Once a stream has started its status cannot change, so errors travel inside it.
  virtual std::string stream_error(const ApiError& error) = 0;
  virtual std::string whole(const TextDelta& output, const Finish& finish, const Usage& usage) = 0;
};

struct OpenAiResponseOptions {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::string model;
  bool with_logprobs = false;
  bool include_usage = false;  // streaming: end with a usage chunk
};
std::unique_ptr<ResponseWriter> openai_response_writer(OpenAiResponseOptions options);

std::string openai_error_body(const ApiError& error);
std::string openai_models_body(const std::string& model, int64_t created);
std::string openai_model_body(const std::string& model, int64_t created);

// Ollama: newline-delimited JSON when streaming, {"error": "..."} for errors.
std::unique_ptr<ResponseWriter> ollama_response_writer(OllamaEndpoint endpoint, std::string model);
std::string ollama_error_body(const ApiError& error);
// The served model as Ollama describes it: /api/tags lists it, /api/ps shows it loaded, /api/show
// gives its metadata, chat template (the Jinja2 text, not a Go template) and capabilities.
std::string ollama_tags_body(const std::string& model, const ModelFacts& facts);
std::string ollama_ps_body(const std::string& model, const ModelFacts& facts, int context_size);
std::string ollama_show_body(const ModelFacts& facts, const std::string& chat_template, int context_size);
std::string ollama_version_body();

int64_t unix_time();
// `prefix` and 24 random letters and digits: an answer's id.
std::string random_id(std::string_view prefix);

}  // namespace strata::api
