// Tokenizer behaviour beyond the test vectors: special tokens, BOS, decoding, end-of-generation
// tokens, loading errors and speed.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "test_support.h"

namespace strata::tokenizer {
namespace {

namespace fs = std::filesystem;

bool contains(const std::vector<Token>& tokens, Token token) {
  return std::find(tokens.begin(), tokens.end(), token) != tokens.end();
}

class LlamaSpm : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    loaded_ = new test::LoadedTokenizer(test::load_vocab("llama-spm"));
  }
  static void TearDownTestSuite() { delete loaded_; }
  const Tokenizer& tok() const { return *loaded_->tokenizer; }
  static inline test::LoadedTokenizer* loaded_ = nullptr;
};

constexpr Token kHello = 15043;  // "▁Hello"

TEST_F(LlamaSpm, SpecialIdsAndDefaults) {
  EXPECT_EQ(tok().vocab_size(), 32000);
  EXPECT_EQ(tok().bos(), 1);
  EXPECT_EQ(tok().eos(), 2);
  EXPECT_TRUE(tok().add_bos_by_default());
  EXPECT_TRUE(tok().is_control(1));
  EXPECT_FALSE(tok().is_control(kHello));
  EXPECT_TRUE(tok().is_end_of_generation(2));
  EXPECT_FALSE(tok().is_end_of_generation(1));
  EXPECT_FALSE(tok().is_end_of_generation(kHello));
}

TEST_F(LlamaSpm, AddsBosOnlyWhenAsked) {
  EXPECT_EQ(tok().encode("Hello", true, false), (std::vector<Token>{1, kHello}));
  EXPECT_EQ(tok().encode("Hello", false, false), (std::vector<Token>{kHello}));
  EXPECT_EQ(tok().encode("", true, false), (std::vector<Token>{1}));
}

TEST_F(LlamaSpm, ParsesControlTokensOnlyWhenAsked) {
  // Each stretch of text after a special token gets SentencePiece's space prefix again.
  EXPECT_EQ(tok().encode("<s>Hello</s>", false, true), (std::vector<Token>{1, kHello, 2}));
  const std::vector<Token> plain = tok().encode("<s>Hello</s>", false, false);
  EXPECT_FALSE(contains(plain, 1));
  EXPECT_FALSE(contains(plain, 2));
  EXPECT_EQ(tok().decode(plain), "<s>Hello</s>");
}

TEST_F(LlamaSpm, ControlTokensDecodeToNothing) {
  EXPECT_EQ(tok().token_piece(1), "");
  EXPECT_EQ(tok().token_piece(kHello), " Hello");
  EXPECT_EQ(tok().decode(std::vector<Token>{1, kHello, 2}), "Hello");
}

TEST_F(LlamaSpm, ByteTokensDecodeToTheirByte) {
  const std::optional<Token> a = tok().find_token("<0x41>");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(tok().token_piece(*a), "A");
  EXPECT_EQ(tok().token_piece(*tok().find_token("<0xF0>")), "\xF0");
}

TEST_F(LlamaSpm, CharactersOutsideTheVocabularyUseByteTokens) {
  // 🦙 has no token: it becomes its four UTF-8 bytes.
  const std::vector<Token> tokens = tok().encode("\xF0\x9F\xA6\x99", false, false);
  const std::vector<Token> expected{*tok().find_token("\xE2\x96\x81"), *tok().find_token("<0xF0>"),
                                    *tok().find_token("<0x9F>"), *tok().find_token("<0xA6>"),
                                    *tok().find_token("<0x99>")};
  EXPECT_EQ(tokens, expected);
}

TEST_F(LlamaSpm, FindToken) {
  EXPECT_EQ(tok().find_token("\xE2\x96\x81Hello"), kHello);
  EXPECT_EQ(tok().find_token("no such token text"), std::nullopt);
}

TEST_F(LlamaSpm, TokenPieceRejectsIdsOutsideTheVocabulary) {
  EXPECT_THROW(tok().token_piece(-1), std::out_of_range);
  EXPECT_THROW(tok().token_piece(32000), std::out_of_range);
}

TEST(Phi3, ChatTokensEndGeneration) {
  const test::LoadedTokenizer loaded = test::load_vocab("phi-3");
  const Tokenizer& tok = *loaded.tokenizer;
  const Token end = *tok.find_token("<|end|>");
  const Token user = *tok.find_token("<|user|>");
  EXPECT_EQ(end, 32007);
  EXPECT_TRUE(tok.is_end_of_generation(end));
  EXPECT_TRUE(tok.is_end_of_generation(tok.eos()));
  EXPECT_FALSE(tok.is_end_of_generation(user));
  const std::vector<Token> tokens = tok.encode("<|user|>\nHi<|end|>", true, true);
  ASSERT_GE(tokens.size(), 4u);
  EXPECT_EQ(tokens.front(), tok.bos());
  EXPECT_EQ(tokens[1], user);
  EXPECT_EQ(tokens.back(), end);
  EXPECT_FALSE(contains(tok.encode("<|user|>\nHi<|end|>", true, false), end));
}

