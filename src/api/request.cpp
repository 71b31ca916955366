#include "api/request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "api/api_error.h"
#include "constrain/grammar.h"
#include "constrain/json_schema.h"
#include "engine/generator.h"

namespace strata::api {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxStopStrings = 4;
// Deeper nesting is never a real request; refusing it while parsing keeps a body of brackets
// from costing seconds and hundreds of megabytes.
constexpr int kMaxJsonDepth = 64;
using engine::kMaxTopLogprobs;

[[noreturn]] void invalid_type(const std::string& param, const char* expected) {
  throw ApiError(400, "Invalid type for '" + param + "': expected " + expected + ".", param,
                 "invalid_type");
}

[[noreturn]] void missing(const std::string& param) {
  throw ApiError(400, "Missing required parameter: '" + param + "'.", param,
                 "missing_required_parameter");
}

[[noreturn]] void invalid_value(const std::string& param, const std::string& why) {
  throw ApiError(400, "Invalid value for '" + param + "': " + why, param, "invalid_value");
}

[[noreturn]] void unsupported(const std::string& param, const std::string& why) {
  throw ApiError(400, "Unsupported parameter '" + param + "': " + why, param,
                 "unsupported_parameter");
}

double read_number(const json& value, const std::string& param, sampling::Range range) {
  if (!value.is_number()) invalid_type(param, "a number");
  double number = value.get<double>();
  if (!range.contains(number)) {
    invalid_value(param, "must be between " + json(range.min).dump() + " and " + json(range.max).dump() + ".");
  }
  return number;
}

int64_t read_integer(const json& value, const std::string& param, int64_t min, int64_t max) {
  int64_t number = 0;
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      invalid_value(param, "must be at most " + std::to_string(max) + ".");
    }
    number = value.get<int64_t>();
  } else if (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>() &&
             std::abs(value.get<double>()) < 9e18) {
    number = static_cast<int64_t>(value.get<double>());  // clients in JavaScript send 5.0 for 5
  } else {
    invalid_type(param, "an integer");
  }
  if (number < min || number > max) {
    invalid_value(param,
                  "must be between " + std::to_string(min) + " and " + std::to_string(max) + ".");
  }
  return number;
}

int read_integer(const json& value, const std::string& param, sampling::Range range) {
  return static_cast<int>(read_integer(value, param, static_cast<int64_t>(range.min), static_cast<int64_t>(range.max)));
}

bool read_bool(const json& value, const std::string& param) {
  if (!value.is_boolean()) invalid_type(param, "a boolean");
  return value.get<bool>();
}

const std::string& read_string(const json& value, const std::string& param) {
  if (!value.is_string()) invalid_type(param, "a string");
  return value.get_ref<const std::string&>();
}

std::string element(const std::string& param, size_t index) {
  return param + "[" + std::to_string(index) + "]";
}

std::string read_content(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) invalid_type(param, "a string or an array of content parts");
  if (content.empty()) invalid_value(param, "must contain at least one content part.");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string part_param = element(param, i);
    if (!part.is_object()) invalid_type(part_param, "an object");
    auto type = part.find("type");
    if (type == part.end()) missing(part_param + ".type");
    if (read_string(*type, part_param + ".type") != "text") {
      unsupported(part_param + ".type", "only \"text\" content parts are supported.");
    }
    for (const auto& [key, value] : part.items()) {
      if (key != "type" && key != "text") unsupported(part_param + "." + key, "not supported in content parts.");
    }
    auto part_text = part.find("text");
    if (part_text == part.end()) missing(part_param + ".text");
    text += read_string(*part_text, part_param + ".text");
  }
  return text;
}

