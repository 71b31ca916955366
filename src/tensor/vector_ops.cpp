#include "tensor/vector_ops.h"

#include <cmath>
#include <cstring>

#include "tensor/matmul_kernels.h"

namespace strata::tensor {
namespace {

// GCC vector extensions: element-wise arithmetic that compiles to whatever SIMD the baseline
// target has, with exactly the scalar rounding of each lane (no reassociation, no contraction).
using f32x8 = float __attribute__((vector_size(32)));
using i32x8 = int32_t __attribute__((vector_size(32)));

// These helpers are always inlined, and the clones below use __builtin_bit_cast, not
// std::bit_cast, for the reason given at STRATA_VECTOR_CLONES (seen in a -O0 build).
[[gnu::always_inline]] inline f32x8 load(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline void store(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }

// Lane 0's x shuffled into every lane: one broadcast. (f32x8{} + x costs an addition and
// turns -0 into +0; an initializer list of eight x compiled to seven inserts.)
[[gnu::always_inline]] inline f32x8 splat(float x) { return __builtin_shuffle(f32x8{x}, i32x8{}); }

[[gnu::always_inline]] inline f32x8 exp8(f32x8 x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  x = x > splat(88.0f) ? splat(88.0f) : x;
  // x = k ln2 + r with |r| <= ln2/2; k rounded to nearest by the 1.5 * 2^23 trick.
  const f32x8 shifter = splat(12582912.0f);
  const f32x8 k = (x * splat(1.44269504088896341f) + shifter) - shifter;
  const f32x8 r = (x - k * splat(0.693359375f)) - k * splat(-2.12194440e-4f);
  // Taylor polynomial of degree 7: truncation error below 1e-8 relative for |r| <= 0.35.
  f32x8 p = splat(1.0f / 5040.0f);
  p = p * r + splat(1.0f / 720.0f);
  p = p * r + splat(1.0f / 120.0f);
  p = p * r + splat(1.0f / 24.0f);
  p = p * r + splat(1.0f / 6.0f);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  const i32x8 exponent = (__builtin_convertvector(k, i32x8) + 127) << 23;
  return p * __builtin_bit_cast(f32x8, exponent);
}

}  // namespace

// Each public function is built twice, for AVX2 and for baseline x86-64, and the loader picks
// one for the CPU. The lanes compute the same arithmetic in both (contraction is off), so the
// choice changes the speed, never a bit of the result. Their loops are written out and their
// helpers always inlined: a lambda or a called function would be compiled once, for the
// baseline, and run from both clones. A ragged tail goes through the same lanes, padded.
#define STRATA_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))

namespace {

// Inlined into each clone: a 32-byte vector crosses a call differently with and without AVX.

// A sum kept in 8 lanes ends as ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)) + tail.
[[gnu::always_inline]] inline float sum_lanes(f32x8 s, float tail) {
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + tail;
}

}  // namespace

// Per ISA with FMA chains, which the baseline build could only run through a library fmaf.
void key_scores(const float* queries, int64_t query_stride, int query_count, const float* blocks, int64_t block_stride,
                int64_t n, int64_t key_count, float* scores, int64_t score_stride) {
  kernels::active_attention().key_scores(queries, query_stride, query_count, blocks, block_stride, n, key_count,
                                         scores, score_stride);
}

void add_scaled_rows(const float* alphas, const float* rows, int64_t row_stride, int64_t row_count, int64_t n,
                     float* y) {
  kernels::active_attention().add_scaled_rows(alphas, rows, row_stride, row_count, n, y);
}

STRATA_VECTOR_CLONES float softmax_numerators(float* x, int64_t n, float scale) {
  if (n <= 0) return 0.0f;
  const int64_t full = n / 8 * 8;
  f32x8 lane_max = splat(-INFINITY);
  for (int64_t i = 0; i < full; i += 8) {
    const f32x8 v = load(x + i) * splat(scale);
    store(x + i, v);
    lane_max = v > lane_max ? v : lane_max;
  }
  float max = -INFINITY;
  for (int k = 0; k < 8; ++k) max = lane_max[k] > max ? lane_max[k] : max;
  for (int64_t i = full; i < n; ++i) {
    x[i] *= scale;
    max = x[i] > max ? x[i] : max;
  }
  f32x8 sum{};
  for (int64_t i = 0; i < full; i += 8) {
    const f32x8 e = exp8(load(x + i) - splat(max));
    store(x + i, e);
    sum += e;
  }
  float tail = 0.0f;
  if (full < n) {
    float lanes[8] = {};
    const auto count = static_cast<size_t>(n - full);
    std::memcpy(lanes, x + full, count * sizeof(float));
    const f32x8 e = exp8(load(lanes) - splat(max));
    std::memcpy(x + full, &e, count * sizeof(float));
    for (size_t k = 0; k < count; ++k) tail += e[k];
  }
  return sum_lanes(sum, tail);
}

STRATA_VECTOR_CLONES float quantize_int8(const float* x, int64_t n, int8_t* qs) {
  using i8x8 = int8_t __attribute__((vector_size(8)));
  const int64_t full = n / 8 * 8;
  const i32x8 sign_bit = i32x8{} + static_cast<int32_t>(0x80000000u);
  f32x8 lane_max{};
  for (int64_t i = 0; i < full; i += 8) {
    const f32x8 magnitude = __builtin_bit_cast(f32x8, __builtin_bit_cast(i32x8, load(x + i)) & ~sign_bit);
    lane_max = magnitude > lane_max ? magnitude : lane_max;
  }
  float amax = 0.0f;
  for (int k = 0; k < 8; ++k) amax = lane_max[k] > amax ? lane_max[k] : amax;
  for (int64_t i = full; i < n; ++i) amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
  const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
  const auto clamp = [](i32x8 v) __attribute__((always_inline)) {
    v = v < -127 ? i32x8{} - 127 : v;
    return v > 127 ? i32x8{} + 127 : v;
  };
  for (int64_t i = 0; i < full; i += 8) {
    const f32x8 scaled = load(x + i) * splat(inverse);
    const f32x8 rounded = scaled + (scaled >= splat(0.0f) ? splat(0.5f) : splat(-0.5f));
    const i8x8 q = __builtin_convertvector(clamp(__builtin_convertvector(rounded, i32x8)), i8x8);
    std::memcpy(qs + i, &q, sizeof q);
  }
  for (int64_t i = full; i < n; ++i) {
    const float scaled = x[i] * inverse;
    const int rounded = static_cast<int>(scaled + (scaled >= 0.0f ? 0.5f : -0.5f));
    qs[i] = static_cast<int8_t>(rounded < -127 ? -127 : rounded > 127 ? 127 : rounded);
  }
  return amax / 127.0f;
}

STRATA_VECTOR_CLONES void silu_times(float* gate, const float* up, int64_t n) {
  const auto silu_product = [](f32x8 g, f32x8 u) __attribute__((always_inline)) {
    return g / (splat(1.0f) + exp8(-g)) * u;
  };
  const int64_t full = n / 8 * 8;
  for (int64_t i = 0; i < full; i += 8) store(gate + i, silu_product(load(gate + i), load(up + i)));
  if (full < n) {
    const auto count = static_cast<size_t>(n - full);
    float g[8] = {}, u[8] = {};
    std::memcpy(g, gate + full, count * sizeof(float));
    std::memcpy(u, up + full, count * sizeof(float));
    const f32x8 result = silu_product(load(g), load(u));
    std::memcpy(gate + full, &result, count * sizeof(float));
  }
}

}  // namespace strata::tensor
