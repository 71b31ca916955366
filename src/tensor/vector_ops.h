// Float vector operations for the parts of a layer that are not matrix products (attention
// scores, softmax, SiLU) and for quantizing activations. Each result depends only on its
// inputs and length, never on alignment, threads, batch or CPU, so they keep the engine
// bit-exact.
#pragma once

#include <cstdint>

namespace strata::tensor {

// out[r] = sum over i < n of x[i] * rows[r * row_stride + i], for r < row_count; each sum in
// 16 fixed lanes reduced in a fixed order (attention scores: one query against its keys).
void dot_rows(const float* x, const float* rows, int64_t row_stride, int64_t row_count, int64_t n,
              float* out);
// y[i] += alphas[r] * rows[r * row_stride + i], row after row (attention: weighted values).
void add_scaled_rows(const float* alphas, const float* rows, int64_t row_stride, int64_t row_count,
                     int64_t n, float* y);
// The numerators of softmax(scale * x): x[i] = exp(scale * x[i] - max_j scale * x[j]),
// within 3e-7 relative (the exponent is clamped to -87). Returns their sum, added in 8
// fixed lanes (attention: scores in, unnormalized weights and their total out).
float softmax_numerators(float* x, int64_t n, float scale);
// qs[i] = round(x[i] / d), halves away from zero, clamped to [-127, 127], with
// d = max |x| / 127 (returned; 0 for all zeros): an activation block for integer dot products.
float quantize_int8(const float* x, int64_t n, int8_t* qs);
// gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void silu_times(float* gate, const float* up, int64_t n);

}  // namespace strata::tensor