ChatMessage read_message(const json& message, const std::string& param) {
  if (!message.is_object()) invalid_type(param, "an object");
  ChatMessage result;
  auto role = message.find("role");
  if (role == message.end()) missing(param + ".role");
  result.role = read_string(*role, param + ".role");
  if (result.role == "developer") result.role = "system";
  if (result.role != "system" && result.role != "user" && result.role != "assistant") {
    unsupported(
        param + ".role",
        "'" + result.role + "' is not supported; use system, developer, user or assistant.");
  }
  bool has_content = false;
  for (const auto& [key, value] : message.items()) {
    // A speaker's name does not change the template; null means absent.
    if (key == "role" || key == "name" || value.is_null()) continue;
    if (key != "content") unsupported(param + "." + key, "not supported in messages.");
    result.content = read_content(value, param + ".content");
    has_content = true;
  }
  if (!has_content && result.role != "assistant") missing(param + ".content");
  return result;
}

std::vector<ChatMessage> read_messages(const json& messages) {
  if (!messages.is_array()) invalid_type("messages", "an array");
  if (messages.empty()) invalid_value("messages", "must contain at least one message.");
  std::vector<ChatMessage> result;
  for (size_t i = 0; i < messages.size(); ++i) {
    result.push_back(read_message(messages[i], element("messages", i)));
  }
  return result;
}

std::string read_prompt(const json& prompt) {
  if (prompt.is_string()) return prompt.get<std::string>();
  if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
    return prompt[0].get<std::string>();
  }
  if (prompt.is_array() && prompt.size() == 1) {
    unsupported("prompt", "token arrays are not supported; send the prompt as a string.");
  }
  if (prompt.is_array()) unsupported("prompt", "exactly one prompt per request is supported.");
  invalid_type("prompt", "a string");
}

std::vector<std::string> read_stop(const json& stop, const std::string& param) {
  std::vector<std::string> result;
  if (stop.is_string()) {
    result.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    if (stop.size() > kMaxStopStrings) {
      invalid_value(param, "at most " + std::to_string(kMaxStopStrings) + " stop sequences.");
    }
    for (size_t i = 0; i < stop.size(); ++i)
      result.push_back(read_string(stop[i], element(param, i)));
  } else {
    invalid_type(param, "a string or an array of strings");
  }
  for (const auto& text : result) {
    if (text.empty()) invalid_value(param, "stop sequences must not be empty.");
  }
  return result;
}

// The sampling fields both dialects share; `prefix` is where they sit ("" or "options.").
// Returns false for any other key.
bool read_sampling_field(const std::string& key, const json& value, const std::string& prefix,
                         CompletionRequest& request) {
  const std::string param = prefix + key;
  auto& params = request.sampling;
  if (key == "temperature") {
    params.temperature = float(read_number(value, param, sampling::kTemperatureRange));
  } else if (key == "top_p") {
    params.top_p = float(read_number(value, param, sampling::kProbabilityRange));
  } else if (key == "top_k") {
    params.top_k = read_integer(value, param, sampling::kTopKRange);
  } else if (key == "min_p") {
    params.min_p = float(read_number(value, param, sampling::kProbabilityRange));
  } else if (key == "presence_penalty") {
    params.presence_penalty = float(read_number(value, param, sampling::kPresencePenaltyRange));
  } else if (key == "frequency_penalty") {
    params.frequency_penalty = float(read_number(value, param, sampling::kPresencePenaltyRange));
  } else if (key == "stop") {
    request.stop = read_stop(value, param);
  } else if (key == "seed") {
    params.seed = static_cast<uint64_t>(read_integer(
        value, param, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  } else {
    return false;
  }
  return true;
}

json parse_json_object(std::string_view body) {
  json root;
  try {
    root = json::parse(body, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) {
        throw ApiError(400,
                       "The request body is nested more than " + std::to_string(kMaxJsonDepth) +
                           " levels deep.",
                       {}, "invalid_json");
      }
      return true;
    });
  } catch (const json::exception& error) {  // parse_error, or out_of_range for huge numbers
    throw ApiError(400, std::string("The request body is not valid JSON: ") + error.what(), {},
                   "invalid_json");
  }
  if (!root.is_object()) {
    throw ApiError(400, "The request body must be a JSON object.", {}, "invalid_json");
  }
  return root;
}

