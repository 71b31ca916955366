// Built with -mavx2 -mfma -mf16c; only called when the CPU has them.
#include "tensor/matmul_x86.inc"

namespace strata::tensor::kernels {
InterleavedKernels avx2_interleaved(DType type) { return interleaved_for(type); }
VectorKernels avx2_vector_ops() { return vector_ops_for(); }
}  // namespace strata::tensor::kernels
