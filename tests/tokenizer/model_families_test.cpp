// The real vocabularies of five model families, converted as llama.cpp converts them, against
// Hugging Face's tokenizers.js on every text of reference/corpus.json. The CTest fixture
// tokenizer_reference_vectors (reference/reference_vectors.mjs) writes the vocabularies and the
// expected ids into the build tree before these tests run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "test_support.h"

namespace strata::tokenizer {
namespace {

namespace fs = std::filesystem;

// The families of reference/families.json.
const std::vector<std::string> kFamilies = {"deepseek-v3", "gemma3", "gpt-oss", "llama3", "qwen3"};

fs::path reference_dir() { return STRATA_TOKENIZER_REFERENCE_DIR; }

TEST(ModelFamilies, EveryFamilyHasVectors) {
  EXPECT_EQ(test::vocabularies_with_vectors(reference_dir()), kFamilies)
      << "in " << reference_dir() << " (made by the CTest test tokenizer_reference_vectors)";
}

struct FamilyVectors {
  std::vector<std::string> texts;
  std::vector<std::vector<Token>> ids;  // encode(text, add_special_tokens=false)
  std::vector<std::string> decoded;     // decode(encode(text)), special-token text kept
  test::LoadedTokenizer tokenizer;
};

FamilyVectors read_family(const std::string& name) {
  const std::string base = (reference_dir() / ("ggml-vocab-" + name + ".gguf")).string();
  FamilyVectors vectors{test::read_inputs(base + ".inp"), test::read_outputs(base + ".out"),
                        test::read_inputs(base + ".decoded"), test::load(base)};
  if (vectors.texts.empty() || vectors.ids.size() != vectors.texts.size() ||
      vectors.decoded.size() != vectors.texts.size()) {
    throw std::runtime_error(base + ": " + std::to_string(vectors.texts.size()) + " texts, " +
                             std::to_string(vectors.ids.size()) + " id lines, " +
                             std::to_string(vectors.decoded.size()) + " decoded texts");
  }
  return vectors;
}

class ModelFamilies : public testing::TestWithParam<std::string> {};

// Special-token text is parsed, as Hugging Face always does for its added tokens.
TEST_P(ModelFamilies, EncodeMatchesHuggingFace) {
  const FamilyVectors vectors = read_family(GetParam());
  for (size_t i = 0; i < vectors.texts.size(); ++i) {
    EXPECT_EQ(vectors.tokenizer.tokenizer->encode(vectors.texts[i], false, true), vectors.ids[i])
        << "text " << i << ": \"" << vectors.texts[i] << "\"";
  }
}

// Special-token text is plain text here, so decoding gives back all of it, as the tokenizer
// normalizes it (Qwen's NFC, SentencePiece's ▁ read as a space).
TEST_P(ModelFamilies, DecodeOfEncodeGivesTheNormalizedText) {
  const FamilyVectors vectors = read_family(GetParam());
  const Tokenizer& tokenizer = *vectors.tokenizer.tokenizer;
  for (size_t i = 0; i < vectors.texts.size(); ++i) {
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(vectors.texts[i], false, false)),
              vectors.decoded[i])
        << "text " << i;
  }
}

std::string repeated(std::string_view piece, size_t times) {
  std::string text;
  for (size_t i = 0; i < times; ++i) text += piece;
  return text;
}

// Long runs of one kind of character are where a careless matcher (o200k's words that give back
// capitals, DeepSeek's prefixes) or NFC turns quadratic.
TEST_P(ModelFamilies, LongRunsStayLinear) {
  const test::LoadedTokenizer loaded =
      test::load(reference_dir() / ("ggml-vocab-" + GetParam() + ".gguf"));
  const size_t n = 64 * 1024;
  const std::string runs[] = {
      std::string(n, 'A'),          std::string(n, 'a'),     std::string(n, '7'),
      std::string(n, ' ') + "x",    repeated("\t!", n / 2),  repeated("e\u0301", n / 3),
      repeated("\u4E2D", n / 3),    repeated("\u200D", n / 3), repeated("\u0301\u0316", n / 4)};
  for (const std::string& text : runs) {
    const auto start = test::thread_cpu_time();
    const std::vector<Token> tokens = loaded.tokenizer->encode(text, false, false);
    const auto elapsed = test::thread_cpu_time() - start;
    EXPECT_FALSE(tokens.empty());
    EXPECT_LT(elapsed, std::chrono::milliseconds(300))
        << "a run of " << testing::PrintToString(text.substr(0, 4));
  }
}

// gpt-oss writes its reasoning, then <|end|>, then its answer: only <|return|> (the answer's end)
// and <|call|> (a tool call's) end the generation.
TEST(ModelFamilies, HarmonyEndsAtReturnAndCallNotAtEnd) {
  const auto loaded = test::load(reference_dir() / "ggml-vocab-gpt-oss.gguf");
  const Tokenizer& tokenizer = *loaded.tokenizer;
  for (const char* text : {"<|return|>", "<|call|>", "<|end|>"}) ASSERT_TRUE(tokenizer.find_token(text)) << text;
  EXPECT_TRUE(tokenizer.is_end_of_generation(*tokenizer.find_token("<|return|>")));
  EXPECT_TRUE(tokenizer.is_end_of_generation(*tokenizer.find_token("<|call|>")));
  EXPECT_FALSE(tokenizer.is_end_of_generation(*tokenizer.find_token("<|end|>")));
  // Other families keep <|end|>-like markers as ends: Qwen's <|im_end|>.
  const auto qwen = test::load(reference_dir() / "ggml-vocab-qwen3.gguf");
  EXPECT_TRUE(qwen.tokenizer->is_end_of_generation(*qwen.tokenizer->find_token("<|im_end|>")));
}

INSTANTIATE_TEST_SUITE_P(Reference, ModelFamilies, testing::ValuesIn(kFamilies),
                         [](const testing::TestParamInfo<std::string>& info) { return test::test_name(info.param); });

}  // namespace
}  // namespace strata::tokenizer