[[noreturn]] void unknown(const std::string& param) {
  throw ApiError(400, "Unrecognized request argument supplied: " + param, param,
                 "unknown_parameter");
}

CompletionRequest new_request(Endpoint endpoint) {
  CompletionRequest request;
  request.endpoint = endpoint;
  request.sampling.seed = std::random_device{}();  // as with OpenAI, no seed means a fresh one
  return request;
}

// Fields accepted only with the value that means "feature off", since anything else would need
// behaviour we do not have.
void require_neutral(const std::string& param, const json& value) {
  bool neutral = false;
  if (param == "n" || param == "best_of") {
    neutral = read_integer(value, param, 1, std::numeric_limits<int32_t>::max()) == 1;
  } else if (param == "echo") {
    neutral = !read_bool(value, param);
  } else if (param == "suffix") {
    neutral = read_string(value, param).empty();
  } else if (param == "logit_bias") {
    if (!value.is_object()) invalid_type(param, "an object");
    neutral = value.empty();
  } else if (param == "tools" || param == "functions") {
    if (!value.is_array()) invalid_type(param, "an array");
    neutral = value.empty();
  } else if (param == "tool_choice") {
    neutral = value.is_string() && (value == "none" || value == "auto");
  }
  if (!neutral) unsupported(param, "only its default value is supported.");
}

// The grammar a JSON schema compiles to, or a 400 naming `param` and what is wrong with it.
std::string schema_grammar(const nlohmann::ordered_json& schema, const std::string& param) {
  try {
    return constrain::json_schema_grammar(schema);
  } catch (const constrain::SchemaError& e) {
    invalid_value(param, std::string(e.what()) + ".");
  }
}

// response_format: {"type": "text"} (none), {"type": "json_object"} or {"type": "json_schema",
// "json_schema": {"name", "schema", "strict", "description"}}, as the grammar it stands for.
// `ordered` is the same value with its objects' keys in the body's order, which the schema's
// properties are generated in.
std::string read_response_format(const json& value, const nlohmann::ordered_json& ordered) {
  if (!value.is_object()) invalid_type("response_format", "an object");
  if (!value.contains("type")) missing("response_format.type");
  const std::string type = read_string(value["type"], "response_format.type");
  for (const auto& [key, v] : value.items()) {
    if (key != "type" && !(key == "json_schema" && type == "json_schema")) unknown("response_format." + key);
  }
  if (type == "text") return {};
  if (type == "json_object") return constrain::json_object_grammar();
  if (type != "json_schema") invalid_value("response_format.type", "must be 'text', 'json_object' or 'json_schema'.");
  if (!value.contains("json_schema")) missing("response_format.json_schema");
  const json& spec = value["json_schema"];
  if (!spec.is_object()) invalid_type("response_format.json_schema", "an object");
  bool has_schema = false;
  for (const auto& [key, v] : spec.items()) {
    const std::string param = "response_format.json_schema." + key;
    if (key == "name" || key == "description") {
      read_string(v, param);
    } else if (key == "strict") {
      read_bool(v, param);  // the output always follows the schema
    } else if (key == "schema") {
      has_schema = true;
    } else {
      unknown(param);
    }
  }
  if (!has_schema) missing("response_format.json_schema.schema");
  return schema_grammar(ordered["json_schema"]["schema"], "response_format.json_schema.schema");
}

// A GBNF grammar given as text, checked now so that a bad one is a 400.
std::string read_grammar(const json& value) {
  std::string grammar = read_string(value, "grammar");
  try {
    constrain::parse_gbnf(grammar);
  } catch (const constrain::GrammarError& e) {
    invalid_value("grammar", std::string(e.what()) + ".");
  }
  return grammar;
}

