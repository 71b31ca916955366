// The interleaved weight layout: groups of 16 rows whose blocks are stored so that one
// vector lane holds one row. A kernel then multiplies 16 rows by one token with one
// integer dot product per 4 columns and one scale step per block, instead of one per
// (row, block). Internal to the tensor module: matmul.cpp packs, the kernels read.
//
// Group g (rows 16g .. 16g + 15, zero rows past the matrix's end) is a sequence of units,
// each of blocks_per_unit blocks (a whole number of cache lines): first those blocks' meta
// (scales), then their levels; a missing last block of the last unit is zero. A kernel
// thus reads a group as one sequential stream, which the hardware prefetcher follows best
// (measured, one token: Q4_K_M decode about 15% faster than with all meta after all
// levels); the kernels' software prefetches (matmul_x86.inc) run a few KiB ahead of it.
//
// 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, whose element value is
// d * (u - offset) + m for an unsigned level u (m only for Q4_1 and Q5_1; offset 8 for
// Q4_0, 16 for Q5_0, 128 for Q8_0, else 0). A block's meta is its 16 rows' fp16 d, then
// for Q4_1/Q5_1 their fp16 m. A block's levels are 64-byte chunks whose dword lane r is
// row r's 4 bytes:
//   Q4_0, Q4_1, Q5_0, Q5_1: chunk m (0..3) holds row r's qs[4m .. 4m + 3] as stored by
//         ggml: low nibbles are elements 4m .. 4m + 3, high nibbles 16 + 4m .. 16 + 4m + 3.
//         Q5_0/Q5_1 follow with one plane of fifth bits laid out as a K-quant's (below,
//         high_bits = 1): byte k of lane r holds at bit 2m the fifth bit of element 4m + k
//         and at bit 2m + 1 that of element 16 + 4m + k. Such a block is thus laid out as
//         one K-quant sub-block, and the kernels decode both with the same code.
//   Q8_0: chunk j (0..7) holds elements 4j .. 4j + 3 as u = q + 128.
// Two blocks per unit, which makes a unit a whole number of cache lines for each. (One
// block would do for Q4_1 and Q5_1, but Q5_1's 6-line units measured half as fast as
// 12-line ones in one-token decode from DRAM: 11.5 against 24.6 GB/s on one thread.)
//
// K-quants: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, 256-element super-blocks in the same group
// layout. Element value is d * scale[j] * (u - offset) - dmin * min[j] over scale groups j of
// `group` elements (Q4_K/Q5_K: 32 with a 6-bit scale and min, offset 0; Q6_K: 16 with a
// signed 8-bit scale, no min, offset 32; Q3_K: 16 with a signed 6-bit scale, no min, offset
// 4; Q2_K: 16 with a 4-bit scale and min, offset 0). A level u is a low field of low_bits
// (4 or 2) and high_bits more above it. Each field of w bits lies in planes of 64 bytes that
// hold 4 / w chunks each: chunk m's field is in plane m / (4 / w), byte k of lane r, at bit
// 2w * p for the low-nibble element and w more for the high-nibble one, p = m % (4 / w).
//   sub-block s (0..7, elements 32s .. 32s + 31) takes sub_block_bytes: first the planes of
//            its low fields, then those of its high fields. Chunk m, byte k of lane r stands
//            for elements 32s + 4m + k ("low nibble") and 32s + 16 + 4m + k ("high nibble").
//            With w = 4 the low planes are 4 chunks laid out as one Q4_0 block. (Measured:
//            Q6_K one-token matmul 18% faster than with all planes after all nibbles.)
// So that decode streams about as many bytes as the source file, scales and mins take one
// byte each rather than a full lane. Meta of a super-block:
//   Q4_K, Q5_K: d[16], dmin[16] (fp16), scale[8][16] (u8, row r of sub-block s at 16s + r),
//               min pairs[4][16][2] (u8, min[2k] and min[2k + 1] of row r at 32k + 2r);
//   Q2_K:       d[16], dmin[16] (fp16), pairs[8][16][2] of the file's bytes scale | min << 4
//               (groups 2k and 2k + 1 of row r at 32k + 2r): the kernels split the nibbles,
//               so that the layout is exactly the file's 84 bytes per row and super-block;
//   Q6_K, Q3_K: d[16] (fp16), scale[16][16] (s8, row r of group j at 16j + r); Q6_K then
//               has 32 bytes of padding to a whole cache line, Q3_K two super-blocks per
//               unit instead. Q3_K's 6-bit scales as bytes make its layout 1824 bytes per 16
//               rows and super-block against the file's 1760: 3.6% more, the price of the
//               kernels' reading them as Q6_K's are (packed in 6 bits, 1760 bytes would still
//               not be a whole number of cache lines). A row of an odd number of super-blocks
//               adds a zero one (Llama 2 7B's ffn_down, 43 of them: 2.3% more).
//
// Table formats: IQ4_NL and MXFP4 laid out as Q4_0, IQ4_XS as a K-quant without a min
// (group 32, high_bits = 0), but each nibble is the index of the signed value table[nibble]
// (quant_blocks.h). offset is 128: an ISA whose dot multiplies unsigned bytes takes
// u = value + 128 and starts from the activation's start, like Q8_0; one that multiplies
// signed bytes takes the value and starts from 0. Either way the integer is the same.
// Meta: IQ4_NL d[16] (fp16), MXFP4 e[16] (its E8M0 byte, which fp16 cannot hold), four
// blocks per unit so that a unit is whole lines; IQ4_XS d[16] (fp16), scale[8][16] (s8,
// row r of sub-block s at 32 + 16s + r, as Q6_K's), then 32 bytes of padding.
//
// Float formats: F32, F16 and BF16, one element per block and no meta: block k holds
// column k of the 16 rows in their stored type, so that one vector load takes a column
// (F16 and BF16 two blocks per unit). Any number of columns fits, ragged ones included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"

