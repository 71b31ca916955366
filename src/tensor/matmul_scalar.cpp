// Plain C++ kernels: the reference the SIMD kernels are tested against, and the path for
// CPUs without AVX2.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tensor/fp16.h"
#include "tensor/interleaved.h"
#include "tensor/matmul_kernels.h"
#include "tensor/quant_blocks.h"
#include "tensor/vector_lanes.inc"
#include "tensor/vector_ops.h"

namespace strata::tensor::kernels {
namespace {

// Element i of row r in a block of the interleaved layout, as the signed value u - offset
// (a table format's table[nibble]).
template <DType kType>
int interleaved_value(const uint8_t* block, int r, int i) {
  constexpr interleaved::Format kFormat = interleaved::format_of(kType);
  if constexpr (kType == DType::Q8_0) {
    return block[i / 4 * 64 + 4 * r + i % 4] - kFormat.offset;
  } else {
    // A level as in a Q4_x/Q5_x block of 32, or sub-block s of a K-quant's 256: a field of
    // w bits of chunk m is in plane m / (4 / w), at bit 2w * (m % (4 / w)), w more for the
    // high-nibble element.
    const int s = i / 32, half = i % 32 / 16, m = i % 16 / 4, k = i % 4;
    const auto field = [&](const uint8_t* planes, int w) {
      const uint8_t byte = planes[64 * (m / (4 / w)) + 4 * r + k];
      return (byte >> (2 * w * (m % (4 / w)) + w * half)) & ((1 << w) - 1);
    };
    const uint8_t* sub_block = block + interleaved::sub_block_bytes(kFormat) * s;
    int u = field(sub_block, kFormat.low_bits);
    if constexpr (kFormat.high_bits != 0) {
      u |= field(sub_block + 64 * kFormat.low_bits, kFormat.high_bits) << kFormat.low_bits;
    }
    if constexpr (kFormat.table != interleaved::Table::None) return interleaved::table_values(kFormat.table)[u];
    return u - kFormat.offset;
  }
}

float half_at(const uint8_t* meta, int index) {
  uint16_t h;
  std::memcpy(&h, meta + 2 * index, sizeof h);
  return fp16_to_fp32(h);
}

// Row r's d of a block, the first field of its meta.
template <DType kType>
float d_at(const uint8_t* meta, int r) {
  if constexpr (interleaved::format_of(kType).e8m0) return e8m0_to_fp32_half(meta[r]);
  return half_at(meta, r);
}

// Sums the values times qs directly, without the activation's starts and sums: an
// independent check of those the SIMD kernels rely on.
template <DType kType>
float interleaved_block(const uint8_t* block, const uint8_t* meta, int r, const InterleavedActivation& x,
                        float acc) {
  int32_t dot = 0;
  int32_t x_sum = 0;
  for (int i = 0; i < kQK; ++i) {
    dot += interleaved_value<kType>(block, r, i) * x.qs[i];
    x_sum += x.qs[i];
  }
  acc = std::fma(static_cast<float>(dot), d_at<kType>(meta, r) * x.d, acc);
  if constexpr (interleaved::format_of(kType).has_min) {
    acc = std::fma(static_cast<float>(x_sum), half_at(meta + interleaved::kMetaMinFactor, r) * x.d, acc);
  }
  return acc;
}

// Q2_K's byte scale | min << 4 of group j, row r.
int scale_min_pair(const uint8_t* meta, int r, int j) {
  return meta[interleaved::kMetaScaleMinPairs + 2 * interleaved::kRows * (j / 2) + 2 * r + j % 2];
}

template <DType kType>
float interleaved_block(const uint8_t* block, const uint8_t* meta, int r, const InterleavedActivation256& x,
                        float acc) {
  constexpr interleaved::Format kFormat = interleaved::format_of(kType);
  const auto scale = [&](int j) -> int {
    if constexpr (kFormat.scale_min_nibbles) return scale_min_pair(meta, r, j) & 0x0F;
    const uint8_t stored = meta[interleaved::scales_at(kFormat) + interleaved::kRows * j + r];
    if constexpr (kFormat.has_min) return stored;
    return static_cast<int8_t>(stored);
  };
  const auto min_of = [&](int j) -> int {
    if constexpr (kFormat.scale_min_nibbles) return scale_min_pair(meta, r, j) >> 4;
    return meta[interleaved::kMetaMins + 2 * interleaved::kRows * (j / 2) + 2 * r + j % 2];
  };
  int32_t isum = 0;
  int32_t msum = 0;
  for (int j = 0; j < kQK_K / kFormat.group; ++j) {
    int32_t dot = 0;
    int32_t x_sum = 0;
    for (int i = j * kFormat.group; i < (j + 1) * kFormat.group; ++i) {
      dot += interleaved_value<kType>(block, r, i) * x.qs[i];
      x_sum += x.qs[i];
    }
    isum += scale(j) * dot;
    if constexpr (kFormat.has_min) msum += min_of(j) * x_sum;
  }
  acc = std::fma(static_cast<float>(isum), d_at<kType>(meta, r) * x.d, acc);
  if constexpr (kFormat.has_min) {
    acc = std::fma(-static_cast<float>(msum), half_at(meta + interleaved::kMetaMinFactor, r) * x.d, acc);
  }
  return acc;
}

template <DType kType>
void interleaved_dot(const uint8_t* group, int64_t n_blocks, const void* const* tokens, int n_tokens,
                     float* out) {
  constexpr interleaved::Format kFormat = interleaved::format_of(kType);
  using Activation = std::conditional_t<kFormat.block == kQK, InterleavedActivation, InterleavedActivation256>;
  for (int t = 0; t < n_tokens; ++t) {
    for (int r = 0; r < interleaved::kRows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        acc = interleaved_block<kType>(interleaved::levels_at(kFormat, group, b), interleaved::meta_at(kFormat, group, b), r,
                                       static_cast<const Activation*>(tokens[t])[b], acc);
      }
      out[t * interleaved::kRows + r] = acc;
    }
  }
}

// Column k of row r, read from the layout in interleaved.h by its own arithmetic.
template <DType kType>
float interleaved_float(const uint8_t* group, int r, int64_t k) {
  constexpr interleaved::Format kFormat = interleaved::format_of(kType);
  const uint8_t* column = interleaved::levels_at(kFormat, group, k);
  if constexpr (kType == DType::F32) {
    float w;
    std::memcpy(&w, column + 4 * r, sizeof w);
    return w;
  } else {
    uint16_t h;
    std::memcpy(&h, column + 2 * r, sizeof h);
    return kType == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
  }
}

template <DType kType>
void interleaved_float_dot(const uint8_t* group, int64_t cols, const void* const* tokens, int n_tokens,
                           float* out) {
  for (int t = 0; t < n_tokens; ++t) {
    const auto* x = static_cast<const float*>(tokens[t]);
    for (int r = 0; r < interleaved::kRows; ++r) {
      float partial[4] = {};
      for (int64_t k = 0; k < cols; ++k) {
        partial[k % 4] = std::fma(interleaved_float<kType>(group, r, k), x[k], partial[k % 4]);
      }
      out[t * interleaved::kRows + r] = (partial[0] + partial[1]) + (partial[2] + partial[3]);
    }
  }
}

void scalar_key_scores(const float* queries, int64_t query_stride, int query_count, const float* blocks,
                       int64_t block_stride, int64_t n, int64_t key_count, float* scores, int64_t score_stride) {
  for (int q = 0; q < query_count; ++q) {
    for (int64_t i = 0; i < key_count; ++i) {
      const float* key = blocks + i / kKeyBlock * block_stride + i % kKeyBlock;
      float acc = 0.0f;
      for (int64_t d = 0; d < n; ++d) acc = std::fma(queries[q * query_stride + d], key[d * kKeyBlock], acc);
      scores[q * score_stride + i] = acc;
    }
  }
}

void scalar_add_scaled_rows(const float* alphas, const float* rows, int64_t row_stride, int64_t row_count, int64_t n,
                            float* y) {
  for (int64_t r = 0; r < row_count; ++r) {
    for (int64_t i = 0; i < n; ++i) y[i] = std::fma(alphas[r], rows[r * row_stride + i], y[i]);
  }
}

void scalar_fp16_to_fp32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

}  // namespace

