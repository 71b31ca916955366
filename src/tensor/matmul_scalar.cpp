// Plain C++ kernels: the reference the SIMD kernels are tested against, and the path for
// CPUs without AVX2.
#include "tensor/fp16.h"
#include "tensor/matmul_kernels.h"
#include "tensor/quant_blocks.h"

namespace strata::tensor::kernels {
namespace {

template <DType kType, class Activation>
void dot_quantized(const void* weight_row, size_t, int, int64_t cols, const TokenTile& tile,
                   float* out) {
  const auto* bytes = static_cast<const uint8_t*>(weight_row);
  constexpr int kBlock = static_cast<int>(sizeof(Activation::qs));
  const uint32_t block_bytes = info(kType).block_bytes;
  float acc[kMaxTokenTile] = {};
  UnpackedBlock w;
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    unpack_block(kType, bytes + b * block_bytes, w);
    for (int t = 0; t < tile.n_tokens; ++t) {
      const auto& x = static_cast<const Activation*>(tile.rows[t])[b];
      int32_t weighted = 0;
      int32_t mins = 0;
      for (int g = 0; g < kBlock / w.group_size; ++g) {
        int32_t dot = 0;
        for (int i = g * w.group_size; i < (g + 1) * w.group_size; ++i) dot += w.q[i] * x.qs[i];
        weighted += w.scale[g] * dot;
        for (int k = g * w.group_size / 16; k < (g + 1) * w.group_size / 16; ++k) {
          mins += w.min[g] * x.sums[k];
        }
      }
      acc[t] += (w.d * x.d) * static_cast<float>(weighted) +
                (w.dm * x.d) * static_cast<float>(mins);
    }
  }
  for (int t = 0; t < tile.n_tokens; ++t) out[t] = acc[t];
}

template <DType kType>
float weight_at(const void* row, int64_t i) {
  if constexpr (kType == DType::F32) return static_cast<const float*>(row)[i];
  if constexpr (kType == DType::F16) return fp16_to_fp32(static_cast<const uint16_t*>(row)[i]);
  if constexpr (kType == DType::BF16) return bf16_to_fp32(static_cast<const uint16_t*>(row)[i]);
}

template <DType kType>
void dot_float(const void* weight_row, size_t, int, int64_t cols, const TokenTile& tile,
               float* out) {
  for (int t = 0; t < tile.n_tokens; ++t) {
    const auto* x = static_cast<const float*>(tile.rows[t]);
    float acc = 0.0f;
    for (int64_t i = 0; i < cols; ++i) acc += weight_at<kType>(weight_row, i) * x[i];
    out[t] = acc;
  }
}

}  // namespace

// One row and one token at a time: the scalar path gains nothing from tiles.
Kernel scalar_kernel(DType type) {
  const auto make = [](DotKernel dot) { return Kernel{dot, 1, 1}; };
  switch (type) {
    case DType::F32: return make(dot_float<DType::F32>);
    case DType::F16: return make(dot_float<DType::F16>);
    case DType::BF16: return make(dot_float<DType::BF16>);
    case DType::Q4_0: return make(dot_quantized<DType::Q4_0, ActivationBlock32>);
    case DType::Q4_1: return make(dot_quantized<DType::Q4_1, ActivationBlock32>);
    case DType::Q5_0: return make(dot_quantized<DType::Q5_0, ActivationBlock32>);
    case DType::Q5_1: return make(dot_quantized<DType::Q5_1, ActivationBlock32>);
    case DType::Q8_0: return make(dot_quantized<DType::Q8_0, ActivationBlock32>);
    case DType::Q4_K: return make(dot_quantized<DType::Q4_K, ActivationBlock256>);
    case DType::Q5_K: return make(dot_quantized<DType::Q5_K, ActivationBlock256>);
    case DType::Q6_K: return make(dot_quantized<DType::Q6_K, ActivationBlock256>);
    default: return {};
  }
}

}  // namespace strata::tensor::kernels
