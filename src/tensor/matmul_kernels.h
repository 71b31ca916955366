// Interface between the matmul driver and its per-ISA kernels. Types and declarations only:
// it is included by translation units built with different ISA flags.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace strata::tensor::kernels {

// One token row of x quantized for integer dot products: qs = round(x / d), |qs| <= 127,
// one d per block; sums[k] is the sum of qs[16k .. 16k + 15], for the weight formats
// whose value has a min term or an offset.
struct ActivationBlock32 {
  float d;
  int16_t sums[2];
  int8_t qs[32];
};
static_assert(sizeof(ActivationBlock32) == 40);

// Blocks 2p and 2p + 1 of a row of ActivationBlock32, for kernels that take two blocks per
// 512-bit vector (Kernel::paired_activations): dword lane 2i of qs holds elements
// 4i .. 4i + 3 of block 2p, lane 2i + 1 the same of block 2p + 1, so that the pair is one
// 64-byte operand; d[k] is block k's d and neg_sums[k] = -(sums[0] + sums[1]). An odd last
// block is paired with an all-zero one.
struct ActivationPair64 {
  float d[2];
  int32_t neg_sums[2];
  int8_t qs[64];
};
static_assert(sizeof(ActivationPair64) == 80);

inline constexpr int kMaxTokenTile = 4;
inline constexpr int kMaxRowTile = 4;

// The activations of the tokens one kernel call handles.
struct TokenTile {
  // Per token, a row of ActivationBlock32 (or ActivationPair64, see Kernel) for quantized
  // weights, of fp32 values for F32/F16/BF16.
  const void* rows[kMaxTokenTile];
  int n_tokens;  // 1 .. Kernel::max_tokens
  // For the 32-element formats, ActivationBlock32::d of every block of the tile's tokens,
  // block-major: block_scales[b * Kernel::max_tokens + t], zero past n_tokens. Lets a
  // kernel scale a weight block for all tokens with one vector multiply.
  const float* block_scales;
};

// out[r * kMaxTokenTile + t] = dot(weight row r, token t of tile) over cols elements, for
// r < n_rows <= Kernel::max_rows <= kMaxRowTile; row r starts at weight_rows + r * row_stride bytes.
using DotKernel = void (*)(const void* weight_rows, size_t row_stride, int n_rows, int64_t cols,
                           const TokenTile& tile, float* out);

struct Kernel {
  DotKernel dot = nullptr;  // nullptr for types without kernels
  int max_rows = 1;
  int max_tokens = 1;  // <= kMaxTokenTile
  // For the 32-element formats: token rows are ActivationPair64 rather than ActivationBlock32.
  bool paired_activations = false;
};

// One token's block of x quantized for the interleaved kernels (interleaved.h): qs =
// round(x / d), |qs| <= 127; start = -offset * sum(qs), the integer the dot product starts
// from so that it sums (u - offset) * qs; sum = sum(qs) (exact as a float), which the
// formats with a min multiply by m.
struct InterleavedActivation {
  float d;
  int32_t start;
  float sum;
  int8_t qs[32];
};
static_assert(sizeof(InterleavedActivation) == 44);

// The same for the K-quants' 256-element super-blocks. starts[j] = -offset * (sum of
// qs[16j .. 16j + 15]) starts the dot of scale group j (Q6_K); sums[s] is the sum of
// qs[32s .. 32s + 31], which the mins multiply (Q4_K, Q5_K).
struct InterleavedActivation256 {
  float d;
  int32_t starts[16];
  int16_t sums[8];
  int8_t qs[256];
};
static_assert(sizeof(InterleavedActivation256) == 340);

inline constexpr int kMaxInterleavedTokens = 8;

// out[t * 16 + r] = dot(row r of the group, token t) for t < n_tokens <= max_tokens, where
// tokens[t] is a row of InterleavedActivation (32-element formats) or
// InterleavedActivation256 (K-quants). Every (row, token) runs the same arithmetic on every
// ISA, so all give the same bits. Blocks are added in order from acc = 0:
//   32-element formats: an exact integer dot = sum (u - offset) * qs, then
//     acc = fma(float(dot), dw * dx, acc), and for the formats with a min (Q4_1, Q5_1)
//     acc = fma(float(sum qs), m * dx, acc);
//   K-quants: exact integers isum = sum_j scale[j] * sum_{i in j} (u - offset) * qs and
//     msum = sum_j min[j] * sum_{i in j} qs, then acc = fma(float(isum), d * dx, acc),
//     and for the formats with mins acc = fma(-float(msum), dmin * dx, acc).
using InterleavedKernel = void (*)(const uint8_t* group, int64_t n_blocks, const void* const* tokens,
                                   int n_tokens, float* out);

struct InterleavedKernels {
  InterleavedKernel run = nullptr;  // nullptr for types without an interleaved layout
  int max_tokens = 1;
};

Kernel scalar_kernel(DType type);
Kernel avx2_kernel(DType type);
Kernel avx512_kernel(DType type);
InterleavedKernels scalar_interleaved(DType type);
InterleavedKernels avx2_interleaved(DType type);
InterleavedKernels avx512_interleaved(DType type);

}  // namespace strata::tensor::kernels
