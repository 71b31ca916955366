#include "api/embeddings.h"

#include <openssl/evp.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/json_body.h"

namespace strata::api {

namespace {

using json = nlohmann::ordered_json;

// OpenAI's own limit on the inputs of one request.
constexpr size_t kMaxInputs = 2048;

std::vector<engine::Token> token_input(const json& value, const std::string& path) {
  std::vector<engine::Token> tokens;
  for (size_t i = 0; i < value.size(); ++i) {
    const json& id = value[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      invalid_field(path + "." + std::to_string(i), "expected a token id");
    }
    tokens.push_back(static_cast<engine::Token>(id.get<int64_t>()));
  }
  if (tokens.empty()) invalid_field(path, "is empty");
  return tokens;
}

void read_inputs(const json& input, EmbeddingRequest& request) {
  const bool tokens_allowed = request.dialect == EmbeddingDialect::OpenAI;
  const auto text = [&](const json& value, const std::string& path) {
    const std::string& s = expect_string(value, path);
    if (s.empty()) invalid_field(path, "is empty: there is nothing to embed");
    request.inputs.emplace_back(s);
  };
  if (input.is_string()) return text(input, "input");
  expect_array(input, "input");
  if (input.empty()) invalid_field("input", "is empty: there is nothing to embed");
  if (input.size() > kMaxInputs) {
    invalid_field("input", "holds " + std::to_string(input.size()) + " inputs, more than " + std::to_string(kMaxInputs));
  }
  if (tokens_allowed && input[0].is_number()) {
    request.inputs.emplace_back(token_input(input, "input"));
    return;
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string path = "input." + std::to_string(i);
    if (tokens_allowed && input[i].is_array()) {
      request.inputs.emplace_back(token_input(input[i], path));
    } else {
      text(input[i], path);
    }
  }
}

std::string base64(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &values[i], sizeof bits);
    for (size_t b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<char>((bits >> (8 * b)) & 0xffu);
  }
  std::string text(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(text.data()),
                                      reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  text.resize(static_cast<size_t>(written));
  return text;
}

// The shortest text that reads back as each float (JSON has no NaN or infinity: null).
std::string float_array(const std::vector<float>& values) {
  std::string out = "[";
  char text[32];
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    if (!std::isfinite(values[i])) {
      out += "null";
      continue;
    }
    out.append(text, std::to_chars(text, text + sizeof text, values[i]).ptr);
  }
  return out + "]";
}

}  // namespace

EmbeddingRequest parse_embedding_request(EmbeddingDialect dialect, std::string_view body) {
  EmbeddingRequest request;
  request.dialect = dialect;
  request.truncate = dialect == EmbeddingDialect::Ollama;
  const json root = parse_ordered_json_object(body);
  bool has_input = false;
  for (const auto& [key, value] : root.items()) {
    if (key == "model") {
      request.model = expect_string(value, key);
    } else if (key == "input") {
      read_inputs(value, request);
      has_input = true;
    } else if (key == "dimensions") {
      if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > (1 << 20)) {
        invalid_field(key, "expected a positive whole number");
      }
      request.dimensions = static_cast<int>(value.get<int64_t>());
    } else if (dialect == EmbeddingDialect::OpenAI && key == "encoding_format") {
      const std::string& format = expect_string(value, key);
      if (format != "float" && format != "base64") invalid_field(key, "expected \"float\" or \"base64\"");
      request.base64 = format == "base64";
    } else if (dialect == EmbeddingDialect::OpenAI && key == "user") {
      expect_string(value, key);
    } else if (dialect == EmbeddingDialect::Ollama && key == "truncate") {
      request.truncate = expect_bool(value, key);
    } else if (dialect == EmbeddingDialect::Ollama && key == "options") {
      expect_object(value, key);  // sampling and runner options: nothing that changes an embedding
    } else if (dialect == EmbeddingDialect::Ollama && key == "keep_alive") {
      if (!value.is_string() && !value.is_number()) invalid_field(key, "expected a duration");
    } else {
      throw ApiError(400, "Unrecognized request argument supplied: " + key, key, "unknown_parameter");
    }
  }
  if (!has_input) invalid_field("input", "missing");
  return request;
}

