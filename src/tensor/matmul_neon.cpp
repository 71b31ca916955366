// The baseline armv8-a build of the aarch64 kernels: every 64-bit ARM CPU has NEON.
#include "tensor/matmul_neon.inc"

namespace strata::tensor::kernels {
InterleavedKernels neon_interleaved(DType type) { return interleaved_for(type); }
VectorKernels neon_vector_ops() { return vector_ops_for(); }
}  // namespace strata::tensor::kernels
