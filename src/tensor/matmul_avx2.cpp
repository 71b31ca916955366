// Built with -mavx2 -mfma -mf16c; only called when the CPU has them.
#include <immintrin.h>

namespace strata::tensor::kernels {
namespace {

// Tiles sized so that accumulators and weights fit the 16 ymm registers.
constexpr int kTokenTile = 4;
constexpr int kRowTile = 2;

}  // namespace
}  // namespace strata::tensor::kernels

#include "tensor/matmul_x86.inc"

namespace strata::tensor::kernels {
Kernel avx2_kernel(DType type) { return kernel_for(type); }
InterleavedKernels avx2_interleaved(DType type) { return interleaved_for(type); }
}  // namespace strata::tensor::kernels
