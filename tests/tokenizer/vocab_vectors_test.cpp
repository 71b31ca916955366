// llama.cpp's tokenizer test vectors: every NAME.gguf.inp / NAME.gguf.out pair in the shared
// vocab directory must tokenize exactly (no BOS, special-token text not parsed).
#include <gtest/gtest.h>

#include <algorithm>

#include "test_support.h"

namespace strata::tokenizer {
namespace {

namespace fs = std::filesystem;
using test::read_inputs;
using test::read_outputs;
using test::vocab_dir;

constexpr size_t kExpectedVocabularies = 9;
constexpr size_t kExpectedTestsPerVocabulary = 46;

TEST(VocabVectors, AllNineVocabulariesArePresent) {
  const std::vector<std::string> names = test::vocabularies_with_vectors(vocab_dir());
  ASSERT_EQ(names.size(), kExpectedVocabularies) << "in " << vocab_dir();
  for (const std::string& name : names) {
    const fs::path base = vocab_dir() / ("ggml-vocab-" + name + ".gguf");
    EXPECT_TRUE(fs::exists(base)) << base;
    EXPECT_TRUE(fs::exists(base.string() + ".out")) << base << ".out";
  }
}

struct VectorCase {
  std::vector<std::string> inputs;
  std::vector<std::vector<Token>> expected;
};

VectorCase read_case(const std::string& name) {
  const fs::path base = vocab_dir() / ("ggml-vocab-" + name + ".gguf");
  VectorCase c{read_inputs(base.string() + ".inp"), read_outputs(base.string() + ".out")};
  if (c.inputs.size() != kExpectedTestsPerVocabulary || c.expected.size() != c.inputs.size()) {
    throw std::runtime_error(name + ": " + std::to_string(c.inputs.size()) + " inputs, " +
                             std::to_string(c.expected.size()) + " outputs");
  }
  return c;
}

class VocabVectors : public testing::TestWithParam<std::string> {};

TEST_P(VocabVectors, EncodeMatchesLlamaCpp) {
  const VectorCase c = read_case(GetParam());
  const test::LoadedTokenizer loaded = test::load_vocab(GetParam());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    EXPECT_EQ(loaded.tokenizer->encode(c.inputs[i], false, false), c.expected[i])
        << "test " << i << ": \"" << c.inputs[i] << "\"";
  }
}

TEST_P(VocabVectors, DecodeOfEncodeRoundTrips) {
  const VectorCase c = read_case(GetParam());
  const test::LoadedTokenizer loaded = test::load_vocab(GetParam());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    EXPECT_EQ(loaded.tokenizer->decode(loaded.tokenizer->encode(c.inputs[i], false, false)),
              c.inputs[i])
        << "test " << i;
    const std::vector<Token> with_bos = loaded.tokenizer->encode(c.inputs[i], true, false);
    EXPECT_EQ(loaded.tokenizer->decode(with_bos), c.inputs[i]) << "test " << i << " with BOS";
  }
}

TEST_P(VocabVectors, ExpectedIdsDecodeToTheInput) {
  const VectorCase c = read_case(GetParam());
  const test::LoadedTokenizer loaded = test::load_vocab(GetParam());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    EXPECT_EQ(loaded.tokenizer->decode(c.expected[i]), c.inputs[i]) << "test " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(SharedVocab, VocabVectors, testing::ValuesIn(test::vocabularies_with_vectors(vocab_dir())),
                         [](const testing::TestParamInfo<std::string>& info) { return test::test_name(info.param); });

}  // namespace
}  // namespace strata::tokenizer
