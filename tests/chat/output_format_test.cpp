// Tool calls and reasoning round-trip: an assistant message rendered by a family's real chat
// template is read back by that family's parser, whole and streamed in small pieces, as the
// same calls, reasoning and content.
#include "chat/output_format.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "template/jinja.h"

namespace strata::chat {
namespace {

using json = nlohmann::ordered_json;

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/templates/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                  "days": {"type": "integer"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "search", "description": "Search the web",
   "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}])");

struct Case {
  std::string template_name;
  Family family;
  int calls = 2;                  // some templates render one call per message only
  bool with_reasoning = false;    // the template renders the message's reasoning
  bool format_has_ids = false;    // the call ids are written into the text
  std::string id_style = "call";  // "call": call00001...; "kimi": functions.name:index
  std::string content;            // text before the calls
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.template_name; }

std::string call_id(int index) { return "call0000" + std::to_string(index + 1); }  // 9 characters

json calls_json(int count) {
  json calls = json::array();
  const json arguments[] = {json::parse(R"({"city": "Paris", "days": 3})"),
                            json::parse(R"({"query": "llamas «grand» 🦙"})")};
  const char* names[] = {"get_weather", "search"};
  for (int i = 0; i < count; ++i) {
    calls.push_back({{"id", call_id(i)},
                     {"type", "function"},
                     {"function", {{"name", names[i]}, {"arguments", arguments[i]}}}});
  }
  return calls;
}

std::string render(const std::string& source, const json& messages, bool generation_prompt,
                   const json& extra = json::object()) {
  json context = {{"messages", messages}, {"tools", kTools},
                  {"add_generation_prompt", generation_prompt}, {"bos_token", "<s>"},
                  {"eos_token", "</s>"}};
  for (const auto& [key, value] : extra.items()) context[key] = value;
  std::tm now{};
  now.tm_year = 126;
  now.tm_mday = 1;
  return jinja::Template(source).render(context, now);
}

// What the model would have produced: the assistant's part of the rendered conversation, after
// the generation prompt, without the end-of-turn markers the engine stops at. Where the prompt
// opens <think> and the history (which drops old reasoning) does not, the part starts after the
// prompt's <think>'s place: the model's reasoning would have ended there.
struct ModelOutput {
  std::string text;
  bool follows_whole_prompt = true;
};

ModelOutput assistant_output(const std::string& prompt, const std::string& conversation) {
  size_t common = 0;
  while (common < prompt.size() && common < conversation.size() && prompt[common] == conversation[common])
    ++common;
  const bool whole = common == prompt.size();
  if (!whole) common = std::min(common, prompt.rfind("<think>"));
  std::string output = conversation.substr(common);
  const std::string ends[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<｜end▁of▁sentence｜>",
                              "<｜Assistant｜>", "<|end|>", "<|return|>", "<|call|>"};
  for (bool trimmed = true; trimmed;) {
    trimmed = false;
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    for (const auto& end : ends) {
      if (output.ends_with(end)) {
        output.resize(output.size() - end.size());
        trimmed = true;
      }
    }
  }
  return {output, whole};
}

OutputDelta parse_in_pieces(const OutputFormat& format, const std::string& text, size_t piece) {
  OutputParser parser(format);
  OutputDelta out;
  for (size_t at = 0; at < text.size(); at += piece) out.append(parser.push(text.substr(at, piece)));
  out.append(parser.finish());
  return out;
}

class RoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTrip, CallsReasoningAndContentComeBack) {
  const Case& c = GetParam();
  const std::string source = read_template(c.template_name);
  ASSERT_EQ(detect_family(source), c.family);

  const json user = {{"role", "user"}, {"content", "Weather in Paris, and search for llamas?"}};
  json assistant = {{"role", "assistant"}, {"content", c.content}, {"tool_calls", calls_json(c.calls)}};
  const std::string reasoning = "The user wants two things.\nFirst the weather.";
  if (c.with_reasoning) {
    assistant["reasoning_content"] = reasoning;
    assistant["thinking"] = reasoning;
  }
  const std::string prompt = render(source, json::array({user}), true);
  const ModelOutput model = assistant_output(prompt, render(source, json::array({user, assistant}), false));
  const std::string& output = model.text;
  SCOPED_TRACE("model output: " + output);

