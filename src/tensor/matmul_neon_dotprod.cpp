// Built with the dot-product extension (armv8.2-a+dotprod); only called when the CPU has it.
// sdot adds four byte products to each 32-bit lane in one instruction, without the 16-bit
// step of the plain build.
#include "tensor/matmul_neon.inc"

namespace strata::tensor::kernels {
InterleavedKernels neon_dotprod_interleaved(DType type) { return interleaved_for(type); }
VectorKernels neon_dotprod_vector_ops() { return vector_ops_for(); }
}  // namespace strata::tensor::kernels