// Ollama's format: "json" (any object), a JSON schema, or "" (none).
std::string read_ollama_format(const json& value, const nlohmann::ordered_json& ordered) {
  if (value == "") return {};
  if (value == "json") return constrain::json_object_grammar();
  if (!value.is_object()) invalid_value("format", "must be \"json\" or a JSON schema.");
  return schema_grammar(ordered, "format");
}

// Ollama fields naming features we lack are accepted in their "off" form: false, "", [] or {}.
void require_off(const std::string& param, const json& value) {
  bool off =
      value == false || value == "" || ((value.is_array() || value.is_object()) && value.empty());
  if (!off) unsupported(param, "not supported.");
}

bool contains(const std::vector<std::string_view>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

void read_ollama_options(const json& options, CompletionRequest& request) {
  if (!options.is_object()) invalid_type("options", "an object");
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  for (const auto& [key, value] : options.items()) {
    if (value.is_null() || read_sampling_field(key, value, "options.", request)) continue;
    const std::string param = "options." + key;
    if (key == "num_predict") {
      // -1 (no limit) and -2 (fill the context) both mean "until the context is full" here.
      int64_t count = read_integer(value, param, -2, kIntMax);
      if (count == 0) invalid_value(param, "must be positive, -1 or -2.");
      if (count > 0) request.max_tokens = int(count);
    } else if (key == "repeat_penalty") {
      request.sampling.repetition_penalty = float(read_number(value, param, sampling::kRepetitionPenaltyRange));
    } else if (key == "repeat_last_n") {
      request.sampling.penalty_last_n = read_integer(value, param, sampling::kPenaltyLastNRange);
    } else if (!contains(ignored_ollama_options(), key)) {
      unknown(param);
    }
  }
}

}  // namespace

const std::vector<std::string_view>& ignored_request_fields() {
  static const std::vector<std::string_view> fields = {
      "user", "store", "metadata", "service_tier", "prediction", "parallel_tool_calls",
  };
  return fields;
}

CompletionRequest parse_completion_request(Endpoint endpoint, std::string_view body) {
  const json root = parse_json_object(body);
  const bool chat = endpoint == Endpoint::ChatCompletions;
  CompletionRequest request = new_request(endpoint);
  std::optional<int> max_tokens, max_completion_tokens;
  const json* stream_options = nullptr;
  const json* top_logprobs = nullptr;
  bool has_input = false;
  std::string response_format_grammar, given_grammar;
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

  for (const auto& [key, value] : root.items()) {
    if (value.is_null()) continue;  // clients send null for "not set"
    if (read_sampling_field(key, value, "", request)) continue;
    if (key == "model") {
      request.model = read_string(value, key);
    } else if (key == (chat ? "messages" : "prompt")) {
      if (chat) {
        request.messages = read_messages(value);
      } else {
        request.prompt = read_prompt(value);
      }
      has_input = true;
    } else if (key == "max_tokens") {
      max_tokens = int(read_integer(value, key, 1, kIntMax));
    } else if (key == "max_completion_tokens" && chat) {
      max_completion_tokens = int(read_integer(value, key, 1, kIntMax));
    } else if (key == "repetition_penalty") {
      request.sampling.repetition_penalty = float(read_number(value, key, sampling::kRepetitionPenaltyRange));
    } else if (key == "stream") {
      request.stream = read_bool(value, key);
    } else if (key == "stream_options") {
      stream_options = &value;
    } else if (key == "logprobs" && chat) {
      request.logprobs = read_bool(value, key);
    } else if (key == "logprobs") {
      request.logprobs = true;
      request.top_logprobs = int(read_integer(value, key, 0, kMaxTopLogprobs));
    } else if (key == "top_logprobs" && chat) {
      top_logprobs = &value;
    } else if (key == "response_format") {
      response_format_grammar = read_response_format(value, nlohmann::ordered_json::parse(body)[key]);
    } else if (key == "grammar") {
      given_grammar = read_grammar(value);
    } else if (key == "n" || key == "logit_bias" ||
               (chat && (key == "tools" || key == "tool_choice" || key == "functions")) ||
               (!chat && (key == "echo" || key == "best_of" || key == "suffix"))) {
      require_neutral(key, value);
    } else if (!contains(ignored_request_fields(), key)) {
      unknown(key);
    }
  }

  if (!has_input) missing(chat ? "messages" : "prompt");
  if (!response_format_grammar.empty() && !given_grammar.empty()) {
    invalid_value("grammar", "cannot be combined with a JSON 'response_format'.");
  }
  request.grammar = given_grammar.empty() ? std::move(response_format_grammar) : std::move(given_grammar);
  request.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (top_logprobs) {
    request.top_logprobs = int(read_integer(*top_logprobs, "top_logprobs", 0, kMaxTopLogprobs));
    if (!request.logprobs) {
      invalid_value("top_logprobs", "'logprobs' must be true when 'top_logprobs' is set.");
    }
  }
  if (stream_options) {
    if (!request.stream) invalid_value("stream_options", "only allowed when 'stream' is true.");
    if (!stream_options->is_object()) invalid_type("stream_options", "an object");
    for (const auto& [key, value] : stream_options->items()) {
      if (key != "include_usage") unsupported("stream_options." + key, "not supported.");
      if (!value.is_null())
        request.include_usage = read_bool(value, "stream_options.include_usage");
    }
  }
  return request;
}