  const OutputFormat format{c.family, uses_think_tags(source),
                            model.follows_whole_prompt && prompt_opens_reasoning(prompt), true};
  for (size_t piece : {output.size() + 1, size_t(1), size_t(2), size_t(3), size_t(7)}) {
    SCOPED_TRACE("pieces of " + std::to_string(piece) + " bytes");
    const OutputDelta parsed = parse_in_pieces(format, output, piece);
    ASSERT_EQ(parsed.tool_calls.size(), size_t(c.calls));
    const json expected = calls_json(c.calls);
    for (int i = 0; i < c.calls; ++i) {
      const ToolCall& call = parsed.tool_calls[i];
      EXPECT_EQ(call.name, expected[i]["function"]["name"]);
      EXPECT_EQ(json::parse(call.arguments), expected[i]["function"]["arguments"]);
      if (!c.format_has_ids) {
        EXPECT_EQ(call.id, "");
      } else if (c.id_style == "kimi") {
        EXPECT_EQ(call.id, "functions." + call.name + ":" + std::to_string(i));
      } else {
        EXPECT_EQ(call.id, call_id(i));
      }
    }
    EXPECT_EQ(parsed.reasoning, c.with_reasoning ? reasoning : "");
    EXPECT_EQ(parsed.content, c.content);
  }
}

INSTANTIATE_TEST_SUITE_P(
    RealTemplates, RoundTrip,
    ::testing::Values(
        Case{"Qwen-Qwen3-0.6B.jinja", Family::Hermes, 2, true, false, "call", "Let me look."},
        Case{"Qwen-Qwen2.5-7B-Instruct.jinja", Family::Hermes, 2, false, false, "call", "Let me look."},
        Case{"Qwen-QwQ-32B.jinja", Family::Hermes, 2},
        Case{"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", Family::Hermes, 2},
        Case{"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", Family::Hermes, 2},
        Case{"Qwen3.5-4B.jinja", Family::QwenXml, 2, true, false, "call", "Let me look."},
        Case{"Qwen3-Coder.jinja", Family::QwenXml, 2, false, false, "call", "Let me look."},
        Case{"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", Family::QwenXml, 2, true},
        Case{"StepFun3.5-Flash.jinja", Family::QwenXml, 2},
        Case{"meta-llama-Llama-3.1-8B-Instruct.jinja", Family::Llama3, 1},
        Case{"meta-llama-Llama-3.2-3B-Instruct.jinja", Family::Llama3, 1},
        Case{"meta-llama-Llama-3.3-70B-Instruct.jinja", Family::Llama3, 1},
        Case{"mistralai-Mistral-Nemo-Instruct-2407.jinja", Family::Mistral, 2, false, true},
        Case{"Mistral-Small-3.2-24B-Instruct-2506.jinja", Family::Mistral, 2, false, true},
        Case{"unsloth-mistral-Devstral-Small-2507.jinja", Family::Mistral, 2},
        Case{"mistralai-Ministral-3-14B-Reasoning-2512.jinja", Family::Mistral, 2},
        Case{"openai-gpt-oss-120b.jinja", Family::Harmony, 1, true},
        Case{"deepseek-ai-DeepSeek-V3.1.jinja", Family::DeepSeek, 2, false, false, "call", "Let me look."},
        Case{"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", Family::DeepSeek, 2},
        Case{"GLM-4.6.jinja", Family::Glm, 2, true, false, "call", "Let me look."},
        Case{"GLM-4.7-Flash.jinja", Family::Glm, 2, true},
        // Kimi-K2-Instruct and -Thinking append to a list when they render calls, which
        // Hugging Face's immutable sandbox (and so our renderer) refuses.
        Case{"moonshotai-Kimi-K2.jinja", Family::Kimi, 2, false, true, "kimi", "Let me look."}),
    [](const auto& info) {
      std::string name = info.param.template_name.substr(0, info.param.template_name.find(".jinja"));
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return name;
    });

// Llama 3.1's built-in tools are called in Python syntax after <|python_tag|>.
TEST(OutputParser, LlamaBuiltinToolCallRoundTrips) {
  const std::string source = read_template("meta-llama-Llama-3.1-8B-Instruct.jinja");
  const json user = {{"role", "user"}, {"content", "Search for llamas"}};
  const json assistant = {{"role", "assistant"}, {"content", ""},
                          {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                           {"function", {{"name", "brave_search"},
                                                         {"arguments", {{"query", "llamas"}}}}}}}}};
  const json extra = {{"builtin_tools", {"brave_search", "wolfram_alpha"}}};
  const std::string prompt = render(source, json::array({user}), true, extra);
  const std::string output =
      assistant_output(prompt, render(source, json::array({user, assistant}), false, extra)).text;
  ASSERT_TRUE(output.starts_with("<|python_tag|>")) << output;
  const OutputDelta parsed = parse_output({Family::Llama3, false, false, true}, output);
  ASSERT_EQ(parsed.tool_calls.size(), 1u);
  EXPECT_EQ(parsed.tool_calls[0].name, "brave_search");
  EXPECT_EQ(json::parse(parsed.tool_calls[0].arguments), json({{"query", "llamas"}}));
}

