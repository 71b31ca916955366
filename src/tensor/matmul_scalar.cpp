// Plain C++ kernels: the reference the SIMD kernels are tested against, and the path for
// CPUs without AVX2.
#include <cmath>

#include "tensor/fp16.h"
#include "tensor/interleaved.h"
#include "tensor/matmul_kernels.h"
#include "tensor/quant_blocks.h"

namespace strata::tensor::kernels {
namespace {

template <DType kType, class Activation>
void dot_quantized(const void* weight_row, size_t, int, int64_t cols, const TokenTile& tile,
                   float* out) {
  const auto* bytes = static_cast<const uint8_t*>(weight_row);
  constexpr int kBlock = static_cast<int>(sizeof(Activation::qs));
  const uint32_t block_bytes = info(kType).block_bytes;
  float acc[kMaxTokenTile] = {};
  UnpackedBlock w;
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    unpack_block(kType, bytes + b * block_bytes, w);
    for (int t = 0; t < tile.n_tokens; ++t) {
      const auto& x = static_cast<const Activation*>(tile.rows[t])[b];
      int32_t weighted = 0;
      int32_t mins = 0;
      for (int g = 0; g < kBlock / w.group_size; ++g) {
        int32_t dot = 0;
        for (int i = g * w.group_size; i < (g + 1) * w.group_size; ++i) dot += w.q[i] * x.qs[i];
        weighted += w.scale[g] * dot;
        for (int k = g * w.group_size / 16; k < (g + 1) * w.group_size / 16; ++k) {
          mins += w.min[g] * x.sums[k];
        }
      }
      acc[t] += (w.d * x.d) * static_cast<float>(weighted) +
                (w.dm * x.d) * static_cast<float>(mins);
    }
  }
  for (int t = 0; t < tile.n_tokens; ++t) out[t] = acc[t];
}

template <DType kType>
float weight_at(const void* row, int64_t i) {
  if constexpr (kType == DType::F32) return static_cast<const float*>(row)[i];
  if constexpr (kType == DType::F16) return fp16_to_fp32(static_cast<const uint16_t*>(row)[i]);
  if constexpr (kType == DType::BF16) return bf16_to_fp32(static_cast<const uint16_t*>(row)[i]);
}

template <DType kType>
void dot_float(const void* weight_row, size_t, int, int64_t cols, const TokenTile& tile,
               float* out) {
  for (int t = 0; t < tile.n_tokens; ++t) {
    const auto* x = static_cast<const float*>(tile.rows[t]);
    float acc = 0.0f;
    for (int64_t i = 0; i < cols; ++i) acc += weight_at<kType>(weight_row, i) * x[i];
    out[t] = acc;
  }
}

// Element i of row r in a block of the interleaved layout, as the signed value u - offset.
template <DType kType>
int interleaved_value(const uint8_t* block, int r, int i) {
  if constexpr (kType == DType::Q4_0) {
    const uint8_t packed = block[(i % 16) / 4 * 64 + 4 * r + i % 4];
    return (i < 16 ? packed & 0x0F : packed >> 4) - 8;
  } else {
    static_assert(kType == DType::Q8_0);
    return block[i / 4 * 64 + 4 * r + i % 4] - 128;
  }
}

// Sums (u - offset) * qs directly, without the activation's start: an independent check of
// the start the SIMD kernels rely on.
template <DType kType>
void interleaved_dot(const uint8_t* group, int64_t n_blocks, const InterleavedActivation* const* tokens,
                     int n_tokens, float* out) {
  constexpr interleaved::Format kFormat = interleaved::format_of(kType);
  const auto* scales = reinterpret_cast<const uint16_t*>(group + interleaved::scales_offset(kFormat, n_blocks));
  for (int t = 0; t < n_tokens; ++t) {
    for (int r = 0; r < interleaved::kRows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* block = group + b * kFormat.levels_bytes;
        const InterleavedActivation& x = tokens[t][b];
        int32_t dot = 0;
        for (int i = 0; i < interleaved::kBlock; ++i) dot += interleaved_value<kType>(block, r, i) * x.qs[i];
        acc = std::fma(static_cast<float>(dot), fp16_to_fp32(scales[b * interleaved::kRows + r]) * x.d, acc);
      }
      out[t * interleaved::kRows + r] = acc;
    }
  }
}

}  // namespace

InterleavedKernels scalar_interleaved(DType type) {
  switch (type) {
    case DType::Q4_0: return {interleaved_dot<DType::Q4_0>, 1};
    case DType::Q8_0: return {interleaved_dot<DType::Q8_0>, 1};
    default: return {};
  }
}

// One row and one token at a time: the scalar path gains nothing from tiles.
Kernel scalar_kernel(DType type) {
  const auto make = [](DotKernel dot) { return Kernel{dot, 1, 1}; };
  switch (type) {
    case DType::F32: return make(dot_float<DType::F32>);
    case DType::F16: return make(dot_float<DType::F16>);
    case DType::BF16: return make(dot_float<DType::BF16>);
    case DType::Q4_1: return make(dot_quantized<DType::Q4_1, ActivationBlock32>);
    case DType::Q5_0: return make(dot_quantized<DType::Q5_0, ActivationBlock32>);
    case DType::Q5_1: return make(dot_quantized<DType::Q5_1, ActivationBlock32>);
    case DType::Q4_K: return make(dot_quantized<DType::Q4_K, ActivationBlock256>);
    case DType::Q5_K: return make(dot_quantized<DType::Q5_K, ActivationBlock256>);
    case DType::Q6_K: return make(dot_quantized<DType::Q6_K, ActivationBlock256>);
    default: return {};
  }
}

}  // namespace strata::tensor::kernels
