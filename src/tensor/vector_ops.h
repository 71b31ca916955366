// Float vector operations for the parts of a layer that are not matrix products (attention
// scores, softmax, SiLU). Each result depends only on its inputs and length, never on
// alignment, threads or batch, so they keep the engine bit-exact.
#pragma once

#include <cstdint>

namespace strata::tensor {

// Sum of a[i] * b[i], accumulated in 16 fixed lanes and reduced in a fixed order.
float dot(const float* a, const float* b, int64_t n);
// y[i] += alpha * x[i]
void add_scaled(float alpha, const float* x, float* y, int64_t n);
// x[i] = exp(x[i]); within 3e-7 relative on [-87, 88], clamped outside.
void exp_in_place(float* x, int64_t n);
// gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void silu_times(float* gate, const float* up, int64_t n);

}  // namespace strata::tensor
