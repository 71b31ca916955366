// The one place outside the kernel files that knows CPU architectures: instructions and
// feature probes that exist on one architecture only. The compiler builtins used elsewhere
// (__builtin_shufflevector, __builtin_convertvector, __builtin_bit_cast, __builtin_fmaf,
// __builtin_fabsf, __builtin_mul_overflow) are spelled alike by GCC 12 and clang 14, so none
// needs a wrapper; the other architectures' kernel files are not compiled at all.
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

namespace strata::tensor::platform {

// Tells the core that a spin-wait loop is spinning, so that it yields to its sibling
// hyperthread and saves power.
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#if defined(__x86_64__)
// What the x86 kernel paths need from the CPU and from the OS (which must save the wider
// registers on a context switch). Read with cpuid and xgetbv: __builtin_cpu_supports knows
// different feature names in GCC and clang (clang 14 lacks "f16c").
struct X86Features {
  bool avx2_fma_f16c = false;
  bool avx512_f_bw_vl_vnni = false;
};

inline X86Features x86_features() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return {};
  const auto bit = [](unsigned reg, int n) { return (reg >> n & 1u) != 0; };
  const bool fma = bit(ecx, 12), osxsave = bit(ecx, 27), avx = bit(ecx, 28), f16c = bit(ecx, 29);
  if (!osxsave || !avx) return {};
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  constexpr unsigned kSseAvxState = 0x6, kAvx512State = 0xE0;
  if ((xcr0_low & kSseAvxState) != kSseAvxState) return {};
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return {};
  X86Features features;
  features.avx2_fma_f16c = bit(ebx, 5) && fma && f16c;
  features.avx512_f_bw_vl_vnni = features.avx2_fma_f16c && (xcr0_low & kAvx512State) == kAvx512State &&
                                 bit(ebx, 16) && bit(ebx, 30) && bit(ebx, 31) && bit(ecx, 11);
  return features;
}
#endif

#if defined(__aarch64__)
// Whether the CPU has the dot-product extension (sdot/udot), which armv8-a lacks and nearly
// every core since Armv8.2 has. Asked of the OS: the ID registers are not readable from user
// space everywhere.
inline bool arm_dot_product() {
#if defined(__linux__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
  int present = 0;
  size_t size = sizeof present;
  return sysctlbyname("hw.optional.arm.FEAT_DotProd", &present, &size, nullptr, 0) == 0 && present != 0;
#else
  return false;
#endif
}
#endif

}  // namespace strata::tensor::platform
