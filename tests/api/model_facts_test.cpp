#include "api/model_facts.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::api {
namespace {

TEST(ParameterSizeText, LargestUnitWithOneDecimal) {
  EXPECT_EQ(parameter_size_text(999), "999");
  EXPECT_EQ(parameter_size_text(263'744), "263.7K");
  EXPECT_EQ(parameter_size_text(494'032'768), "494.0M");
  EXPECT_EQ(parameter_size_text(7'615'616'512), "7.6B");
  EXPECT_EQ(parameter_size_text(1'000'000'000'000), "1.0T");
}

TEST(ReadModelFacts, TheSharedModel) {
  const std::string path = std::string(STRATA_SHARED_DIR) + "/models/aidreams260K.gguf";
  const auto file = gguf::File::open(path);
  const ModelFacts facts = read_model_facts(*file);
  EXPECT_EQ(facts.architecture, "llama");
  // Its shape, counted by hand: embeddings and output 512 x 64 each; per layer four 64 x 64
  // attention matrices, three 64 x 172 FFN matrices and two norms; the final norm.
  constexpr int64_t kByHand = 2 * 512 * 64 + 4 * (4 * 64 * 64 + 3 * 64 * 172 + 2 * 64) + 64;
  EXPECT_EQ(facts.parameter_count, kByHand);
  EXPECT_EQ(facts.parameter_size, "263.7K");
  EXPECT_EQ(facts.quantization_level, "F32");  // general.file_type 0
  EXPECT_EQ(facts.context_length, 128);
  EXPECT_EQ(facts.size_bytes, std::filesystem::file_size(path));
  const auto info = nlohmann::json::parse(facts.model_info_json);
  EXPECT_EQ(info["llama.block_count"], 4);
  EXPECT_EQ(info["general.architecture"], "llama");
  EXPECT_TRUE(info["tokenizer.ggml.tokens"].is_null());
}

TEST(ReadModelFacts, WithoutFileTypeNamesTheTypeHoldingMostBytes) {
  gguf::Writer writer;
  writer.set("general.architecture", gguf::Value::string("llama"));
  const auto q8 = static_cast<uint32_t>(tensor::DType::Q8_0);
  const auto f32 = static_cast<uint32_t>(tensor::DType::F32);
  writer.add_tensor("big", {64, 8}, q8, std::vector<uint8_t>(*tensor::row_bytes(tensor::DType::Q8_0, 64) * 8));
  writer.add_tensor("small", {64}, f32, std::vector<uint8_t>(64 * 4));
  const auto path = std::filesystem::temp_directory_path() / "strata_model_facts_test.gguf";
  writer.write(path.string());
  const ModelFacts facts = read_model_facts(*gguf::File::open(path.string()));
  std::filesystem::remove(path);
  EXPECT_EQ(facts.quantization_level, "Q8_0");
  EXPECT_EQ(facts.parameter_count, 64 * 8 + 64);
  EXPECT_EQ(facts.context_length, 0);
}

}  // namespace
}  // namespace strata::api
