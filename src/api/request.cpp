#include "api/request.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "api/api_error.h"
#include "api/json_body.h"
#include "constrain/grammar.h"
#include "constrain/json_schema.h"
#include "engine/generator.h"

namespace strata::api {
namespace {

// Ordered: the tools and arguments reach the chat template with their keys in the client's order.
using json = nlohmann::ordered_json;

constexpr size_t kMaxStopStrings = 4;
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
    const std::string& kind = read_string(*type, part_param + ".type");
    if (kind == "image_url" || kind == "image" || kind == "input_image") {
      unsupported(part_param, "this model does not take images; send text parts only.");
    }
    if (kind != "text") unsupported(part_param + ".type", "only \"text\" content parts are supported.");
    for (const auto& [key, value] : part.items()) {
      if (key != "type" && key != "text") unsupported(part_param + "." + key, "not supported in content parts.");
    }
    auto part_text = part.find("text");
    if (part_text == part.end()) missing(part_param + ".text");
    text += read_string(*part_text, part_param + ".text");
  }
  return text;
}

enum class Dialect { OpenAi, Ollama };

// OpenAI: {"id", "type": "function", "function": {"name", "arguments": JSON text}}. Ollama:
// {"function": {"name", "arguments": {...}}}, without ids.
chat::ToolCall read_history_call(const json& call, const std::string& param, Dialect dialect) {
  if (!call.is_object()) invalid_type(param, "an object");
  chat::ToolCall result;
  const json* function = nullptr;
  for (const auto& [key, value] : call.items()) {
    if (value.is_null()) continue;
    if (key == "id") {
      result.id = read_string(value, param + ".id");
    } else if (key == "type") {
      if (read_string(value, param + ".type") != "function")
        unsupported(param + ".type", "only \"function\" tool calls are supported.");
    } else if (key == "function") {
      function = &value;
    } else if (!(dialect == Dialect::Ollama && key == "index")) {
      unsupported(param + "." + key, "not supported in tool calls.");
    }
  }
  if (dialect == Dialect::OpenAi && result.id.empty()) missing(param + ".id");
  if (!function) missing(param + ".function");
  const std::string function_param = param + ".function";
  if (!function->is_object()) invalid_type(function_param, "an object");
  auto name = function->find("name");
  if (name == function->end()) missing(function_param + ".name");
  result.name = read_string(*name, function_param + ".name");
  auto arguments = function->find("arguments");
  if (arguments == function->end() || arguments->is_null()) {
    result.arguments = "{}";
  } else if (dialect == Dialect::Ollama) {
    if (!arguments->is_object()) invalid_type(function_param + ".arguments", "an object");
    result.arguments = arguments->dump();
  } else {
    result.arguments = read_string(*arguments, function_param + ".arguments");
  }
  for (const auto& [key, value] : function->items()) {
    if (key != "name" && key != "arguments") unsupported(function_param + "." + key, "not supported in tool calls.");
  }
  return result;
}

ChatMessage read_message(const json& message, const std::string& param, Dialect dialect) {
  if (!message.is_object()) invalid_type(param, "an object");
  ChatMessage result;
  auto role = message.find("role");
  if (role == message.end()) missing(param + ".role");
  result.role = read_string(*role, param + ".role");
  if (result.role == "developer") result.role = "system";
  if (result.role != "system" && result.role != "user" && result.role != "assistant" && result.role != "tool") {
    unsupported(param + ".role",
                "'" + result.role + "' is not supported; use system, developer, user, assistant or tool.");
  }
  const bool assistant = result.role == "assistant", tool = result.role == "tool";
  bool has_content = false;
  for (const auto& [key, value] : message.items()) {
    if (value.is_null()) continue;  // null means absent
    const std::string key_param = param + "." + key;
    if (key == "role") continue;
    if (key == "content") {
      result.content = read_content(value, key_param);
      has_content = true;
    } else if (key == "name" || (dialect == Dialect::Ollama && key == "tool_name")) {
      result.name = read_string(value, key_param);
    } else if (assistant && key == (dialect == Dialect::Ollama ? "thinking" : "reasoning_content")) {
      result.reasoning_content = read_string(value, key_param);
    } else if (assistant && key == "tool_calls") {
      if (!value.is_array()) invalid_type(key_param, "an array");
      for (size_t i = 0; i < value.size(); ++i)
        result.tool_calls.push_back(read_history_call(value[i], element(key_param, i), dialect));
    } else if (assistant && key == "refusal" && dialect == Dialect::OpenAi) {
      read_string(value, key_param);  // a refusal the model gave; templates have no place for it
    } else if (tool && key == "tool_call_id" && dialect == Dialect::OpenAi) {
      result.tool_call_id = read_string(value, key_param);
    } else if (dialect == Dialect::Ollama && key == "images") {
      if (!value.is_array() || !value.empty())
        unsupported(key_param, "this model does not take images.");
    } else {
      unsupported(key_param, "not supported in " + result.role + " messages.");
    }
  }
  if (!has_content && !assistant) missing(param + ".content");
  if (tool && dialect == Dialect::OpenAi && result.tool_call_id.empty()) missing(param + ".tool_call_id");
  return result;
}

