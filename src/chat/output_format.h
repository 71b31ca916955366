// How a model family writes tool calls and reasoning into its output, and reading them back out
// of it: the family is chosen from the chat template's text, the output is parsed whole or as it
// streams (text that may still become a marker is held back), and required_call_wrapper gives the
// literal text around a call's JSON arguments, where a constrained decoder attaches.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::chat {

enum class Family {
  None,      // no tool-call syntax known: the output is content (and <think> reasoning)
  Hermes,    // Qwen, Hermes: <tool_call>{"name": .., "arguments": {..}}</tool_call>
  QwenXml,   // Qwen3-Coder, Qwen3.5: <tool_call><function=name><parameter=k>v</parameter>...
  Llama3,    // {"name": .., "parameters": {..}} as the whole answer, or after <|python_tag|>
  Mistral,   // [TOOL_CALLS][{..}, ..] or [TOOL_CALLS]name[CALL_ID]id[ARGS]{..}
  Harmony,   // gpt-oss: channels, to=functions.NAME ... <|call|>
  DeepSeek,  // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{..}<｜tool▁call▁end｜>...
  Glm,       // <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
  Kimi,      // <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{..}...
};

// The family whose syntax the template writes for tool calls, from the markers in its text.
Family detect_family(std::string_view template_source);
// Whether the template writes reasoning between <think> and </think>.
bool uses_think_tags(std::string_view template_source);
// Whether the rendered prompt leaves the model inside its reasoning: it ends with an open <think>.
bool prompt_opens_reasoning(std::string_view rendered_prompt);

struct ToolCall {
  std::string id;         // the format's own id where it has one (Mistral, Kimi), else empty
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct OutputFormat {
  Family family = Family::None;
  bool think_tags = false;           // <think>...</think> is reasoning
  bool starts_in_reasoning = false;  // the prompt opened <think>
  bool parse_tool_calls = false;     // off: tool-call syntax stays content (tool_choice "none")
};

// What one piece of output added: text for the answer, text of the reasoning, and calls that
// are now complete (numbered from 0 in the order of the output).
struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;

  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(OutputDelta&& more);
};

class OutputParser {
 public:
  explicit OutputParser(OutputFormat format);

  OutputDelta push(std::string_view text);
  // The rest once the output has ended: held-back text, a call the end of output closes.
  OutputDelta finish();
  // Inside reasoning now (what has been pushed so far ends in it).
  bool in_reasoning() const {
    return state_ == State::Reasoning || (state_ == State::HarmonyBody && harmony_kind_ == HarmonyKind::Reasoning);
  }

 private:
  enum class State { Content, Reasoning, ToolRegion, BareJson, HarmonyHeader, HarmonyBody };
  enum class HarmonyKind { Reasoning, Content, Call };

  void step(bool final, OutputDelta& out);
  bool step_text(bool final, OutputDelta& out);
  bool step_tool_region(bool final, OutputDelta& out);
  bool step_harmony_header(bool final);
  bool step_harmony_body(bool final, OutputDelta& out);
  void emit_text(std::string text, OutputDelta& out);
  void emit_calls(std::vector<ToolCall> calls, OutputDelta& out);

  OutputFormat format_;
  State state_;
  std::string buffer_;            // pushed, not yet consumed
  std::string held_whitespace_;   // content whitespace that a following call would drop
  // After a marker: the whitespace the template writes around it is not the text's.
  bool trim_leading_;
  bool any_content_ = false;
  std::string region_opener_;     // the marker that opened the tool region
  HarmonyKind harmony_kind_ = HarmonyKind::Content;
  std::string harmony_recipient_;
  int calls_ = 0;
};

// Parses a whole output at once.
OutputDelta parse_output(const OutputFormat& format, std::string_view text);

// A call's id when the format gives none: "call_" and 24 letters and digits from the seed and
// the call's index (Mistral's templates want 9 letters and digits), so the same request with
// the same seed gives the same bytes.
std::string generated_call_id(Family family, uint64_t seed, int index);

// The literal text a required call of `name` is made of around its JSON arguments object:
// output before + arguments + after parses back as that one call. The one place where a
// constrained decoder attaches the arguments' schema. None for a family whose calls are not
// JSON arguments (GLM and Qwen's XML write key/value pairs) or that has no call syntax.
struct CallWrapper {
  std::string before;
  std::string after;
};
std::optional<CallWrapper> required_call_wrapper(Family family, std::string_view name);

}  // namespace strata::chat
