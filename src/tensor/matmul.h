// Weight-matrix times activations, the hot loop of inference.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/thread_pool.h"

namespace strata::tensor {

// Row-major; each row is row_bytes(type, cols) bytes: a GGUF tensor with dims {cols, rows}.
struct Matrix {
  DType type;
  int64_t rows;
  int64_t cols;
  const void* data;
};

// y[t * rows + r] = sum_k W[r][k] * x[t * cols + k] for t in [0, n_tokens).
//
// Determinism: y[t][r] is bit-identical whatever n_tokens, the other rows of x and the
// thread count are: each token row of x is quantized on its own (Q8-like blocks for
// quantized weights, kept fp32 otherwise) and every (row, token) dot product runs one
// fixed sequence of operations for the active ISA. Different ISAs give different bits.
// Throws std::invalid_argument for types without kernels and for cols that are not a
// whole number of blocks.
void matmul(const Matrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

enum class Isa { Scalar, Avx2, Avx512 };

// Avx2 needs AVX2+FMA+F16C; Avx512 needs AVX-512 F/BW/VL/VNNI on top of that.
Isa detected_isa();
Isa active_isa();
// For tests and benchmarks; clamps to detected_isa(). Not safe during a matmul.
void force_isa(Isa isa);
const char* isa_name(Isa isa);

}  // namespace strata::tensor
