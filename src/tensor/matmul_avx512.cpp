// Built with AVX-512 F/BW/VL/VNNI on top of the AVX2 flags; only called when the CPU has
// them. VNNI's dpbusd does the u8 x s8 dot in one instruction, without the int16 step.
// GCC 12 flags the deliberately undefined pass-through operands inside the 512-bit
// intrinsics (_mm512_undefined_*, e.g. in cvtepi32_ps) as uninitialized
// (GCC bug 105593); the diagnostic points into the header, so it is turned off before it.
// Clang has neither the bug nor the warning group.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "tensor/matmul_x86.inc"

namespace strata::tensor::kernels {
InterleavedKernels avx512_interleaved(DType type) { return interleaved_for(type); }
VectorKernels avx512_vector_ops() { return vector_ops_for(); }
}  // namespace strata::tensor::kernels