TEST(Gpt2, ByteLevelEncodingAndSpecialText) {
  const test::LoadedTokenizer loaded = test::load_vocab("gpt-2");
  const Tokenizer& tok = *loaded.tokenizer;
  EXPECT_EQ(tok.encode("Hello world", false, false), (std::vector<Token>{15496, 995}));
  EXPECT_FALSE(tok.add_bos_by_default());
  EXPECT_EQ(tok.bos(), 50256);
  EXPECT_EQ(tok.encode("<|endoftext|>", false, true), (std::vector<Token>{50256}));
  const std::vector<Token> plain = tok.encode("<|endoftext|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_FALSE(contains(plain, 50256));
  EXPECT_EQ(tok.token_piece(995), " world");
  EXPECT_TRUE(tok.is_end_of_generation(50256));
}

TEST(DeepseekCoder, ReadsAddBosFromTheFile) {
  const test::LoadedTokenizer loaded = test::load_vocab("deepseek-coder");
  EXPECT_TRUE(loaded.tokenizer->add_bos_by_default());
  EXPECT_EQ(loaded.tokenizer->bos(), 32013);
  EXPECT_TRUE(loaded.tokenizer->is_end_of_generation(32014));
}

TEST(GptNeox, LoadsWithoutPreTokenizerKey) {
  const test::LoadedTokenizer loaded = test::load_vocab("gpt-neox");
  const Tokenizer& tok = *loaded.tokenizer;
  EXPECT_EQ(tok.vocab_size(), 50432);
  const std::string text = "Hello world, it's 2024!\n\tgpt-neox \xF0\x9F\xA6\x99";
  EXPECT_EQ(tok.decode(tok.encode(text, false, false)), text);
}

TEST(Aidreams260K, SmallSentencePieceModelRoundTrips) {
  const test::LoadedTokenizer loaded =
      test::load(fs::path(STRATA_SHARED_DIR) / "models" / "aidreams260K.gguf");
  const Tokenizer& tok = *loaded.tokenizer;
  EXPECT_EQ(tok.vocab_size(), 512);
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const std::vector<Token> tokens = tok.encode(text, true, false);
  EXPECT_EQ(tokens.front(), tok.bos());
  EXPECT_LT(tokens.size(), text.size());  // merges happened
  EXPECT_EQ(tok.decode(tokens), text);
}

// Small vocabularies written to a temporary GGUF file: loading errors and settings that the
// shared vocabularies do not exercise.
class SyntheticVocabulary : public testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() /
            ("strata_tokenizer_" + std::to_string(::getpid()) + "_" +
             testing::UnitTest::GetInstance()->current_test_info()->name() + ".gguf");
  }
  void TearDown() override { fs::remove(path_); }

  static gguf::Value strings(std::vector<std::string> items) {
    std::vector<gguf::Value> values;
    for (std::string& item : items) values.push_back(gguf::Value::string(std::move(item)));
    return gguf::Value::array(gguf::ValueType::String, std::move(values));
  }

  // Loading must fail with a message that contains `expected`.
  void expect_load_error(gguf::Writer& writer, const std::string& expected) {
    writer.write(path_.string());
    const auto file = gguf::File::open(path_.string());
    try {
      Tokenizer::from_gguf(*file);
      ADD_FAILURE() << "loaded without error; expected one mentioning " << expected;
    } catch (const std::runtime_error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  }

  static gguf::Writer gpt2_writer() {
    gguf::Writer writer;
    writer.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
    writer.set("tokenizer.ggml.tokens", strings({"a", "b", "ab"}));
    writer.set("tokenizer.ggml.merges", strings({"a b"}));
    return writer;
  }

  fs::path path_;
};

TEST_F(SyntheticVocabulary, MissingModel) {
  gguf::Writer writer;
  writer.set("tokenizer.ggml.tokens", strings({"a"}));
  expect_load_error(writer, "tokenizer.ggml.model");
}

TEST_F(SyntheticVocabulary, UnknownModel) {
  gguf::Writer writer;
  writer.set("tokenizer.ggml.model", gguf::Value::string("wordpiece"));
  writer.set("tokenizer.ggml.tokens", strings({"a"}));
  expect_load_error(writer, "'wordpiece'");
}

