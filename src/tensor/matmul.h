// Weight-matrix times activations, the hot loop of inference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

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

  // Several matrices prepared one after another in one allocation (a MoE layer's experts),
  // so that they lie on 2 MiB pages even where each is smaller than one. Throws as above.
  static std::vector<PreparedMatrix> together(std::span<const Matrix> sources);

  // Of each of `sources`, each of `ranges` of its columns as a matrix of its own, all prepared
  // together source after source (source s's range r at [s * ranges.size() + r]), so that one
  // source's ranges lie one after another and a step that reads them all reads one stream:
  // a tensor-parallel member's columns of a projection whose input the members share, or the
  // leaves of an expert's down (model/tensor_share.h). Their source().data is nullptr (the
  // kernels read the interleaved copy alone). Throws std::invalid_argument for a range that is
  // not whole blocks of a source.
  struct ColumnRange {
    int64_t first;
    int64_t count;
  };
  static std::vector<PreparedMatrix> columns(std::span<const Matrix> sources, std::span<const ColumnRange> ranges);

  const Matrix& source() const { return source_; }
  // The interleaved copy (nullptr for a matrix without rows), and its bytes: what a matmul
  // with it reads of the weights, front to back on one thread.
  const std::byte* interleaved() const { return interleaved_; }
  std::span<const std::byte> interleaved_region() const;

 private:
  PreparedMatrix(const Matrix& source, std::shared_ptr<const std::byte> storage, std::byte* interleaved);

  Matrix source_{};
  std::shared_ptr<const std::byte> storage_;  // owns interleaved_, alone or with others
  const std::byte* interleaved_ = nullptr;
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

// A product whose input's columns are cut into leaves of leaf_cols (the last the rest): each
// leaf's product is a dot over its columns alone, from zero as a matrix of those columns would
// take it, and `steps`, run in order for every row and token, add them up into `outputs`
// outputs of w.rows each, y[(t * outputs + output) * rows + r]. So a projection whose input's
// columns are shared out among a group's members adds up in one fixed order that one Model
// and every member keep (model/leaf_tree.h writes the steps). Each step writes one of
// kLeafSlots partial sums: Leaf, leaf `arg`'s product; Add, slot + slot `arg` (in that order);
// Store reads it into output `arg`. leaf_cols is a whole number of leaf_unit(w's type), unless
// one leaf takes every column.
struct LeafStep {
  enum class Kind : uint8_t { Leaf, Add, Store };
  Kind kind = Kind::Leaf;
  uint8_t slot = 0;
  uint16_t arg = 0;
};
inline constexpr int kLeafSlots = 8;
struct LeafProgram {
  int64_t leaf_cols = 0;
  std::span<const LeafStep> steps;
  int outputs = 1;
};
// The columns a leaf of weights of `type` must be a whole number of: its layout's units.
int64_t leaf_unit(DType type);

// Products over inputs of their own (a Mixture of Experts' experts, each over the rows that
// chose it), each y exactly what its own matmul gives, in as few parallel loops as their
// layouts allow: one thread wait for all of them rather than one per product.
struct MatmulJob {
  Product product;
  const float* x;
  int64_t n_tokens;
  const LeafProgram* leaves = nullptr;  // set: y as LeafProgram says
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
