// Exact scalar conversions between fp32 and the 16-bit float formats stored in GGUF files.
#pragma once

#include <bit>
#include <cstdint>

namespace strata::tensor {

constexpr float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {
    // Subnormal: mantissa * 2^-24 is exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Round to nearest, ties to even; overflow gives infinity, NaN stays a (quiet) NaN.
constexpr uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520
  if (magnitude < 0x38800000u) {
    // Below 2^-14 the result is subnormal: counting in units of 2^-24 is an integer
    // rounding, which adding 0.5 makes the FPU do with its own ties-to-even.
    const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3F000000u));
  }
  const uint32_t odd = (magnitude >> 13) & 1u;
  magnitude += 0xC8000FFFu + odd;  // rebias exponent by -112 and round the 13 dropped bits
  return static_cast<uint16_t>(sign | (magnitude >> 13));
}

constexpr float bf16_to_fp32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

constexpr uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// ggml_e8m0_to_fp32_half: 2^(e - 128), subnormal for e < 2 (MXFP4's scale; its table is
// doubled). Never NaN: ggml reads e = 255 as a number too.
constexpr float e8m0_to_fp32_half(uint8_t e) {
  return std::bit_cast<float>(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

}  // namespace strata::tensor
