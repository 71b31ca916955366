// Markers that are special tokens of real vocabularies (gpt-oss's harmony control tokens,
// DeepSeek's call markers) reach the output parser: a generation session reading the answer sees them as
// text, and the harmony reasoning's <|end|> does not end the generation while <|call|> does.
// The vocabularies are those the tokenizer tests convert (CTest fixture tokenizer_reference).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "api/generation_session.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::api {
namespace {

struct Vocabulary {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
};

Vocabulary load(const std::string& family) {
  Vocabulary vocabulary;
  vocabulary.file = gguf::File::open(std::string(STRATA_TOKENIZER_REFERENCE_DIR) + "/ggml-vocab-" + family + ".gguf");
  vocabulary.tokenizer = tokenizer::Tokenizer::from_gguf(*vocabulary.file);
  return vocabulary;
}

struct Answer {
  TextDelta output;
  int generated = 0;  // tokens given before the end of generation, that one included
  int reasoning_tokens = 0;
};

// Feeds the model's tokens of `text` (markers as their tokens) to a session as the engine would,
// up to and including the first end-of-generation token.
Answer generate(const tokenizer::Tokenizer& tokenizer, const std::string& text,
                std::optional<OutputReading> reading) {
  auto session = std::make_shared<GenerationSession>(tokenizer, std::vector<std::string>{}, false, reading);
  auto callbacks = session->callbacks();
  Answer answer;
  for (engine::Token token : tokenizer.encode(text, false, true)) {
    const bool end = tokenizer.is_end_of_generation(token);
    ++answer.generated;
    callbacks.on_token({token, 0.0f, {}, end, 0});
    if (end) break;
  }
  callbacks.on_finish(engine::FinishReason::Stop, {});
  for (bool done = false; !done;) {
    auto update = session->wait_for(std::chrono::milliseconds(100));
    answer.output.append(std::move(update.delta));
    done = update.outcome.has_value();
  }
  answer.reasoning_tokens = session->reasoning_tokens();
  return answer;
}

TEST(ControlTokenMarkers, HarmonyReasoningAndCallReachTheParser) {
  const Vocabulary gpt_oss = load("gpt-oss");
  for (const char* marker : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|call|>"})
    ASSERT_TRUE(gpt_oss.tokenizer->is_control(*gpt_oss.tokenizer->find_token(marker))) << marker;
  const std::string text =
      "<|channel|>analysis<|message|>Look up Oslo.<|end|><|start|>assistant to=functions.get_weather"
      "<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>ignored after the end";
  const Answer answer = generate(*gpt_oss.tokenizer, text, OutputReading{{chat::Family::Harmony, false, false, true}, 7, false});
  EXPECT_EQ(answer.output.reasoning, "Look up Oslo.");
  EXPECT_EQ(answer.output.text, "");
  ASSERT_EQ(answer.output.tool_calls.size(), 1u);
  EXPECT_EQ(answer.output.tool_calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(answer.output.tool_calls[0].arguments), nlohmann::json({{"city", "Oslo"}}));
  EXPECT_EQ(answer.output.tool_calls[0].id, chat::generated_call_id(chat::Family::Harmony, 7, 0));
  EXPECT_GT(answer.reasoning_tokens, 0);
  EXPECT_LT(answer.reasoning_tokens, answer.generated);
  // <|call|> ended the generation: all tokens up to it, none after.
  EXPECT_EQ(answer.generated, int(gpt_oss.tokenizer->encode(text.substr(0, text.find("ignored")), false, true).size()));

  // Not read, the same tokens show no markers at all (control tokens are not text).
  const Answer plain = generate(*gpt_oss.tokenizer, text, std::nullopt);
  EXPECT_EQ(plain.output.text.find("<|"), std::string::npos) << plain.output.text;
}

TEST(ControlTokenMarkers, DeepSeekCallMarkersReachTheParser) {
  const Vocabulary deepseek = load("deepseek-v3");
  ASSERT_TRUE(deepseek.tokenizer->find_token("<｜tool▁calls▁begin｜>"));  // one token, of whatever type
  const std::string text =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"llamas\"}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
  const Answer answer = generate(*deepseek.tokenizer, text, OutputReading{{chat::Family::DeepSeek, true, false, true}, 1, false});
  ASSERT_EQ(answer.output.tool_calls.size(), 1u) << answer.output.text;
  EXPECT_EQ(answer.output.tool_calls[0].name, "search");
  EXPECT_EQ(nlohmann::json::parse(answer.output.tool_calls[0].arguments), nlohmann::json({{"q", "llamas"}}));
  EXPECT_EQ(answer.output.text, "Sure.");
}

}  // namespace
}  // namespace strata::api