std::vector<float> unit_embedding(std::vector<float> pooled, std::optional<int> dimensions) {
  if (dimensions && static_cast<size_t>(*dimensions) < pooled.size()) pooled.resize(static_cast<size_t>(*dimensions));
  double squares = 0.0;
  for (float v : pooled) squares += static_cast<double>(v) * v;
  if (squares > 0.0) {
    const double scale = 1.0 / std::sqrt(squares);
    for (float& v : pooled) v = static_cast<float>(v * scale);
  }
  return pooled;
}

std::string embedding_response_body(const EmbeddingRequest& request, const std::string& model_name,
                                    const std::vector<std::vector<float>>& embeddings, int prompt_tokens,
                                    double seconds) {
  const std::string model = json(model_name).dump();
  if (request.dialect == EmbeddingDialect::Ollama) {
    std::string vectors = "[";
    for (size_t i = 0; i < embeddings.size(); ++i) vectors += (i ? "," : "") + float_array(embeddings[i]);
    const auto nanoseconds = static_cast<int64_t>(seconds * 1e9);
    return "{\"model\":" + model + ",\"embeddings\":" + vectors + "],\"total_duration\":" +
           std::to_string(nanoseconds) + ",\"load_duration\":0,\"prompt_eval_count\":" +
           std::to_string(prompt_tokens) + "}";
  }
  std::string data = "[";
  for (size_t i = 0; i < embeddings.size(); ++i) {
    data += std::string(i ? "," : "") + "{\"object\":\"embedding\",\"index\":" + std::to_string(i) +
            ",\"embedding\":" + (request.base64 ? "\"" + base64(embeddings[i]) + "\"" : float_array(embeddings[i])) +
            "}";
  }
  const std::string tokens = std::to_string(prompt_tokens);
  return "{\"object\":\"list\",\"data\":" + data + "],\"model\":" + model + ",\"usage\":{\"prompt_tokens\":" +
         tokens + ",\"total_tokens\":" + tokens + "}}";
}

PendingEmbeddings::PendingEmbeddings(size_t inputs) : vectors_(inputs) {}

engine::RequestCallbacks PendingEmbeddings::callbacks(size_t input) {
  engine::RequestCallbacks callbacks;
  callbacks.on_embedding = [self = shared_from_this(), input](std::vector<float> vector) {
    std::lock_guard lock(self->mutex_);
    self->vectors_[input] = std::move(vector);
  };
  callbacks.on_finish = [self = shared_from_this(), input](engine::FinishReason reason, const std::string& error) {
    self->finished(input, reason, error);
  };
  callbacks.cancelled = [self = shared_from_this()] {
    std::lock_guard lock(self->mutex_);
    return self->cancelled_;
  };
  return callbacks;
}

void PendingEmbeddings::finished(size_t input, engine::FinishReason reason, const std::string& error) {
  {
    std::lock_guard lock(mutex_);
    ++done_;
    // Only a vector, then Stop, is an embedding; anything else (an error, a cancel, a lost
    // scheduler that no one resumed) fails the request.
    if (error_.empty() && (reason != engine::FinishReason::Stop || vectors_[input].empty())) {
      error_ = !error.empty() ? error
                              : "input " + std::to_string(input) + " gave no embedding (" +
                                    engine::finish_reason_name(reason) + ")";
    }
  }
  changed_.notify_all();
}

void PendingEmbeddings::cancel() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
}

PendingEmbeddings::Outcome PendingEmbeddings::wait(const std::function<std::optional<std::string>()>& give_up) {
  constexpr std::chrono::milliseconds kCheck{100};
  std::unique_lock lock(mutex_);
  while (done_ < vectors_.size() && error_.empty()) {
    if (changed_.wait_for(lock, kCheck, [&] { return done_ == vectors_.size() || !error_.empty(); })) break;
    lock.unlock();
    std::optional<std::string> why = give_up();
    lock.lock();
    if (why) {
      error_ = std::move(*why);
      break;
    }
  }
  // One failed input fails the request: the others need not run on.
  if (!error_.empty()) {
    cancelled_ = true;
    return {{}, error_};
  }
  return {std::move(vectors_), {}};
}

}  // namespace strata::api