TEST_F(SyntheticVocabulary, MissingTokens) {
  gguf::Writer writer;
  writer.set("tokenizer.ggml.model", gguf::Value::string("llama"));
  expect_load_error(writer, "tokenizer.ggml.tokens");
}

TEST_F(SyntheticVocabulary, MissingMerges) {
  gguf::Writer writer;
  writer.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
  writer.set("tokenizer.ggml.tokens", strings({"a"}));
  expect_load_error(writer, "tokenizer.ggml.merges");
}

TEST_F(SyntheticVocabulary, UnknownPreTokenizer) {
  gguf::Writer writer = gpt2_writer();
  writer.set("tokenizer.ggml.pre", gguf::Value::string("no-such-pre"));
  expect_load_error(writer, "'no-such-pre'");
}

TEST_F(SyntheticVocabulary, SpecialTokenIdOutsideTheVocabulary) {
  gguf::Writer writer = gpt2_writer();
  writer.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(3));
  expect_load_error(writer, "tokenizer.ggml.eos_token_id");
}

TEST_F(SyntheticVocabulary, TokenTypesOfTheWrongCount) {
  gguf::Writer writer = gpt2_writer();
  writer.set("tokenizer.ggml.token_type",
             gguf::Value::array(gguf::ValueType::Int32, {gguf::Value::i32(1)}));
  expect_load_error(writer, "tokenizer.ggml.token_type");
}

TEST_F(SyntheticVocabulary, MinimalByteLevelVocabularyLoadsAndMerges) {
  gguf::Writer writer = gpt2_writer();
  writer.write(path_.string());
  const auto file = gguf::File::open(path_.string());
  const auto tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tok->encode("abba", false, false), (std::vector<Token>{2, 1, 0}));
  EXPECT_EQ(tok->bos(), -1);
  EXPECT_FALSE(tok->add_bos_by_default());
}

TEST_F(SyntheticVocabulary, Llama3VocabulariesTakeWholeTokensBeforeMerging) {
  const auto load_with_pre = [&](const char* pre) {
    gguf::Writer writer;
    writer.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
    writer.set("tokenizer.ggml.pre", gguf::Value::string(pre));
    writer.set("tokenizer.ggml.tokens", strings({"a", "b", "c", "ab", "abc", "<|begin_of_text|>"}));
    writer.set("tokenizer.ggml.merges", strings({"a b"}));
    writer.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(5));
    writer.write(path_.string());
    const auto file = gguf::File::open(path_.string());
    return Tokenizer::from_gguf(*file);
  };
  // "abc" cannot be reached by merges ("ab" + "c" has no rank), but Llama 3 takes it whole.
  const auto llama3 = load_with_pre("llama-bpe");
  EXPECT_EQ(llama3->encode("abc", false, false), (std::vector<Token>{4}));
  EXPECT_TRUE(llama3->add_bos_by_default());
  EXPECT_EQ(llama3->encode("abc", true, false), (std::vector<Token>{5, 4}));
  const auto gpt2 = load_with_pre("gpt-2");
  EXPECT_EQ(gpt2->encode("abc", false, false), (std::vector<Token>{3, 2}));
  EXPECT_FALSE(gpt2->add_bos_by_default());
}

// GLM-4.5's vocabularies split numbers into runs of up to three digits, as Llama 3's regex does
// (GPT-2's keeps "12345" whole, and its merges then give 12, 34, 5), but merge like any BPE
// vocabulary and add no BOS unless the file asks, though it names [gMASK] as its BOS.
TEST_F(SyntheticVocabulary, GlmVocabulariesSplitLikeLlama3AndAddNoBos) {
  const auto load_with_pre = [&](const char* pre) {
    gguf::Writer writer;
    writer.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
    writer.set("tokenizer.ggml.pre", gguf::Value::string(pre));
    writer.set("tokenizer.ggml.tokens", strings({"1", "2", "3", "4", "5", "12", "123", "45", "34", "[gMASK]"}));
    writer.set("tokenizer.ggml.merges", strings({"1 2", "3 4", "12 3", "4 5"}));
    writer.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(9));
    writer.write(path_.string());
    const auto file = gguf::File::open(path_.string());
    return Tokenizer::from_gguf(*file);
  };
  const auto glm = load_with_pre("glm4");
  EXPECT_EQ(glm->encode("12345", false, false), (std::vector<Token>{6, 7}));
  EXPECT_FALSE(glm->add_bos_by_default());
  EXPECT_EQ(load_with_pre("gpt-2")->encode("12345", false, false), (std::vector<Token>{5, 8, 4}));
}

