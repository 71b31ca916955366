// Interface between the matmul driver and its per-ISA kernels. Types and declarations only:
// it is included by translation units built with different ISA flags.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace strata::tensor::kernels {

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

// The same for the K-quants' 256-element super-blocks. group_sums[j] is the sum of
// qs[16j .. 16j + 15], which Q2_K's mins multiply, and starts[j] = -offset * group_sums[j]
// starts the dot of scale group j (Q3_K, Q6_K); sums[s] is the sum of qs[32s .. 32s + 31],
// which the mins of Q4_K and Q5_K multiply.
struct InterleavedActivation256 {
  float d;
  int32_t starts[16];
  int16_t sums[8];
  int16_t group_sums[16];
  int8_t qs[256];
};
static_assert(sizeof(InterleavedActivation256) == 372);

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
// Float formats take tokens[t] as the token's fp32 row, n_blocks long: column k adds to one
// of four partial sums, p[k % 4] = fma(w[k], x[k], p[k % 4]) in column order from 0, and
// the result is (p[0] + p[1]) + (p[2] + p[3]). Four chains keep a lone token's FMAs from
// waiting on each other's latency.
using InterleavedKernel = void (*)(const uint8_t* group, int64_t n_blocks, const void* const* tokens,
                                   int n_tokens, float* out);

struct InterleavedKernels {
  InterleavedKernel run = nullptr;  // nullptr for types without an interleaved layout
  int max_tokens = 1;
};

InterleavedKernels scalar_interleaved(DType type);
InterleavedKernels avx2_interleaved(DType type);
InterleavedKernels avx512_interleaved(DType type);
InterleavedKernels neon_interleaved(DType type);
InterleavedKernels neon_dotprod_interleaved(DType type);

// The float operations of vector_ops.h. Attention's two loops (key_scores, add_scaled_rows)
// are chains of fused multiply-adds, which every ISA rounds alike (the scalar path with
// fmaf); the others are the same lane arithmetic on every ISA (vector_lanes.inc).
struct VectorKernels {
  void (*key_scores)(const float* queries, int64_t query_stride, int query_count, const float* blocks,
                     int64_t block_stride, int64_t n, int64_t key_count, float* scores, int64_t score_stride);
  void (*add_scaled_rows)(const float* alphas, const float* rows, int64_t row_stride, int64_t row_count,
                          int64_t n, float* y);
  float (*softmax_numerators)(float* x, int64_t n, float scale);
  float (*quantize_int8)(const float* x, int64_t n, int8_t* qs);
  void (*silu_times)(float* gate, const float* up, int64_t n);
  void (*clamped_swiglu_times)(float* gate, const float* up, int64_t n, float alpha, float limit);
  void (*gelu_times)(float* gate, const float* up, int64_t n);
  void (*fp16_to_fp32)(const uint16_t* src, float* dst, int64_t n);  // exact on every ISA
};

VectorKernels scalar_vector_ops();
VectorKernels avx2_vector_ops();
VectorKernels avx512_vector_ops();
VectorKernels neon_vector_ops();
VectorKernels neon_dotprod_vector_ops();
// The kernels of the active ISA (matmul.h: active_isa).
VectorKernels active_vector_ops();

}  // namespace strata::tensor::kernels
