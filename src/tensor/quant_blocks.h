// Byte layouts of the ggml block formats (ggml-common.h), and one integer view of all of
// them shared by dequantization and the scalar kernels. This header is also included by
// translation units built with AVX flags, so its only function body has internal linkage.
#pragma once

#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"

namespace strata::tensor {

inline constexpr int kQK = 32;    // elements per block of the 32-element formats
inline constexpr int kQK_K = 256; // elements per K-quant super-block

// Halves are raw fp16 bits. Q5 formats store the fifth bit of element j in bit j of qh.
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
// scales: eight 6-bit scales and eight 6-bit mins, packed as get_scale_min_k4 reads them.
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// Every supported block as integers: element i of group g is
//   d * scale[g] * q[i] + dm * min[g]
// which reproduces ggml's dequantization bit for bit (e.g. Q4_K: dm = -dmin).
struct UnpackedBlock {
  int elements;    // 32 or 256
  int group_size;  // elements sharing one scale and min: 32 or 16
  float d;
  float dm;
  int8_t q[kQK_K];
  int8_t scale[16];
  uint8_t min[16];
};

// type must be one of the quantized types above.
void unpack_block(DType type, const void* block, UnpackedBlock& out);

// Internal linkage on purpose: the AVX translation units get their own copy, where a
// shared inline function would let the linker hand one ISA's build to everyone.
namespace {

// Q4_K/Q5_K sub-blocks 0..3 keep scale and min in the low 6 bits of bytes 0..3 and 4..7;
// sub-blocks 4..7 keep their low 4 bits in bytes 8..11 and their top 2 bits in the spare
// top bits of bytes 0..7 (ggml's get_scale_min_k4). Done four bytes at a time: each
// word holds the values of four sub-blocks, one per byte, little-endian.
struct KScaleWords {
  uint32_t scales_0_3;
  uint32_t scales_4_7;
  uint32_t mins_0_3;
  uint32_t mins_4_7;
};

[[maybe_unused]] inline KScaleWords unpack_k_scales(const uint8_t* packed) {
  uint32_t word[3];
  std::memcpy(word, packed, sizeof word);
  constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kLow2 = 0x03030303;
  return {word[0] & kLow6, (word[2] & kLow4) | (((word[0] >> 6) & kLow2) << 4), word[1] & kLow6,
          ((word[2] >> 4) & kLow4) | (((word[1] >> 6) & kLow2) << 4)};
}

}  // namespace

}  // namespace strata::tensor