const std::vector<std::string_view>& ignored_ollama_options() {
  static const std::vector<std::string_view> options = {
      "num_ctx",    "num_keep", "num_batch", "num_gpu", "main_gpu",
      "num_thread", "use_mmap", "use_mlock", "numa",    "low_vram",
  };
  return options;
}

CompletionRequest parse_ollama_request(OllamaEndpoint endpoint, std::string_view body) {
  const json root = parse_json_object(body);
  const bool chat = endpoint == OllamaEndpoint::Chat;
  CompletionRequest request = new_request(Endpoint::ChatCompletions);
  request.stream = true;  // Ollama streams unless told not to
  std::optional<std::string> prompt, system;
  bool raw = false;

  for (const auto& [key, value] : root.items()) {
    if (value.is_null()) continue;
    if (key == "model") {
      request.model = read_string(value, key);
    } else if (key == "messages" && chat) {
      request.messages = read_messages(value);
    } else if (key == "prompt" && !chat) {
      prompt = read_string(value, key);
    } else if (key == "system" && !chat) {
      system = read_string(value, key);
    } else if (key == "raw" && !chat) {
      raw = read_bool(value, key);
    } else if (key == "stream") {
      request.stream = read_bool(value, key);
    } else if (key == "options") {
      read_ollama_options(value, request);
    } else if (key == "format") {
      request.grammar = read_ollama_format(value, nlohmann::ordered_json::parse(body)[key]);
    } else if (key == "think" || key == "tools" || key == "images" ||
               key == "template" || key == "context" || key == "suffix") {
      require_off(key, value);
    } else if (key != "keep_alive") {  // how long Ollama keeps a model loaded; ours always is
      unknown(key);
    }
  }

  if (chat) {
    if (request.messages.empty()) missing("messages");
  } else if (!prompt) {
    missing("prompt");
  } else if (raw) {
    request.endpoint = Endpoint::Completions;
    request.prompt = std::move(*prompt);
  } else {
    if (system) request.messages.push_back({"system", std::move(*system)});
    request.messages.push_back({"user", std::move(*prompt)});
  }
  return request;
}

bool parse_drain_force(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return false;
  bool force = false;
  const json root = parse_json_object(body);
  for (const auto& [key, value] : root.items()) {
    if (key != "force") unknown(key);
    force = read_bool(value, key);
  }
  return force;
}

}  // namespace strata::api
