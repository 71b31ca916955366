#include "tensor/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/matmul_kernels.h"

namespace strata::tensor {
namespace {

using kernels::ActivationBlock256;
using kernels::ActivationBlock32;
using kernels::ActivationPair64;
using kernels::Kernel;
using kernels::kMaxTokenTile;

// Rows whose weights stay in L2 while every token tile streams past them.
constexpr int64_t kRowBlock = 16;

Isa probe_isa() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (!avx2) return Isa::Scalar;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return avx512 ? Isa::Avx512 : Isa::Avx2;
}

std::atomic<Isa>& active() {
  static std::atomic<Isa> isa{detected_isa()};
  return isa;
}

Kernel kernel_for(Isa isa, DType type) {
  switch (isa) {
    case Isa::Avx512: return kernels::avx512_kernel(type);
    case Isa::Avx2: return kernels::avx2_kernel(type);
    case Isa::Scalar: break;
  }
  return kernels::scalar_kernel(type);
}

// 0 for weights whose activations stay fp32.
int activation_block(DType type) {
  switch (type) {
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return 256;
    case DType::F32: case DType::F16: case DType::BF16: return 0;
    default: return 32;
  }
}

int round_to_int(float v) { return static_cast<int>(v + (v >= 0.0f ? 0.5f : -0.5f)); }

template <class Block>
void quantize_activations(const float* x, int64_t cols, Block* out) {
  constexpr int kBlock = static_cast<int>(sizeof(Block::qs));
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    const float* v = x + b * kBlock;
    float amax = 0.0f;
    for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    Block& a = out[b];
    a.d = amax / 127.0f;
    for (int k = 0; k < kBlock / 16; ++k) {
      int sum = 0;
      for (int i = 16 * k; i < 16 * k + 16; ++i) {
        a.qs[i] = static_cast<int8_t>(std::clamp(round_to_int(v[i] * inverse), -127, 127));
        sum += a.qs[i];
      }
      a.sums[k] = static_cast<int16_t>(sum);
    }
  }
}

// Repacks a row of n_blocks ActivationBlock32 into ceil(n_blocks / 2) ActivationPair64.
void pair_activations(const ActivationBlock32* blocks, int64_t n_blocks, ActivationPair64* out) {
  for (int64_t p = 0; p < (n_blocks + 1) / 2; ++p) {
    ActivationPair64& pair = out[p];
    pair = {};
    for (int k = 0; k < 2 && 2 * p + k < n_blocks; ++k) {
      const ActivationBlock32& a = blocks[2 * p + k];
      pair.d[k] = a.d;
      pair.neg_sums[k] = -(a.sums[0] + a.sums[1]);
      for (int i = 0; i < 8; ++i) std::memcpy(pair.qs + 4 * (2 * i + k), a.qs + 4 * i, 4);
    }
  }
}

struct PreparedActivations {
  const std::byte* rows;
  size_t row_stride;
  const float* block_scales;  // TokenTile::block_scales of tile 0, if the format has them
  size_t tile_scales_stride;
};

