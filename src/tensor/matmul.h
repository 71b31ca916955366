// Weight-matrix times activations, the hot loop of inference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>

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

// A weight matrix in the layout its kernels read, prepared once (at model load): a copy in
// groups of 16 interleaved rows, so the source's memory may be let go afterwards.
class PreparedMatrix {
 public:
  PreparedMatrix() = default;
  // Throws std::invalid_argument for types without kernels and for cols that are not a
  // whole number of blocks.
  explicit PreparedMatrix(const Matrix& source);

  const Matrix& source() const { return source_; }
  // The interleaved copy (nullptr for a matrix without rows).
  const std::byte* interleaved() const { return interleaved_.get(); }

 private:
  struct FreeAligned {
    void operator()(std::byte* p) const;
  };
  Matrix source_{};
  std::unique_ptr<std::byte, FreeAligned> interleaved_;
};

// y[t * rows + r] = sum_k W[r][k] * x[t * cols + k] for t in [0, n_tokens).
//
// Determinism: y[t][r] is bit-identical whatever n_tokens, the other rows of x and the
// thread count are, and whatever the ISA: each token row of x is quantized on its own
// (Q8-like blocks for quantized weights, kept fp32 otherwise) and every (row, token) dot
// product runs one fixed sequence of operations, the same on every ISA.
void matmul(const PreparedMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

// y = W x for several matrices with the same input and cols (a layer's q, k and v; gate and
// up), each y exactly what its own matmul gives. Neighbours whose layouts allow it share one
// quantization of x and one parallel loop, which spares the threads a wait per matrix.
struct Product {
  const PreparedMatrix& w;
  float* y;
};
void matmul(std::initializer_list<Product> products, const float* x, int64_t n_tokens, ThreadPool& pool);

// Products over inputs of their own (a Mixture of Experts' experts, each over the rows that
// chose it), each y exactly what its own matmul gives, in as few parallel loops as their
// layouts allow: one thread wait for all of them rather than one per product.
struct MatmulJob {
  Product product;
  const float* x;
  int64_t n_tokens;
};
void matmul(std::span<const MatmulJob> jobs, ThreadPool& pool);

enum class Isa { Scalar, Avx2, Avx512, Neon, NeonDotprod };

// The paths this build has and this CPU runs, Scalar first and the fastest last. Avx2 needs
// AVX2+FMA+F16C; Avx512 needs AVX-512 F/BW/VL/VNNI on top of that; only x86-64 builds have
// them. Neon is every aarch64 CPU; NeonDotprod needs the dot-product extension (sdot, Armv8.2
// and later); only aarch64 builds have them.
std::span<const Isa> available_isas();
// The fastest available.
Isa detected_isa();
Isa active_isa();
// For tests and benchmarks; an ISA that is not available gives detected_isa(). Not safe
// during a matmul.
void force_isa(Isa isa);
const char* isa_name(Isa isa);

}  // namespace strata::tensor
