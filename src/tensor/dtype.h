// Element types of weight tensors, numbered as ggml numbers them in GGUF files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::tensor {

enum class DType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct DTypeInfo {
  const char* name;
  uint32_t block_elements;  // elements per block (1 for plain types)
  uint32_t block_bytes;     // bytes per block
  bool computable;          // Strata has kernels for it
};

// Known ggml type (also the ones Strata cannot compute); nullopt for an unknown id.
std::optional<DTypeInfo> dtype_info(uint32_t id);
const DTypeInfo& info(DType type);
std::string_view dtype_name(DType type);
std::optional<DType> parse_dtype(std::string_view name);  // "q4_0", "Q4_K", "f16", ...

// Bytes of a row of `elements` values; nullopt when elements is not a multiple of the block.
std::optional<uint64_t> row_bytes(DType type, uint64_t elements);

}  // namespace strata::tensor
