#include "tensor/vector_ops.h"

#include "tensor/matmul_kernels.h"

// Each operation runs on the active ISA's kernels (matmul.h), which all compute the same bits.
namespace strata::tensor {

void key_scores(const float* queries, int64_t query_stride, int query_count, const float* blocks, int64_t block_stride,
                int64_t n, int64_t key_count, float* scores, int64_t score_stride) {
  kernels::active_vector_ops().key_scores(queries, query_stride, query_count, blocks, block_stride, n, key_count,
                                          scores, score_stride);
}

void add_scaled_rows(const float* alphas, const float* rows, int64_t row_stride, int64_t row_count, int64_t n,
                     float* y) {
  kernels::active_vector_ops().add_scaled_rows(alphas, rows, row_stride, row_count, n, y);
}

void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n) {
  kernels::active_vector_ops().fp16_to_fp32(src, dst, n);
}

float softmax_numerators(float* x, int64_t n, float scale) {
  return kernels::active_vector_ops().softmax_numerators(x, n, scale);
}

float quantize_int8(const float* x, int64_t n, int8_t* qs) {
  return kernels::active_vector_ops().quantize_int8(x, n, qs);
}

void silu_times(float* gate, const float* up, int64_t n) { kernels::active_vector_ops().silu_times(gate, up, n); }

void gelu_times(float* gate, const float* up, int64_t n) { kernels::active_vector_ops().gelu_times(gate, up, n); }

void clamped_swiglu_times(float* gate, const float* up, int64_t n, float alpha, float limit) {
  kernels::active_vector_ops().clamped_swiglu_times(gate, up, n, alpha, limit);
}

}  // namespace strata::tensor