std::vector<ChatMessage> read_messages(const json& messages, Dialect dialect) {
  if (!messages.is_array()) invalid_type("messages", "an array");
  if (messages.empty()) invalid_value("messages", "must contain at least one message.");
  std::vector<ChatMessage> result;
  std::vector<std::string> call_ids;  // of the assistant's calls so far
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string param = element("messages", i);
    ChatMessage message = read_message(messages[i], param, dialect);
    for (const auto& call : message.tool_calls) call_ids.push_back(call.id);
    if (message.role == "tool" && dialect == Dialect::OpenAi &&
        std::find(call_ids.begin(), call_ids.end(), message.tool_call_id) == call_ids.end()) {
      invalid_value(param + ".tool_call_id",
                    "'" + message.tool_call_id + "' answers no tool call of an earlier assistant message.");
    }
    result.push_back(std::move(message));
  }
  return result;
}

// OpenAI's function names: letters, digits, underscores and dashes, at most 64.
bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

json read_tools(const json& tools) {
  if (!tools.is_array()) invalid_type("tools", "an array");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& tool = tools[i];
    const std::string param = element("tools", i);
    if (!tool.is_object()) invalid_type(param, "an object");
    auto type = tool.find("type");
    if (type == tool.end()) missing(param + ".type");
    if (read_string(*type, param + ".type") != "function")
      unsupported(param + ".type", "only \"function\" tools are supported.");
    auto function = tool.find("function");
    if (function == tool.end()) missing(param + ".function");
    for (const auto& [key, value] : tool.items())
      if (key != "type" && key != "function") unsupported(param + "." + key, "not supported in tools.");
    const std::string function_param = param + ".function";
    if (!function->is_object()) invalid_type(function_param, "an object");
    auto name = function->find("name");
    if (name == function->end()) missing(function_param + ".name");
    const std::string& tool_name = read_string(*name, function_param + ".name");
    if (!valid_function_name(tool_name))
      invalid_value(function_param + ".name",
                    "must be 1 to 64 letters, digits, underscores, dots or dashes.");
    if (std::find(names.begin(), names.end(), tool_name) != names.end())
      invalid_value(function_param + ".name", "'" + tool_name + "' names two tools.");
    names.push_back(tool_name);
    for (const auto& [key, value] : function->items()) {
      const std::string key_param = function_param + "." + key;
      if (key == "name" || value.is_null()) continue;
      if (key == "description") {
        read_string(value, key_param);
      } else if (key == "parameters") {
        if (!value.is_object()) invalid_type(key_param, "an object (a JSON schema)");
      } else if (key == "strict") {
        read_bool(value, key_param);
      } else {
        unsupported(key_param, "not supported in functions.");
      }
    }
  }
  return tools;
}

ToolChoice read_tool_choice(const json& choice) {
  if (choice.is_string()) {
    const std::string& mode = choice.get_ref<const std::string&>();
    if (mode == "auto") return {ToolChoice::Mode::Auto, {}};
    if (mode == "none") return {ToolChoice::Mode::None, {}};
    if (mode == "required") return {ToolChoice::Mode::Required, {}};
    invalid_value("tool_choice", "must be \"auto\", \"none\", \"required\" or a function.");
  }
  if (!choice.is_object()) invalid_type("tool_choice", "a string or an object");
  auto type = choice.find("type");
  if (type == choice.end()) missing("tool_choice.type");
  if (read_string(*type, "tool_choice.type") != "function")
    unsupported("tool_choice.type", "only \"function\" is supported.");
  auto function = choice.find("function");
  if (function == choice.end()) missing("tool_choice.function");
  if (!function->is_object()) invalid_type("tool_choice.function", "an object");
  auto name = function->find("name");
  if (name == function->end()) missing("tool_choice.function.name");
  return {ToolChoice::Mode::Function, read_string(*name, "tool_choice.function.name")};
}

// A named or required call needs tools to call.
void check_tool_choice(const CompletionRequest& request) {
  using Mode = ToolChoice::Mode;
  const auto& choice = request.tool_choice;
  if (choice.mode == Mode::Required && request.tools.empty())
    invalid_value("tool_choice", "\"required\" needs at least one tool in 'tools'.");
  if (choice.mode != Mode::Function) return;
  for (const auto& tool : request.tools)
    if (tool["function"]["name"] == choice.function) return;
  invalid_value("tool_choice.function.name", "'" + choice.function + "' is not among the tools given.");
}

