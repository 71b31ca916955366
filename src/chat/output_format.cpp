#include "chat/output_format.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

namespace strata::chat {
namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kDeepSeekCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDeepSeekCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDeepSeekCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDeepSeekCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDeepSeekSep = "<｜tool▁sep｜>";
constexpr std::string_view kXmlFunction = "<function=";
constexpr std::string_view kXmlFunctionEnd = "</function>";
constexpr std::string_view kXmlParameter = "<parameter=";
constexpr std::string_view kXmlParameterEnd = "</parameter>";
constexpr std::string_view kGlmKeyOpen = "<arg_key>";
constexpr std::string_view kGlmKeyClose = "</arg_key>";
constexpr std::string_view kGlmValueOpen = "<arg_value>";
constexpr std::string_view kGlmValueClose = "</arg_value>";
constexpr std::string_view kKimiSectionBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kKimiSectionEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kKimiCallBegin = "<|tool_call_begin|>";
constexpr std::string_view kKimiArgumentBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kKimiCallEnd = "<|tool_call_end|>";
constexpr std::string_view kHarmonyStart = "<|start|>";
constexpr std::string_view kHarmonyChannel = "<|channel|>";
constexpr std::string_view kHarmonyMessage = "<|message|>";
constexpr std::string_view kHarmonyConstrain = "<|constrain|>";
constexpr std::string_view kHarmonyEnds[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
// A header longer than this without <|message|> is no header: the model wrote plain text.
constexpr size_t kMaxHarmonyHeader = 256;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The opening marker of a family's tool-call region, and its closing one (empty: the region
// runs to the end of the output).
std::string_view region_open(Family family) {
  switch (family) {
    case Family::Hermes:
    case Family::QwenXml:
    case Family::Glm:
      return kHermesOpen;
    case Family::Llama3:
      return kPythonTag;
    case Family::Mistral:
      return kMistralCalls;
    case Family::DeepSeek:
      return kDeepSeekCallsBegin;
    case Family::Kimi:
      return kKimiSectionBegin;
    case Family::None:
    case Family::Harmony:
      break;
  }
  return {};
}

std::string_view region_close(Family family) {
  switch (family) {
    case Family::Hermes:
    case Family::QwenXml:
    case Family::Glm:
      return kHermesClose;
    case Family::DeepSeek:
      return kDeepSeekCallsEnd;
    case Family::Kimi:
      return kKimiSectionEnd;
    default:
      return {};
  }
}

struct Found {
  size_t at = std::string::npos;
  std::string_view marker;
};

Found earliest(std::string_view text, std::initializer_list<std::string_view> markers) {
  Found found;
  for (auto marker : markers) {
    if (marker.empty()) continue;
    size_t at = text.find(marker);
    if (at < found.at) found = {at, marker};
  }
  return found;
}

// The length of the longest end of `text` that is the start of one of the markers.
size_t possible_marker_prefix(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t longest = 0;
  for (auto marker : markers) {
    if (marker.empty()) continue;
    for (size_t length = std::min(marker.size() - 1, text.size()); length > longest; --length) {
      if (text.substr(text.size() - length) == marker.substr(0, length)) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

std::optional<json> parse_json(std::string_view text) {
  json value = json::parse(text, nullptr, false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Arguments as JSON text of an object: an object as it is, a string holding one parsed first.
std::optional<std::string> arguments_text(const json& arguments) {
  if (arguments.is_object()) return dump(arguments);
  if (arguments.is_string()) {
    auto parsed = parse_json(arguments.get<std::string>());
    if (parsed && parsed->is_object()) return dump(*parsed);
  }
  return std::nullopt;
}

std::optional<std::string> arguments_in(std::string_view text) {
  auto parsed = parse_json(trim(text));
  if (!parsed || !parsed->is_object()) return std::nullopt;
  return dump(*parsed);
}

// {"name": .., "arguments" or "parameters": {..}, "id"?: ..}
std::optional<ToolCall> call_from_object(const json& object) {
  if (!object.is_object()) return std::nullopt;
  auto name = object.find("name");
  if (name == object.end() || !name->is_string()) return std::nullopt;
  auto arguments = object.find("arguments");
  if (arguments == object.end()) arguments = object.find("parameters");
  std::optional<std::string> text = arguments == object.end() ? std::optional<std::string>("{}")
                                                              : arguments_text(*arguments);
  if (!text) return std::nullopt;
  ToolCall call{{}, name->get<std::string>(), *text};
  auto id = object.find("id");
  if (id != object.end() && id->is_string()) call.id = id->get<std::string>();
  return call;
}

using Calls = std::vector<ToolCall>;

std::optional<Calls> hermes_calls(std::string_view body) {
  auto object = parse_json(trim(body));
  if (!object) return std::nullopt;
  auto call = call_from_object(*object);
  if (!call) return std::nullopt;
  return Calls{*call};
}

// Llama 3: one object, or several separated by semicolons.
std::optional<Calls> llama_json_calls(std::string_view body) {
  Calls calls;
  body = trim(body);
  if (auto whole = parse_json(body)) {
    auto call = call_from_object(*whole);
    if (!call) return std::nullopt;
    return Calls{*call};
  }
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.find(';', start);
    if (end == std::string_view::npos) end = body.size();
    auto object = parse_json(trim(body.substr(start, end - start)));
    if (!object) return std::nullopt;
    auto call = call_from_object(*object);
    if (!call) return std::nullopt;
    calls.push_back(*call);
    start = end + 1;
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// Llama 3's built-in tools after <|python_tag|>: name.call(key="value", ...).
std::optional<Calls> llama_builtin_call(std::string_view body) {
  body = trim(body);
  size_t open = body.find(".call(");
  if (open == std::string_view::npos || body.back() != ')') return std::nullopt;
  ToolCall call{{}, std::string(trim(body.substr(0, open))), {}};
  std::string_view rest = body.substr(open + 6, body.size() - open - 7);
  json arguments = json::object();
  while (!trim(rest).empty()) {
    rest = trim(rest);
    size_t equals = rest.find('=');
    if (equals == std::string_view::npos) return std::nullopt;
    std::string key(trim(rest.substr(0, equals)));
    rest = trim(rest.substr(equals + 1));
    size_t end = 0;
    if (!rest.empty() && rest[0] == '"') {
      end = 1;
      while (end < rest.size() && rest[end] != '"') end += rest[end] == '\\' ? 2 : 1;
      if (end >= rest.size()) return std::nullopt;
      auto value = parse_json(rest.substr(0, end + 1));
      arguments[key] = value ? *value : json(std::string(rest.substr(1, end - 1)));
      ++end;
    } else {
      end = std::min(rest.find(','), rest.size());
      std::string_view raw = trim(rest.substr(0, end));
      auto value = parse_json(raw);
      arguments[key] = value ? *value : json(std::string(raw));
    }
    rest = rest.substr(end);
    rest = trim(rest);
    if (!rest.empty() && rest[0] == ',') rest.remove_prefix(1);
  }
  call.arguments = dump(arguments);
  return Calls{call};
}

std::optional<Calls> llama_calls(std::string_view body) {
  if (auto calls = llama_json_calls(body)) return calls;
  return llama_builtin_call(body);
}

// Each segment is name[ARGS]{..} or name[CALL_ID]id[ARGS]{..}; or the whole is a JSON array.
std::optional<Calls> mistral_calls(std::string_view body) {
  body = trim(body);
  Calls calls;
  if (!body.empty() && body[0] == '[') {
    auto array = parse_json(body);
    if (!array || !array->is_array() || array->empty()) return std::nullopt;
    for (const auto& item : *array) {
      auto call = call_from_object(item);
      if (!call) return std::nullopt;
      calls.push_back(*call);
    }
    return calls;
  }
  size_t start = 0;
  while (start <= body.size()) {
    size_t end = body.find(kMistralCalls, start);
    std::string_view segment = body.substr(start, end == std::string_view::npos ? end : end - start);
    size_t args = segment.find(kMistralArgs);
    if (args == std::string_view::npos) return std::nullopt;
    std::string_view head = segment.substr(0, args);
    ToolCall call;
    if (size_t id = head.find(kMistralCallId); id != std::string_view::npos) {
      call.id = std::string(trim(head.substr(id + kMistralCallId.size())));
      head = head.substr(0, id);
    }
    call.name = std::string(trim(head));
    auto arguments = arguments_in(segment.substr(args + kMistralArgs.size()));
    if (call.name.empty() || !arguments) return std::nullopt;
    call.arguments = *arguments;
    calls.push_back(std::move(call));
    if (end == std::string_view::npos) break;
    start = end + kMistralCalls.size();
  }
  return calls;
}

// The parts between `begin` and `end` markers, in order.
std::vector<std::string_view> delimited(std::string_view text, std::string_view begin,
                                        std::string_view end) {
  std::vector<std::string_view> parts;
  size_t at = 0;
  while ((at = text.find(begin, at)) != std::string_view::npos) {
    at += begin.size();
    size_t stop = text.find(end, at);
    parts.push_back(text.substr(at, stop == std::string_view::npos ? stop : stop - at));
    if (stop == std::string_view::npos) break;
    at = stop + end.size();
  }
  return parts;
}

// V3.1: name<｜tool▁sep｜>{..}; R1 and V3: function<｜tool▁sep｜>name\n```json\n{..}\n```.
std::optional<Calls> deepseek_calls(std::string_view body) {
  Calls calls;
  for (auto part : delimited(body, kDeepSeekCallBegin, kDeepSeekCallEnd)) {
    size_t sep = part.find(kDeepSeekSep);
    if (sep == std::string_view::npos) return std::nullopt;
    std::string_view left = part.substr(0, sep), right = part.substr(sep + kDeepSeekSep.size());
    ToolCall call;
    constexpr std::string_view kFence = "```json";
    if (size_t fence = right.find(kFence); fence != std::string_view::npos) {
      call.name = std::string(trim(right.substr(0, fence)));
      std::string_view arguments = right.substr(fence + kFence.size());
      size_t close = arguments.rfind("```");
      if (close != std::string_view::npos) arguments = arguments.substr(0, close);
      right = arguments;
    } else {
      call.name = std::string(trim(left));
    }
    auto arguments = arguments_in(right);
    if (call.name.empty() || !arguments) return std::nullopt;
    call.arguments = *arguments;
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// A value a template wrote as text: strings as they are, other values as JSON (GLM) or as
// Python's str() (Qwen's XML: True, False, None). So a value that reads as JSON other than a
// string is taken as that JSON ("3" comes back as 3), and Python's constants as theirs.
json written_value(std::string_view text) {
  if (text == "True" || text == "False") return text == "True";
  if (text == "None") return nullptr;
  auto value = parse_json(text);
  return value && !value->is_string() ? *value : json(std::string(text));
}

// name, then <arg_key>k</arg_key><arg_value>v</arg_value> pairs.
std::optional<Calls> glm_calls(std::string_view body) {
  size_t first_key = body.find(kGlmKeyOpen);
  ToolCall call{{}, std::string(trim(body.substr(0, first_key))), {}};
  if (call.name.empty()) return std::nullopt;
  json arguments = json::object();
  auto keys = delimited(body, kGlmKeyOpen, kGlmKeyClose);
  auto values = delimited(body, kGlmValueOpen, kGlmValueClose);
  if (keys.size() != values.size()) return std::nullopt;
  for (size_t i = 0; i < keys.size(); ++i) arguments[std::string(keys[i])] = written_value(values[i]);
  call.arguments = dump(arguments);
  return Calls{call};
}

// <function=name><parameter=k>\nv\n</parameter>...</function>, the value between one newline
// on each side.
std::optional<Calls> qwen_xml_calls(std::string_view body) {
  body = trim(body);
  if (!body.starts_with(kXmlFunction) || !body.ends_with(kXmlFunctionEnd)) return std::nullopt;
  const size_t name_end = body.find('>');
  ToolCall call{{}, std::string(trim(body.substr(kXmlFunction.size(), name_end - kXmlFunction.size()))), {}};
  if (call.name.empty()) return std::nullopt;
  const std::string_view parameters = body.substr(name_end + 1, body.size() - kXmlFunctionEnd.size() - name_end - 1);
  json arguments = json::object();
  size_t at = 0;
  while ((at = parameters.find(kXmlParameter, at)) != std::string_view::npos) {
    at += kXmlParameter.size();
    const size_t key_end = parameters.find('>', at);
    if (key_end == std::string_view::npos) return std::nullopt;
    const size_t value_end = parameters.find(kXmlParameterEnd, key_end);
    if (value_end == std::string_view::npos) return std::nullopt;
    std::string_view value = parameters.substr(key_end + 1, value_end - key_end - 1);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    arguments[std::string(parameters.substr(at, key_end - at))] = written_value(value);
    at = value_end + kXmlParameterEnd.size();
  }
  call.arguments = dump(arguments);
  return Calls{call};
}

// <|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{..}<|tool_call_end|>
std::optional<Calls> kimi_calls(std::string_view body) {
  Calls calls;
  for (auto part : delimited(body, kKimiCallBegin, kKimiCallEnd)) {
    size_t arguments_at = part.find(kKimiArgumentBegin);
    if (arguments_at == std::string_view::npos) return std::nullopt;
    ToolCall call;
    call.id = std::string(trim(part.substr(0, arguments_at)));
    std::string_view name = call.id;
    if (name.starts_with("functions.")) name.remove_prefix(10);
    if (size_t colon = name.rfind(':'); colon != std::string_view::npos) name = name.substr(0, colon);
    call.name = std::string(name);
    auto arguments = arguments_in(part.substr(arguments_at + kKimiArgumentBegin.size()));
    if (call.name.empty() || !arguments) return std::nullopt;
    call.arguments = *arguments;
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

std::optional<Calls> region_calls(Family family, std::string_view body) {
  switch (family) {
    case Family::Hermes:
      return hermes_calls(body);
    case Family::QwenXml:
      return qwen_xml_calls(body);
    case Family::Glm:
      return glm_calls(body);
    case Family::Llama3:
      return llama_calls(body);
    case Family::Mistral:
      return mistral_calls(body);
    case Family::DeepSeek:
      return deepseek_calls(body);
    case Family::Kimi:
      return kimi_calls(body);
    default:
      return std::nullopt;
  }
}

// The value of `key` in a harmony header (`to=functions.x`, `<|channel|>analysis`): up to a
// space or the next marker.
std::string header_value(std::string_view header, std::string_view key) {
  size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  std::string_view rest = header.substr(at + key.size());
  size_t end = std::min(rest.find(' '), rest.find("<|"));
  return std::string(trim(rest.substr(0, end)));
}

}  // namespace

Family detect_family(std::string_view source) {
  // The most specific markers first: GLM and Hermes share <tool_call>.
  if (contains(source, kHarmonyChannel) && contains(source, kHarmonyMessage)) return Family::Harmony;
  if (contains(source, kDeepSeekCallsBegin)) return Family::DeepSeek;
  if (contains(source, kKimiSectionBegin)) return Family::Kimi;
  if (contains(source, kGlmKeyOpen)) return Family::Glm;
  if (contains(source, kMistralCalls)) return Family::Mistral;
  if (contains(source, kHermesOpen) && contains(source, kXmlFunction)) return Family::QwenXml;
  if (contains(source, kHermesOpen)) return Family::Hermes;
  if (contains(source, "<|start_header_id|>") && contains(source, "\"parameters\": ")) return Family::Llama3;
  return Family::None;
}

bool uses_think_tags(std::string_view source) { return contains(source, kThinkClose); }

bool prompt_opens_reasoning(std::string_view prompt) {
  std::string_view text = trim(prompt);
  return text.ends_with(kThinkOpen);
}

void OutputDelta::append(OutputDelta&& more) {
  content += more.content;
  reasoning += more.reasoning;
  std::move(more.tool_calls.begin(), more.tool_calls.end(), std::back_inserter(tool_calls));
}

OutputParser::OutputParser(OutputFormat format)
    : format_(format),
      state_(format.family == Family::Harmony ? State::HarmonyHeader
             : format.starts_in_reasoning     ? State::Reasoning
                                              : State::Content),
      trim_leading_(state_ == State::Reasoning) {}

OutputDelta OutputParser::push(std::string_view text) {
  buffer_ += text;
  OutputDelta out;
  step(false, out);
  return out;
}

OutputDelta OutputParser::finish() {
  OutputDelta out;
  step(true, out);
  if (!held_whitespace_.empty() && state_ == State::Content) out.content += held_whitespace_;
  held_whitespace_.clear();
  return out;
}

void OutputParser::step(bool final, OutputDelta& out) {
  while (true) {
    bool progress = false;
    switch (state_) {
      case State::Content:
      case State::Reasoning:
        progress = step_text(final, out);
        break;
      case State::ToolRegion:
      case State::BareJson:
        progress = step_tool_region(final, out);
        break;
      case State::HarmonyHeader:
        progress = step_harmony_header(final);
        break;
      case State::HarmonyBody:
        progress = step_harmony_body(final, out);
        break;
    }
    if (!progress) return;
  }
}

void OutputParser::emit_text(std::string text, OutputDelta& out) {
  const bool reasoning = state_ == State::Reasoning ||
                         (state_ == State::HarmonyBody && harmony_kind_ == HarmonyKind::Reasoning);
  if (state_ == State::HarmonyBody) {
    (reasoning ? out.reasoning : out.content) += text;
    return;
  }
  // Around <think> blocks and calls the templates write newlines of their own: leading and
  // trailing whitespace there is theirs, not the text's.
  if (trim_leading_) {
    size_t first = 0;
    while (first < text.size() && is_space(text[first])) ++first;
    text.erase(0, first);
  }
  if (text.empty()) return;
  size_t last = text.size();
  while (last > 0 && is_space(text[last - 1])) --last;
  if (last == 0) {
    held_whitespace_ += text;
    return;
  }
  std::string shown = held_whitespace_ + text.substr(0, last);
  held_whitespace_ = text.substr(last);
  trim_leading_ = false;
  if (reasoning) {
    out.reasoning += shown;
  } else {
    out.content += shown;
    any_content_ = true;
  }
}

void OutputParser::emit_calls(std::vector<ToolCall> calls, OutputDelta& out) {
  for (auto& call : calls) {
    out.tool_calls.push_back(std::move(call));
    ++calls_;
  }
}

bool OutputParser::step_text(bool final, OutputDelta& out) {
  const bool reasoning = state_ == State::Reasoning;
  const std::string_view open = format_.parse_tool_calls ? region_open(format_.family) : "";
  // A prompt may open reasoning even where the family's output has no <think> of its own.
  const std::string_view think = reasoning ? kThinkClose : format_.think_tags ? kThinkOpen : "";
  const std::string_view region = reasoning ? "" : open;

  // Llama 3 answers with a bare JSON object when it calls a tool.
  if (!reasoning && format_.parse_tool_calls && format_.family == Family::Llama3 && !any_content_ &&
      calls_ == 0) {
    size_t first = buffer_.find_first_not_of(" \t\r\n");
    if (first == std::string::npos && !final) return false;
    if (first != std::string::npos && buffer_[first] == '{') {
      state_ = State::BareJson;
      return true;
    }
  }

  Found found = earliest(buffer_, {think, region});
  if (found.at == std::string::npos) {
    size_t keep = final ? 0 : possible_marker_prefix(buffer_, {think, region});
    if (buffer_.size() == keep) return false;
    emit_text(buffer_.substr(0, buffer_.size() - keep), out);
    buffer_.erase(0, buffer_.size() - keep);
    return false;
  }
  emit_text(buffer_.substr(0, found.at), out);
  buffer_.erase(0, found.at + found.marker.size());
  held_whitespace_.clear();
  trim_leading_ = true;
  if (found.marker == region && !region.empty()) {
    region_opener_ = std::string(found.marker);
    state_ = State::ToolRegion;
  } else {
    state_ = reasoning ? State::Content : State::Reasoning;
  }
  return true;
}

bool OutputParser::step_tool_region(bool final, OutputDelta& out) {
  const std::string_view close = state_ == State::BareJson ? "" : region_close(format_.family);
  size_t end = close.empty() ? std::string::npos : buffer_.find(close);
  if (end == std::string::npos && !final) return false;
  std::string body = buffer_.substr(0, end);
  buffer_.erase(0, end == std::string::npos ? buffer_.size() : end + close.size());
  auto calls = state_ == State::BareJson ? llama_json_calls(body) : region_calls(format_.family, body);
  const std::string opener = state_ == State::BareJson ? "" : region_opener_;
  state_ = State::Content;
  trim_leading_ = true;
  if (calls) {
    emit_calls(std::move(*calls), out);
  } else {
    // Not a call after all: the model's text is shown as it wrote it.
    emit_text(opener + body + std::string(end == std::string::npos ? "" : close), out);
  }
  return true;
}

bool OutputParser::step_harmony_header(bool final) {
  size_t end = buffer_.find(kHarmonyMessage);
  if (end == std::string::npos || end > kMaxHarmonyHeader) {
    // Decided only once <|message|> can no longer start within the header's length, so that
    // text read in pieces is read as it is whole.
    if (!final && buffer_.size() < kMaxHarmonyHeader + kHarmonyMessage.size()) return false;
    if (buffer_.empty()) return false;
    harmony_kind_ = HarmonyKind::Content;  // no header: the model wrote plain text
    state_ = State::HarmonyBody;
    return true;
  }
  std::string header = buffer_.substr(0, end);
  buffer_.erase(0, end + kHarmonyMessage.size());
  const std::string channel = header_value(header, kHarmonyChannel);
  harmony_recipient_ = header_value(header, "to=");
  if (harmony_recipient_.starts_with("functions.") && format_.parse_tool_calls) {
    harmony_kind_ = HarmonyKind::Call;
    harmony_recipient_.erase(0, 10);
  } else if (channel == "analysis") {
    harmony_kind_ = HarmonyKind::Reasoning;
  } else {
    harmony_kind_ = HarmonyKind::Content;
  }
  state_ = State::HarmonyBody;
  return true;
}

bool OutputParser::step_harmony_body(bool final, OutputDelta& out) {
  const auto& ends = kHarmonyEnds;
  Found found = earliest(buffer_, {ends[0], ends[1], ends[2], ends[3]});
  if (harmony_kind_ == HarmonyKind::Call) {
    if (found.at == std::string::npos && !final) return false;
    std::string body = buffer_.substr(0, found.at);
    auto arguments = arguments_in(body);
    if (arguments) {
      emit_calls({ToolCall{{}, harmony_recipient_, *arguments}}, out);
    } else {
      out.content += body;
    }
  } else if (found.at == std::string::npos) {
    size_t keep = final ? 0 : possible_marker_prefix(buffer_, {ends[0], ends[1], ends[2], ends[3]});
    if (buffer_.size() == keep) return false;
    emit_text(buffer_.substr(0, buffer_.size() - keep), out);
    buffer_.erase(0, buffer_.size() - keep);
    return false;
  } else {
    emit_text(buffer_.substr(0, found.at), out);
  }
  if (found.at == std::string::npos) {
    buffer_.clear();
  } else {
    // <|start|> opens the next message's header and the end markers close this one; a
    // <|start|> right at the beginning is consumed, or a body without a header would never end.
    const bool keep_start = found.marker == kHarmonyStart && found.at > 0;
    buffer_.erase(0, found.at + (keep_start ? 0 : found.marker.size()));
  }
  state_ = State::HarmonyHeader;
  return true;
}

OutputDelta parse_output(const OutputFormat& format, std::string_view text) {
  OutputParser parser(format);
  OutputDelta out = parser.push(text);
  out.append(parser.finish());
  return out;
}

std::string generated_call_id(Family family, uint64_t seed, int index) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  // splitmix64 over the seed and the index: well mixed, and the same everywhere.
  uint64_t state = seed ^ (0x9e3779b97f4a7c15ull * uint64_t(index + 1));
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const bool mistral = family == Family::Mistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlphabet[next() % kAlphabet.size()];
  return id;
}

std::optional<CallWrapper> required_call_wrapper(Family family, std::string_view name) {
  const std::string n(name);
  switch (family) {
    case Family::Hermes:
      return CallWrapper{"<tool_call>\n{\"name\": \"" + n + "\", \"arguments\": ", "}\n</tool_call>"};
    case Family::Llama3:
      return CallWrapper{"{\"name\": \"" + n + "\", \"parameters\": ", "}"};
    case Family::Mistral:
      return CallWrapper{std::string(kMistralCalls) + n + std::string(kMistralArgs), ""};
    case Family::Harmony:
      return CallWrapper{"<|channel|>commentary to=functions." + n + " " + std::string(kHarmonyConstrain) +
                             "json" + std::string(kHarmonyMessage),
                         "<|call|>"};
    case Family::DeepSeek:
      return CallWrapper{std::string(kDeepSeekCallsBegin) + std::string(kDeepSeekCallBegin) + n +
                             std::string(kDeepSeekSep),
                         std::string(kDeepSeekCallEnd) + std::string(kDeepSeekCallsEnd)};
    case Family::Kimi:
      return CallWrapper{std::string(kKimiSectionBegin) + std::string(kKimiCallBegin) + "functions." + n +
                             ":0" + std::string(kKimiArgumentBegin),
                         std::string(kKimiCallEnd) + std::string(kKimiSectionEnd)};
    case Family::Glm:
    case Family::QwenXml:
    case Family::None:
      break;
  }
  return std::nullopt;
}

}  // namespace strata::chat