TEST_F(SyntheticVocabulary, QwenVocabulariesEncodeTheNfcOfTheText) {
  const auto load_with_pre = [&](const char* pre) {
    gguf::Writer writer;
    writer.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
    writer.set("tokenizer.ggml.pre", gguf::Value::string(pre));
    // In GPT-2's byte alphabet: e, then U+0301's bytes CC 81, then é's bytes C3 A9, then é.
    writer.set("tokenizer.ggml.tokens", strings({"e", "\u00CC", "\u0123", "\u00C3", "\u00A9",
                                                 "\u00C3\u00A9"}));
    writer.set("tokenizer.ggml.merges", strings({"\u00C3 \u00A9"}));
    writer.write(path_.string());
    const auto file = gguf::File::open(path_.string());
    return Tokenizer::from_gguf(*file);
  };
  const std::string decomposed = "e\u0301";
  const auto qwen = load_with_pre("qwen2");
  EXPECT_EQ(qwen->encode(decomposed, false, false), (std::vector<Token>{5}));
  EXPECT_EQ(qwen->decode(qwen->encode(decomposed, false, false)), "\u00E9");
  // Other vocabularies take the text as it is.
  const auto gpt2 = load_with_pre("gpt-2");
  EXPECT_EQ(gpt2->encode(decomposed, false, false), (std::vector<Token>{0, 1, 2}));
}

TEST_F(SyntheticVocabulary, UserDefinedTokensAreAlwaysMatchedControlTokensOnRequest) {
  gguf::Writer writer;
  writer.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
  writer.set("tokenizer.ggml.tokens",
             strings({"a", "b", "<", "c", "t", "l", ">", "<tool>", "<ctl>", "<ctl>a"}));
  std::vector<gguf::Value> types(7, gguf::Value::i32(1));
  types.push_back(gguf::Value::i32(4));  // user-defined
  types.push_back(gguf::Value::i32(3));  // control
  types.push_back(gguf::Value::i32(3));
  writer.set("tokenizer.ggml.token_type", gguf::Value::array(gguf::ValueType::Int32, types));
  writer.set("tokenizer.ggml.merges", strings({}));
  writer.write(path_.string());
  const auto file = gguf::File::open(path_.string());
  const auto tok = Tokenizer::from_gguf(*file);

  EXPECT_EQ(tok->encode("a<tool>b<ctl>", false, false),
            (std::vector<Token>{0, 7, 1, 2, 3, 4, 5, 6}));
  // The longer control text wins where both match.
  EXPECT_EQ(tok->encode("a<tool>b<ctl>a<ctl>", false, true), (std::vector<Token>{0, 7, 1, 9, 8}));
  EXPECT_EQ(tok->token_piece(7), "<tool>");
  EXPECT_EQ(tok->token_piece(8), "");
  EXPECT_TRUE(tok->is_control(8));
  EXPECT_FALSE(tok->is_control(7));
}

// About 4 KB of mixed text, encoded with the largest vocabulary and the SentencePiece one.
TEST(TokenizerSpeed, EncodesKilobytesInMilliseconds) {
  std::string text;
  while (text.size() < 4096) {
    text +=
        "The quick brown fox jumps over the lazy dog. 1234567890 Привет мир! "
        "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\xA6\x99\n\t  ";
  }
  for (std::string_view name : {"deepseek-llm", "llama-spm"}) {
    const test::LoadedTokenizer loaded = test::load_vocab(name);
    const auto start = test::thread_cpu_time();
    const std::vector<Token> tokens = loaded.tokenizer->encode(text, true, true);
    const auto elapsed = test::thread_cpu_time() - start;
    EXPECT_GT(tokens.size(), 500u);
    EXPECT_LT(elapsed, std::chrono::milliseconds(100)) << name;
  }
}

// Long runs of one kind of character are where a careless matcher or merge loop turns quadratic.
TEST(TokenizerSpeed, LongRunsStayLinear) {
  const size_t n = 64 * 1024;
  const std::string runs[] = {std::string(n, '7'), std::string(n, ' ') + "1",
                              std::string(n, '\t') + "!", std::string(n, 'a')};
  for (std::string_view name : {"falcon", "deepseek-llm", "llama-spm"}) {
    const test::LoadedTokenizer loaded = test::load_vocab(name);
    for (const std::string& text : runs) {
      const auto start = test::thread_cpu_time();
      const std::vector<Token> tokens = loaded.tokenizer->encode(text, false, false);
      const auto elapsed = test::thread_cpu_time() - start;
      EXPECT_LT(elapsed, std::chrono::milliseconds(300)) << name << ", run of '" << text[0] << "'";
      EXPECT_EQ(loaded.tokenizer->decode(tokens), text) << name;
    }
  }
}

}  // namespace
}  // namespace strata::tokenizer
