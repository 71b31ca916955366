// Interface between the matmul driver and its per-ISA kernels. Types and declarations only:
// it is included by translation units built with different ISA flags.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace strata::tensor::kernels {

// One token row of x quantized for integer dot products: qs = round(x / d), |qs| <= 127,
// one d per block; sums[k] is the sum of qs[16k .. 16k + 15], for the weight formats
// whose value has a min term. 32-element blocks serve the 32-element weight formats,
// 256-element ones the K-quants.
template <int N>
struct ActivationBlock {
  float d;
  int16_t sums[N / 16];
  int8_t qs[N];
};
using ActivationBlock32 = ActivationBlock<32>;
using ActivationBlock256 = ActivationBlock<256>;
static_assert(sizeof(ActivationBlock32) == 40 && sizeof(ActivationBlock256) == 292);

inline constexpr int kMaxTokenTile = 4;

// out[i] = dot(weight_row, activations[i]) for i < n_tokens <= kMaxTokenTile, over cols
// elements. activations[i] points at a row of ActivationBlock32/256 for quantized
// weights, at fp32 values for F32/F16/BF16.
using DotKernel = void (*)(const void* weight_row, int64_t cols,
                           const void* const* activations, int n_tokens, float* out);

// nullptr for types without kernels.
DotKernel scalar_kernel(DType type);
DotKernel avx2_kernel(DType type);
DotKernel avx512_kernel(DType type);

}  // namespace strata::tensor::kernels
