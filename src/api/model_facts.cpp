#include "api/model_facts.h"

#include <array>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::api {
namespace {

using json = nlohmann::json;

// general.file_type's values, as llama.cpp numbers its quantization mixes.
std::string file_type_name(uint64_t file_type) {
  static const std::map<uint64_t, std::string> kNames = {
      {0, "F32"},      {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},     {7, "Q8_0"},    {8, "Q5_0"},
      {9, "Q5_1"},     {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"},  {13, "Q3_K_L"}, {14, "Q4_K_S"},
      {15, "Q4_K_M"},  {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},    {19, "IQ2_XXS"}, {20, "IQ2_XS"},
      {21, "Q2_K_S"},  {22, "IQ3_XS"}, {23, "IQ3_XXS"}, {24, "IQ1_S"},  {25, "IQ4_NL"}, {26, "IQ3_S"},
      {27, "IQ3_M"},   {28, "IQ2_S"},  {29, "IQ2_M"},  {30, "IQ4_XS"},  {31, "IQ1_M"},  {32, "BF16"},
      {36, "TQ1_0"},   {37, "TQ2_0"},  {38, "MXFP4_MOE"},
  };
  const auto found = kNames.find(file_type);
  return found == kNames.end() ? "unknown" : found->second;
}

// Files without general.file_type (Strata's synthetic ones among them) are named by the type
// that holds most of their bytes.
std::string dominant_type_name(const gguf::File& file) {
  std::map<uint32_t, uint64_t> bytes_by_type;
  for (const auto& tensor : file.tensors()) bytes_by_type[tensor.type] += tensor.size_bytes;
  uint32_t dominant = 0;
  uint64_t most = 0;
  for (const auto& [type, bytes] : bytes_by_type) {
    if (bytes > most) dominant = type, most = bytes;
  }
  const auto info = tensor::dtype_info(dominant);
  return info ? info->name : "unknown";
}

json scalar_json(const gguf::Value& value) {
  if (value.type == gguf::ValueType::Array) return nullptr;
  if (const auto* text = value.as_string()) return *text;
  if (const auto flag = value.as_bool()) return *flag;
  if (value.type == gguf::ValueType::Float32 || value.type == gguf::ValueType::Float64) return *value.as_float();
  if (const auto integer = value.as_int()) return *integer;
  return *value.as_uint();
}

}  // namespace

std::string parameter_size_text(int64_t count) {
  constexpr std::array<std::pair<double, char>, 4> kUnits = {
      {{1e12, 'T'}, {1e9, 'B'}, {1e6, 'M'}, {1e3, 'K'}}};
  for (const auto& [unit, letter] : kUnits) {
    if (static_cast<double>(count) >= unit) {
      char text[32];
      std::snprintf(text, sizeof text, "%.1f%c", static_cast<double>(count) / unit, letter);
      return text;
    }
  }
  return std::to_string(count);
}

ModelFacts read_model_facts(const gguf::File& file) {
  ModelFacts facts;
  facts.architecture = file.get_string("general.architecture").value_or("");
  facts.size_bytes = file.header_bytes().size();
  int64_t elements = 0;
  for (const auto& tensor : file.tensors()) {
    facts.size_bytes += tensor.size_bytes;
    elements += static_cast<int64_t>(tensor.elements());
  }
  facts.parameter_count = static_cast<int64_t>(file.get_uint("general.parameter_count").value_or(elements));
  facts.parameter_size = parameter_size_text(facts.parameter_count);
  const auto file_type = file.get_uint("general.file_type");
  facts.quantization_level = file_type ? file_type_name(*file_type) : dominant_type_name(file);
  facts.context_length = static_cast<int64_t>(file.get_uint(facts.architecture + ".context_length").value_or(0));
  json info = json::object();
  for (const auto& entry : file.metadata()) info[entry.key] = scalar_json(entry.value);
  info["general.parameter_count"] = facts.parameter_count;
  facts.model_info_json = info.dump();
  return facts;
}

}  // namespace strata::api