// DeepSeek R1's generation prompt opens <think>: the output starts inside the reasoning.
TEST(OutputParser, ReasoningOpenedByThePrompt) {
  const std::string source = read_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
  const std::string prompt =
      render(source, json::array({{{"role", "user"}, {"content", "Hi"}}}), true, {{"enable_thinking", true}});
  ASSERT_TRUE(prompt_opens_reasoning(prompt)) << prompt;
  const OutputFormat format{detect_family(source), uses_think_tags(source), true, true};
  const std::string output = "Greet back.\n</think>\n\nHello there!";
  for (size_t piece : {size_t(1), size_t(4), output.size()}) {
    const OutputDelta parsed = parse_in_pieces(format, output, piece);
    EXPECT_EQ(parsed.reasoning, "Greet back.");
    EXPECT_EQ(parsed.content, "Hello there!");
  }
}

TEST(OutputParser, HarmonyFinalChannelAfterAnalysis) {
  const std::string output =
      "<|channel|>analysis<|message|>Think it over.<|end|><|start|>assistant<|channel|>final<|message|>The answer.";
  const OutputFormat format{Family::Harmony, false, false, true};
  for (size_t piece : {size_t(1), size_t(5), output.size()}) {
    const OutputDelta parsed = parse_in_pieces(format, output, piece);
    EXPECT_EQ(parsed.reasoning, "Think it over.");
    EXPECT_EQ(parsed.content, "The answer.");
    EXPECT_TRUE(parsed.tool_calls.empty());
  }
}

// The form gpt-oss writes when it calls: the recipient after the channel, a constrain marker.
TEST(OutputParser, HarmonyRecipientAfterTheChannel) {
  const std::string output =
      "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>";
  const OutputDelta parsed = parse_in_pieces({Family::Harmony, false, false, true}, output, 3);
  ASSERT_EQ(parsed.tool_calls.size(), 1u);
  EXPECT_EQ(parsed.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(parsed.tool_calls[0].arguments), json({{"city", "Oslo"}}));
  EXPECT_EQ(parsed.content, "");
}

