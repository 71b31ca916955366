// Float vector operations for the parts of a layer that are not matrix products (attention
// scores, softmax, SiLU) and for quantizing activations. Each result depends only on its
// inputs and length, never on alignment, threads, batch or CPU, so they keep the engine
// bit-exact.
#pragma once

#include <cstdint>

namespace strata::tensor {

// Attention keys are stored in blocks of kKeyBlock positions, dimension-major within a
// block: element d of key i is at blocks[(i / kKeyBlock) * block_stride + d * kKeyBlock +
// i % kKeyBlock]. One vector load then takes a dimension of many keys, and no dot product
// needs a horizontal sum.
inline constexpr int kKeyBlock = 16;
// scores[q * score_stride + i] = the sum over d < n of queries[q * query_stride + d] *
// (element d of key i) as a chain of fused multiply-adds in dimension order from 0, for
// i < key_count and q < query_count (attention: the query heads that share one key head,
// against its keys). On the active ISA (matmul.h), with the same bits on every one.
void key_scores(const float* queries, int64_t query_stride, int query_count, const float* blocks,
                int64_t block_stride, int64_t n, int64_t key_count, float* scores, int64_t score_stride);
// y[i] = fma(alphas[r], rows[r * row_stride + i], y[i]), row after row (attention: weighted
// values). On the active ISA, with the same bits on every one.
void add_scaled_rows(const float* alphas, const float* rows, int64_t row_stride, int64_t row_count,
                     int64_t n, float* y);
// dst[i] = src[i] widened from IEEE half precision, exactly (a signaling NaN may come out
// quiet). On the active ISA, with the same bits on every one.
void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n);
// The numerators of softmax(scale * x): x[i] = exp(scale * x[i] - max_j scale * x[j]),
// within 3e-7 relative (the exponent is clamped to -87). Returns their sum, added in 8
// fixed lanes (attention: scores in, unnormalized weights and their total out).
float softmax_numerators(float* x, int64_t n, float scale);
// qs[i] = round(x[i] / d), halves away from zero, clamped to [-127, 127], with
// d = max |x| / 127 (returned; 0 for all zeros): an activation block for integer dot products.
float quantize_int8(const float* x, int64_t n, int8_t* qs);
// gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void silu_times(float* gate, const float* up, int64_t n);
// gpt-oss's gated unit: with g = min(gate[i], limit) and u = clamp(up[i], -limit, limit),
// gate[i] = g / (1 + exp(-alpha * g)) * (u + 1).
void clamped_swiglu_times(float* gate, const float* up, int64_t n, float alpha, float limit);
// gate[i] = gelu(gate[i]) * up[i], GELU's tanh form: gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
void gelu_times(float* gate, const float* up, int64_t n);

}  // namespace strata::tensor
