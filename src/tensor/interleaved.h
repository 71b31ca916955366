// The interleaved weight layout: groups of 16 rows whose blocks are stored so that one
// vector lane holds one row. A kernel then multiplies 16 rows by one token with one
// integer dot product per 4 columns and one scale step per block, instead of one per
// (row, block). Internal to the tensor module: matmul.cpp packs, the kernels read.
//
// Formats: Q4_0 and Q8_0, whose element value is d * (u - offset) for an unsigned level u.
// Group g (rows 16g .. 16g + 15, zero rows past the matrix's end) is
//   quants[n_blocks][levels_bytes], then scales[n_blocks][16] (fp16 d of each row),
// padded to a multiple of 64 bytes. A block's levels are 64-byte chunks whose dword lane r
// is row r's 4 bytes:
//   Q4_0: chunk m (0..3) holds row r's qs[4m .. 4m + 3] as stored by ggml: low nibbles are
//         elements 4m .. 4m + 3, high nibbles elements 16 + 4m .. 16 + 4m + 3 (offset 8).
//   Q8_0: chunk j (0..7) holds elements 4j .. 4j + 3 as u = q + 128 (offset 128).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace strata::tensor::interleaved {
// Internal linkage, as in quant_blocks.h: the AVX translation units include this too.
namespace {

inline constexpr int kRows = 16;
inline constexpr int kBlock = 32;  // elements per block

struct Format {
  int levels_bytes = 0;  // per block of a group; 0 for types without this layout
  int offset = 0;        // subtracted from every level
};

[[maybe_unused]] constexpr Format format_of(DType type) {
  switch (type) {
    case DType::Q4_0: return {256, 8};
    case DType::Q8_0: return {512, 128};
    default: return {};
  }
}

[[maybe_unused]] size_t group_bytes(Format f, int64_t n_blocks) {
  const size_t bytes = static_cast<size_t>(n_blocks) * (static_cast<size_t>(f.levels_bytes) + 2 * kRows);
  return (bytes + 63) / 64 * 64;
}

[[maybe_unused]] size_t scales_offset(Format f, int64_t n_blocks) {
  return static_cast<size_t>(n_blocks) * static_cast<size_t>(f.levels_bytes);
}

}  // namespace
}  // namespace strata::tensor::interleaved