// Quantizes every token row; buffers are reused between calls to spare allocations.
PreparedActivations prepare_activations(const Matrix& w, const Kernel& kernel, const float* x,
                                        int64_t n_tokens, ThreadPool& pool) {
  const int block = activation_block(w.type);
  if (block == 0) {
    return {reinterpret_cast<const std::byte*>(x), static_cast<size_t>(w.cols) * sizeof(float),
            nullptr, 0};
  }
  const int64_t n_blocks = w.cols / block;
  const bool paired = block == 32 && kernel.paired_activations;
  const size_t row_stride =
      paired ? static_cast<size_t>((n_blocks + 1) / 2) * sizeof(ActivationPair64)
             : static_cast<size_t>(n_blocks) * (block == 32 ? sizeof(ActivationBlock32) : sizeof(ActivationBlock256));
  thread_local std::vector<std::byte> buffer;
  buffer.resize(row_stride * static_cast<size_t>(n_tokens));
  std::byte* base = buffer.data();
  const auto quantize_rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      void* row = base + static_cast<size_t>(t) * row_stride;
      const float* source = x + t * w.cols;
      if (paired) {
        thread_local std::vector<ActivationBlock32> blocks;
        blocks.resize(static_cast<size_t>(n_blocks));
        quantize_activations(source, w.cols, blocks.data());
        pair_activations(blocks.data(), n_blocks, static_cast<ActivationPair64*>(row));
      } else if (block == 32) {
        quantize_activations(source, w.cols, static_cast<ActivationBlock32*>(row));
      } else {
        quantize_activations(source, w.cols, static_cast<ActivationBlock256*>(row));
      }
    }
  };
  if (n_tokens < pool.size()) {
    quantize_rows(0, n_tokens);
  } else {
    pool.parallel_for(n_tokens, quantize_rows);
  }
  if (block != 32) return {base, row_stride, nullptr, 0};

  const int64_t tile = kernel.max_tokens;
  const int64_t n_tiles = (n_tokens + tile - 1) / tile;
  const auto tile_stride = static_cast<size_t>(n_blocks * tile);
  thread_local std::vector<float> scales;
  scales.assign(tile_stride * static_cast<size_t>(n_tiles), 0.0f);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const std::byte* row = base + static_cast<size_t>(t) * row_stride;
    float* tile_scales = scales.data() + static_cast<size_t>(t / tile) * tile_stride;
    for (int64_t b = 0; b < n_blocks; ++b) {
      tile_scales[b * tile + t % tile] =
          paired ? reinterpret_cast<const ActivationPair64*>(row)[b / 2].d[b % 2]
                 : reinterpret_cast<const ActivationBlock32*>(row)[b].d;
    }
  }
  return {base, row_stride, scales.data(), tile_stride};
}

}  // namespace

Isa detected_isa() {
  static const Isa isa = probe_isa();
  return isa;
}

Isa active_isa() { return active().load(std::memory_order_relaxed); }

void force_isa(Isa isa) {
  active().store(std::min(isa, detected_isa()), std::memory_order_relaxed);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "unknown";
}

void matmul(const Matrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  const Kernel kernel = kernel_for(active_isa(), w.type);
  if (kernel.dot == nullptr) {
    throw std::invalid_argument("matmul: unsupported weight type " +
                                std::string(dtype_name(w.type)));
  }
  const auto weight_row_bytes = row_bytes(w.type, static_cast<uint64_t>(w.cols));
  if (w.rows < 0 || w.cols < 0 || n_tokens < 0 || !weight_row_bytes) {
    throw std::invalid_argument("matmul: " + std::to_string(w.rows) + "x" +
                                std::to_string(w.cols) + " " + std::string(dtype_name(w.type)) +
                                " matrix is not a whole number of blocks per row");
  }
  if (w.rows == 0 || n_tokens == 0) return;

  const PreparedActivations activations = prepare_activations(w, kernel, x, n_tokens, pool);
  const auto* weights = static_cast<const std::byte*>(w.data);

  pool.parallel_for(w.rows, [&](int64_t row_begin, int64_t row_end) {
    kernels::TokenTile tile{};
    float out[kernels::kMaxRowTile * kMaxTokenTile];
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowBlock) {
      const int64_t r1 = std::min(row_end, r0 + kRowBlock);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kernel.max_tokens) {
        tile.n_tokens = static_cast<int>(std::min<int64_t>(kernel.max_tokens, n_tokens - t0));
        for (int i = 0; i < tile.n_tokens; ++i) {
          tile.rows[i] = activations.rows + static_cast<size_t>(t0 + i) * activations.row_stride;
        }
        if (activations.block_scales != nullptr) {
          tile.block_scales = activations.block_scales +
                              static_cast<size_t>(t0 / kernel.max_tokens) * activations.tile_scales_stride;
        }
        for (int64_t r = r0; r < r1; r += kernel.max_rows) {
          const int n_rows = static_cast<int>(std::min<int64_t>(kernel.max_rows, r1 - r));
          kernel.dot(weights + static_cast<size_t>(r) * *weight_row_bytes, *weight_row_bytes, n_rows,
                     w.cols, tile, out);
          for (int j = 0; j < n_rows; ++j) {
            for (int i = 0; i < tile.n_tokens; ++i) y[(t0 + i) * w.rows + r + j] = out[j * kMaxTokenTile + i];
          }
        }
      }
    }
  });
}

}  // namespace strata::tensor
