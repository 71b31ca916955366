// Helpers shared by the tensor tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/matmul.h"
#include "tensor/quant.h"

namespace strata::tensor::testing {

inline constexpr DType kSupportedTypes[] = {DType::F32,  DType::F16,  DType::BF16,   DType::Q4_0,   DType::Q4_1,
                                            DType::Q5_0, DType::Q5_1, DType::Q8_0,   DType::Q2_K,   DType::Q3_K,
                                            DType::Q4_K, DType::Q5_K, DType::Q6_K,   DType::IQ4_NL, DType::IQ4_XS,
                                            DType::MXFP4};

// Restores the detected ISA when a test that forces one ends.
struct IsaScope {
  explicit IsaScope(Isa isa) { force_isa(isa); }
  ~IsaScope() { force_isa(detected_isa()); }
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

inline std::vector<uint8_t> quantized(DType type, const std::vector<float>& values) {
  std::vector<uint8_t> bytes(*row_bytes(type, values.size()));
  quantize_row(type, values.data(), bytes.data(), static_cast<int64_t>(values.size()));
  return bytes;
}

inline std::vector<float> dequantized(DType type, const std::vector<uint8_t>& bytes, size_t n) {
  std::vector<float> values(n);
  dequantize_row(type, bytes.data(), values.data(), static_cast<int64_t>(n));
  return values;
}

}  // namespace strata::tensor::testing