VectorKernels scalar_vector_ops() {
  return {scalar_key_scores, scalar_add_scaled_rows,     lanes_softmax_numerators, lanes_quantize_int8,
          lanes_silu_times,  lanes_clamped_swiglu_times, lanes_gelu_times,         scalar_fp16_to_fp32};
}

InterleavedKernels scalar_interleaved(DType type) {
  switch (type) {
    case DType::Q4_0: return {interleaved_dot<DType::Q4_0>, 1};
    case DType::Q4_1: return {interleaved_dot<DType::Q4_1>, 1};
    case DType::Q5_0: return {interleaved_dot<DType::Q5_0>, 1};
    case DType::Q5_1: return {interleaved_dot<DType::Q5_1>, 1};
    case DType::Q8_0: return {interleaved_dot<DType::Q8_0>, 1};
    case DType::Q4_K: return {interleaved_dot<DType::Q4_K>, 1};
    case DType::Q5_K: return {interleaved_dot<DType::Q5_K>, 1};
    case DType::Q6_K: return {interleaved_dot<DType::Q6_K>, 1};
    case DType::Q2_K: return {interleaved_dot<DType::Q2_K>, 1};
    case DType::Q3_K: return {interleaved_dot<DType::Q3_K>, 1};
    case DType::IQ4_NL: return {interleaved_dot<DType::IQ4_NL>, 1};
    case DType::IQ4_XS: return {interleaved_dot<DType::IQ4_XS>, 1};
    case DType::MXFP4: return {interleaved_dot<DType::MXFP4>, 1};
    case DType::F32: return {interleaved_float_dot<DType::F32>, 1};
    case DType::F16: return {interleaved_float_dot<DType::F16>, 1};
    case DType::BF16: return {interleaved_float_dot<DType::BF16>, 1};
    default: return {};
  }
}

}  // namespace strata::tensor::kernels