namespace strata::tensor::interleaved {
// Internal linkage, as in quant_blocks.h: the AVX translation units include this too.
namespace {

inline constexpr int kRows = 16;

enum class Table { None, Iq4nl, Mxfp4 };

struct Format {
  int block = 0;         // elements per block; 0 for types without this layout
  int levels_bytes = 0;  // per block of a group
  int meta_bytes = 0;    // per block of a group
  int blocks_per_unit = 1;
  int offset = 0;        // subtracted from every level
  int high_bits = 0;     // bits of a level above its nibble (not Q8_0, whose levels are bytes)
  int group = 0;         // elements per scale, K-quants only
  bool has_min = false;
  int low_bits = 4;      // bits of a level's low field: its nibble, or Q2_K's and Q3_K's 2 bits
  bool scale_min_nibbles = false;  // Q2_K: a scale and a min share a byte
  Table table = Table::None;
  bool e8m0 = false;     // d is an E8M0 byte per row (e8m0_to_fp32_half), not fp16
};

[[maybe_unused]] constexpr const int8_t* table_values(Table t) {
  return t == Table::Iq4nl ? kIq4nlValues : kMxfp4Values;
}

// Offsets within a block's meta. After d[16], the formats with a min term keep the fp16
// factor of that term: m of Q4_1/Q5_1, dmin of Q4_K/Q5_K.
inline constexpr int kMetaMinFactor = 2 * kRows;
inline constexpr int kMetaScales45 = 4 * kRows;
inline constexpr int kMetaMins = kMetaScales45 + 8 * kRows;
inline constexpr int kMetaScaleMinPairs = 4 * kRows;
inline constexpr int kMetaScales6 = 2 * kRows;

[[maybe_unused]] constexpr Format format_of(DType type) {
  switch (type) {
    case DType::Q4_0: return {32, 256, 2 * kRows, 2, 8};
    case DType::Q4_1: return {32, 256, 4 * kRows, 2, 0, 0, 0, true};
    case DType::Q5_0: return {32, 256 + 64, 2 * kRows, 2, 16, 1};
    case DType::Q5_1: return {32, 256 + 64, 4 * kRows, 2, 0, 1, 0, true};
    case DType::Q8_0: return {32, 512, 2 * kRows, 2, 128};
    case DType::Q4_K: return {256, 2048, kMetaMins + 8 * kRows, 1, 0, 0, 32, true};
    case DType::Q5_K: return {256, 2048 + 8 * 64, kMetaMins + 8 * kRows, 1, 0, 1, 32, true};
    case DType::Q6_K: return {256, 2048 + 16 * 64, kMetaScales6 + 16 * kRows + 32, 1, 32, 2, 16, false};
    case DType::Q3_K: return {256, 1024 + 8 * 64, kMetaScales6 + 16 * kRows, 2, 4, 1, 16, false, 2};
    case DType::Q2_K: return {256, 1024, kMetaScaleMinPairs + 16 * kRows, 1, 0, 0, 16, true, 2, true};
    // The table formats: 4-bit levels (low_bits 4), no shared scale|min byte.
    case DType::IQ4_NL: return {32, 256, 2 * kRows, 2, 128, 0, 0, false, 4, false, Table::Iq4nl};
    case DType::MXFP4: return {32, 256, kRows, 4, 128, 0, 0, false, 4, false, Table::Mxfp4, true};
    case DType::IQ4_XS: return {256, 2048, kMetaScales6 + 8 * kRows + 32, 1, 128, 0, 32, false, 4, false, Table::Iq4nl};
    case DType::F32: return {1, 4 * kRows, 0, 1};
    case DType::F16: case DType::BF16: return {1, 2 * kRows, 0, 2};
    default: return {};
  }
}

[[maybe_unused]] constexpr int sub_block_bytes(Format f) { return 64 * (f.low_bits + f.high_bits); }

// Where a K-quant's scales start in its meta: unsigned after d and dmin with a min, signed
// after d without.
[[maybe_unused]] constexpr int scales_at(Format f) { return f.has_min ? kMetaScales45 : kMetaScales6; }

[[maybe_unused]] constexpr size_t unit_bytes(Format f) {
  return static_cast<size_t>(f.blocks_per_unit) * static_cast<size_t>(f.levels_bytes + f.meta_bytes);
}

constexpr bool units_are_whole_lines() {
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4, DType::F32,
                     DType::F16, DType::BF16}) {
    if (unit_bytes(format_of(type)) % 64 != 0) return false;
  }
  return true;
}
static_assert(units_are_whole_lines());

[[maybe_unused]] size_t group_bytes(Format f, int64_t n_blocks) {
  return static_cast<size_t>((n_blocks + f.blocks_per_unit - 1) / f.blocks_per_unit) * unit_bytes(f);
}

// Block b's levels and meta within its group (Byte: uint8_t or const uint8_t).
template <class Byte>
Byte* levels_at(Format f, Byte* group, int64_t b) {
  return group + static_cast<size_t>(b / f.blocks_per_unit) * unit_bytes(f) +
         static_cast<size_t>(f.blocks_per_unit * f.meta_bytes) +
         static_cast<size_t>(b % f.blocks_per_unit) * static_cast<size_t>(f.levels_bytes);
}
template <class Byte>
Byte* meta_at(Format f, Byte* group, int64_t b) {
  return group + static_cast<size_t>(b / f.blocks_per_unit) * unit_bytes(f) +
         static_cast<size_t>(b % f.blocks_per_unit) * static_cast<size_t>(f.meta_bytes);
}

}  // namespace
}  // namespace strata::tensor::interleaved
