// Built with -mavx2 -mfma -mf16c; only called when the CPU has them.
#include <immintrin.h>

namespace strata::tensor::kernels {
namespace {

__m256i dot_u8_s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

}  // namespace
}  // namespace strata::tensor::kernels

#include "tensor/matmul_x86.inc"

namespace strata::tensor::kernels {
DotKernel avx2_kernel(DType type) { return kernel_for(type); }
}  // namespace strata::tensor::kernels