// Names the template is given already; a kwarg of the same name cannot replace them.
void read_template_kwargs(const json& kwargs, CompletionRequest& request) {
  if (!kwargs.is_object()) invalid_type("chat_template_kwargs", "an object");
  for (const auto& [key, value] : kwargs.items()) {
    if (key == "messages" || key == "tools" || key == "add_generation_prompt" || key == "bos_token" ||
        key == "eos_token") {
      invalid_value("chat_template_kwargs." + key, "is set by the server.");
    }
    request.template_kwargs[key] = value;
  }
}

void read_reasoning_effort(const json& value, const std::string& param, CompletionRequest& request) {
  const std::string& effort = read_string(value, param);
  if (effort != "minimal" && effort != "low" && effort != "medium" && effort != "high")
    invalid_value(param, "must be \"minimal\", \"low\", \"medium\" or \"high\".");
  request.template_kwargs["reasoning_effort"] = effort;
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
  } else if (param == "functions") {
    if (!value.is_array()) invalid_type(param, "an array");
    neutral = value.empty();
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
// "json_schema": {"name", "schema", "strict", "description"}}, as the grammar it stands for; the
// schema's properties are generated in the body's order.
std::string read_response_format(const json& value) {
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
  return schema_grammar(spec["schema"], "response_format.json_schema.schema");
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
std::string read_ollama_format(const json& value) {
  if (value == "") return {};
  if (value == "json") return constrain::json_object_grammar();
  if (!value.is_object()) invalid_value("format", "must be \"json\" or a JSON schema.");
  return schema_grammar(value, "format");
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
      "user", "store", "metadata", "service_tier", "prediction",
  };
  return fields;
}

CompletionRequest parse_completion_request(Endpoint endpoint, std::string_view body) {
  const json root = parse_ordered_json_object(body);
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
        request.messages = read_messages(value, Dialect::OpenAi);
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
    } else if (chat && key == "tools") {
      request.tools = read_tools(value);
    } else if (chat && key == "tool_choice") {
      request.tool_choice = read_tool_choice(value);
    } else if (chat && key == "parallel_tool_calls") {
      request.parallel_tool_calls = read_bool(value, key);
    } else if (chat && key == "chat_template_kwargs") {
      read_template_kwargs(value, request);
    } else if (chat && key == "enable_thinking") {
      request.template_kwargs["enable_thinking"] = read_bool(value, key);
    } else if (chat && key == "reasoning_effort") {
      read_reasoning_effort(value, key, request);
    } else if (key == "response_format") {
      response_format_grammar = read_response_format(value);
    } else if (key == "grammar") {
      given_grammar = read_grammar(value);
    } else if (key == "n" || key == "logit_bias" || (chat && key == "functions") ||
               (!chat && (key == "echo" || key == "best_of" || key == "suffix"))) {
      require_neutral(key, value);
    } else if (!contains(ignored_request_fields(), key)) {
      unknown(key);
    }
  }

  if (!has_input) missing(chat ? "messages" : "prompt");
  check_tool_choice(request);
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
  const json root = parse_ordered_json_object(body);
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
      request.messages = read_messages(value, Dialect::Ollama);
    } else if (key == "tools" && chat) {
      request.tools = read_tools(value);
    } else if (key == "think" && chat) {
      // true or false, or gpt-oss's effort: "low", "medium" or "high"
      if (value.is_boolean()) {
        request.template_kwargs["enable_thinking"] = value.get<bool>();
      } else {
        read_reasoning_effort(value, key, request);
      }
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
      request.grammar = read_ollama_format(value);
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
    if (system) request.messages.push_back({"system", std::move(*system), {}, {}, {}, {}});
    request.messages.push_back({"user", std::move(*prompt), {}, {}, {}, {}});
  }
  return request;
}

std::optional<std::string> parse_ollama_show_model(std::string_view body) {
  std::optional<std::string> model;
  const json root = parse_ordered_json_object(body);
  for (const auto& [key, value] : root.items()) {
    if (key == "model" || key == "name") {
      model = read_string(value, key);
    } else if (key == "verbose") {
      read_bool(value, key);  // every scalar is shown; arrays never are
    } else {
      unknown(key);
    }
  }
  return model;
}

bool parse_drain_force(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return false;
  bool force = false;
  const json root = parse_ordered_json_object(body);
  for (const auto& [key, value] : root.items()) {
    if (key != "force") unknown(key);
    force = read_bool(value, key);
  }
  return force;
}

}  // namespace strata::api