TEST(OutputParser, StreamingHoldsBackWhatMayBeAMarker) {
  OutputParser parser({Family::Hermes, true, false, true});
  EXPECT_EQ(parser.push("Sure <tool").content, "Sure");
  OutputDelta rest = parser.push("_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(rest.content, "");
  ASSERT_EQ(rest.tool_calls.size(), 1u);
  EXPECT_EQ(rest.tool_calls[0].name, "search");
  // Text that only looked like a marker's start is released once it is clear.
  OutputParser plain({Family::Hermes, true, false, true});
  EXPECT_EQ(plain.push("a <to").content, "a");
  EXPECT_EQ(plain.push("ast>").content, " <toast>");
}

TEST(OutputParser, ToolChoiceNoneLeavesCallSyntaxAsContent) {
  const std::string output = "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
  const OutputDelta parsed = parse_output({Family::Hermes, true, false, false}, output);
  EXPECT_TRUE(parsed.tool_calls.empty());
  EXPECT_EQ(parsed.content, output);
}

TEST(OutputParser, MalformedCallStaysContent) {
  const std::string output = "<tool_call>\n{\"name\": \"search\", \"argu</tool_call>";
  const OutputDelta parsed = parse_output({Family::Hermes, false, false, true}, output);
  EXPECT_TRUE(parsed.tool_calls.empty());
  EXPECT_EQ(parsed.content, output);
}

TEST(OutputParser, PlainTextKeepsItsWhitespace) {
  const std::string output = "  Hello\n\nworld\n";
  EXPECT_EQ(parse_in_pieces({Family::Hermes, true, false, true}, output, 1).content, output);
}

// The text a constrained decoder would produce for a required call parses back as that call.
TEST(RequiredCallWrapper, RoundTripsThroughTheParser) {
  const std::string arguments = R"({"city": "Lima", "days": 2})";
  for (Family family : {Family::Hermes, Family::Llama3, Family::Mistral, Family::Harmony,
                        Family::DeepSeek, Family::Kimi}) {
    SCOPED_TRACE("family " + std::to_string(static_cast<int>(family)));
    auto wrapper = required_call_wrapper(family, "get_weather");
    ASSERT_TRUE(wrapper);
    const std::string output = wrapper->before + arguments + wrapper->after;
    const OutputDelta parsed = parse_in_pieces({family, false, false, true}, output, 2);
    ASSERT_EQ(parsed.tool_calls.size(), 1u);
    EXPECT_EQ(parsed.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(parsed.tool_calls[0].arguments), json::parse(arguments));
    EXPECT_EQ(parsed.content, "");
  }
  EXPECT_FALSE(required_call_wrapper(Family::Glm, "get_weather"));
  EXPECT_FALSE(required_call_wrapper(Family::None, "get_weather"));
}

TEST(GeneratedCallId, DeterministicAndDistinct) {
  EXPECT_EQ(generated_call_id(Family::Hermes, 42, 0), generated_call_id(Family::Hermes, 42, 0));
  EXPECT_NE(generated_call_id(Family::Hermes, 42, 0), generated_call_id(Family::Hermes, 42, 1));
  EXPECT_NE(generated_call_id(Family::Hermes, 42, 0), generated_call_id(Family::Hermes, 43, 0));
  EXPECT_EQ(generated_call_id(Family::Hermes, 7, 0).size(), 29u);
  EXPECT_TRUE(generated_call_id(Family::Hermes, 7, 0).starts_with("call_"));
  EXPECT_EQ(generated_call_id(Family::Mistral, 7, 0).size(), 9u);  // its templates require 9
}

}  // namespace
}  // namespace strata::chat

namespace strata::chat {
namespace {

// Found by the fuzz target: harmony text without a header, then <|start|>, looped forever.
TEST(OutputParser, HarmonyTextWithoutHeaderEnds) {
  const std::string output = std::string(300, 'x') + "<|start|>" + std::string(300, 'y');
  const OutputDelta parsed = parse_output({Family::Harmony, false, false, true}, output);
  EXPECT_EQ(parsed.content, std::string(300, 'x') + std::string(300, 'y'));
  EXPECT_EQ(parse_output({Family::Harmony, false, false, true}, "<|start|>").content, "");
}

}  // namespace
}  // namespace strata::chat
