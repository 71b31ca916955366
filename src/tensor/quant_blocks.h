// Byte layouts of the ggml block formats (ggml-common.h), and one integer view of all of
// them shared by dequantization and the interleaved packing. Declarations only: translation
// units built with AVX flags include it too.
#pragma once

#include <cstdint>

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
// scales: scale | min << 4 of each 16-element group.
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d; uint16_t dmin; };
// scales: sixteen 6-bit scales (value + 32), packed as ggml's dequantize_row_q3_K reads them.
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
// Table formats: each nibble indexes a table of int8 values, nibbles laid out as Q4_0's
// (IQ4_XS: eight such 32-element runs). IQ4_XS's scale of run s is 6 bits, biased by 32:
// low 4 bits in nibble s % 2 of scales_l[s / 2], high 2 bits at bit 2s of scales_h. MXFP4's
// e is an E8M0 exponent; ggml scales its doubled E2M1 table by half of 2^(e - 127).
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
struct BlockMXFP4 { uint8_t e; uint8_t qs[16]; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136 && sizeof(BlockMXFP4) == 17);

// ggml's kvalues_iq4nl (IQ4_NL, IQ4_XS) and kvalues_mxfp4 (E2M1 values doubled).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Every supported block as integers: element i of group g is
//   d * scale[g] * q[i] + dm * min[g]
// which reproduces ggml's dequantization bit for bit (e.g. Q4_K and Q2_K: dm = -dmin; the
// table formats' q is the table's value). Formats without a min have dm = -0, whose term
// adds exactly nothing, not even to a product of -0.
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

}  // namespace strata::tensor
