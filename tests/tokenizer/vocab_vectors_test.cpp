// llama.cpp's tokenizer test vectors: every NAME.gguf.inp / NAME.gguf.out pair in the shared
// vocab directory must tokenize exactly (no BOS, special-token text not parsed).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

#include "test_support.h"

namespace strata::tokenizer {
namespace {

namespace fs = std::filesystem;
using test::vocab_dir;

constexpr size_t kExpectedVocabularies = 9;
constexpr size_t kExpectedTestsPerVocabulary = 46;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<std::string> read_inputs(const fs::path& path) {
  const std::string text = read_file(path);
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  size_t pos = 0;
  for (size_t found; (found = text.find(separator, pos)) != std::string::npos;
       pos = found + separator.size()) {
    inputs.push_back(text.substr(pos, found - pos));
  }
  if (pos != text.size())
    throw std::runtime_error(path.string() + " does not end with a separator");
  return inputs;
}

std::vector<std::vector<Token>> read_outputs(const fs::path& path) {
  std::istringstream in(read_file(path));
  std::vector<std::vector<Token>> outputs;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    std::vector<Token>& tokens = outputs.emplace_back();
    for (Token id; ids >> id;) tokens.push_back(id);
  }
  return outputs;
}

// Vocabulary names (the NAME in ggml-vocab-NAME.gguf.inp) found in the shared directory.
std::vector<std::string> vocabularies_with_vectors() {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(vocab_dir(), error)) {
    const std::string file = entry.path().filename().string();
    const std::string prefix = "ggml-vocab-", suffix = ".gguf.inp";
    if (file.starts_with(prefix) && file.ends_with(suffix)) {
      names.push_back(file.substr(prefix.size(), file.size() - prefix.size() - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(VocabVectors, AllNineVocabulariesArePresent) {
  const std::vector<std::string> names = vocabularies_with_vectors();
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

INSTANTIATE_TEST_SUITE_P(SharedVocab, VocabVectors, testing::ValuesIn(vocabularies_with_vectors()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace strata::tokenizer
