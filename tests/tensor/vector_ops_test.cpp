#include "tensor/vector_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tensor/fp16.h"
#include "tensor/matmul.h"
#include "test_util.h"

namespace strata::tensor {
namespace {

using testing::IsaScope;

std::vector<float> random_values(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Keys as rows of n floats, in key_scores' block layout with `stride` floats per block
// (more than a block needs, as when other KV heads share it); unused lanes hold garbage.
std::vector<float> key_blocks(const std::vector<float>& keys, int64_t n, int64_t key_count, int64_t stride) {
  const int64_t blocks = (key_count + kKeyBlock - 1) / kKeyBlock;
  std::vector<float> out = random_values(blocks * stride, 1e30f, 5);
  for (int64_t i = 0; i < key_count; ++i) {
    for (int64_t d = 0; d < n; ++d) {
      out[static_cast<size_t>(i / kKeyBlock * stride + d * kKeyBlock + i % kKeyBlock)] = keys[static_cast<size_t>(i * n + d)];
    }
  }
  return out;
}

// Each score is a chain of fused multiply-adds in dimension order, on every ISA, whatever the
// number of queries sharing the call, the key count, or the garbage in a last block's unused
// lanes.
TEST(VectorOps, KeyScoresAreFmaChainsOnEveryIsaWhateverTheQueryCount) {
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 7, 64, 100}) {
      for (int64_t key_count : {1, 15, 16, 17, 40}) {
        const int queries = 6;
        const int64_t stride = n * kKeyBlock + 32;
        const auto q = random_values(queries * n, 1.0f, 1), keys = random_values(key_count * n, 1.0f, 2);
        const std::vector<float> blocks = key_blocks(keys, n, key_count, stride);
        std::vector<float> scores(static_cast<size_t>(queries * key_count));
        key_scores(q.data(), n, queries, blocks.data(), stride, n, key_count, scores.data(), key_count);
        for (int j = 0; j < queries; ++j) {
          std::vector<float> alone(static_cast<size_t>(key_count));
          key_scores(q.data() + j * n, n, 1, blocks.data(), stride, n, key_count, alone.data(), key_count);
          for (int64_t i = 0; i < key_count; ++i) {
            float expected = 0.0f;
            for (int64_t d = 0; d < n; ++d) {
              expected = std::fma(q[static_cast<size_t>(j * n + d)], keys[static_cast<size_t>(i * n + d)], expected);
            }
            const float batched = scores[static_cast<size_t>(j * key_count + i)];
            EXPECT_EQ(std::memcmp(&batched, &expected, sizeof expected), 0)
                << isa_name(isa) << ", " << n << " dims, key " << i << " query " << j;
            EXPECT_EQ(std::memcmp(&alone[static_cast<size_t>(i)], &expected, sizeof expected), 0)
                << isa_name(isa) << ", " << n << " dims, key " << i;
          }
        }
      }
    }
  }
}

// y[i] takes one FMA per row, in row order, on every ISA and for every length (whole vectors,
// chunks of four and a ragged tail).
TEST(VectorOps, AddScaledRowsIsAnFmaChainOnEveryIsa) {
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 5, 8, 13, 16, 64, 100}) {
      const int64_t row_count = 5, row_stride = n + 3;
      const auto rows = random_values(row_count * row_stride, 1.0f, 8);
      const auto alphas = random_values(row_count, 2.0f, 9);
      auto y = random_values(n, 1.0f, 7);
      std::vector<float> expected = y;
      add_scaled_rows(alphas.data(), rows.data(), row_stride, row_count, n, y.data());
      for (int64_t r = 0; r < row_count; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          expected[static_cast<size_t>(i)] = std::fma(alphas[static_cast<size_t>(r)],
                                                      rows[static_cast<size_t>(r * row_stride + i)],
                                                      expected[static_cast<size_t>(i)]);
        }
      }
      EXPECT_EQ(std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)), 0) << isa_name(isa) << ", n " << n;
    }
  }
}

TEST(VectorOps, Fp16ToFp32WidensEveryHalfExactlyOnEveryIsa) {
  std::vector<uint16_t> halves(65536 + 7);  // every half, and a tail shorter than a vector
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i * 40503u);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    std::vector<float> wide(halves.size());
    fp16_to_fp32(halves.data(), wide.data(), static_cast<int64_t>(halves.size()));
    for (size_t i = 0; i < halves.size(); ++i) {
      const float want = fp16_to_fp32(halves[i]);
      if (std::isnan(want)) {  // F16C quiets signaling NaNs, which fp32_to_fp16 never makes
        ASSERT_TRUE(std::isnan(wide[i])) << isa_name(isa) << ", half " << halves[i];
      } else {
        ASSERT_EQ(std::memcmp(&wide[i], &want, sizeof want), 0) << isa_name(isa) << ", half " << halves[i];
      }
    }
  }
}

// With the largest input at 0 the numerators are exp of the scaled inputs themselves, so
// this checks the exponential on the whole range attention uses, (-87, 0].
TEST(VectorOps, SoftmaxNumeratorsAreExpWithinAFewUlps) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 0.0f; v += 0.0137f) x.push_back(v * 2.0f);  // halved by the scale
  x.push_back(0.0f);
  x.push_back(-3.0f);  // a ragged tail after the zero
  std::vector<float> y = x;
  const float total = softmax_numerators(y.data(), static_cast<int64_t>(y.size()), 0.5f);
  double worst = 0.0, expected_total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double expected = std::exp(0.5 * static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] - expected) / expected);
    expected_total += expected;
  }
  EXPECT_LT(worst, 3.0e-7) << "about 2.5 float ulps";
  EXPECT_EQ(y[y.size() - 2], 1.0f);
  EXPECT_NEAR(total, expected_total, 1e-6 * expected_total);

  std::vector<float> extremes{2.0f, -1000.0f, -INFINITY};
  EXPECT_NEAR(softmax_numerators(extremes.data(), 3, 1.0f), 1.0f, 1e-6f);
  EXPECT_EQ(extremes[0], 1.0f);
  EXPECT_LT(extremes[1], 1e-37f);
  EXPECT_GE(extremes[2], 0.0f);
  EXPECT_EQ(softmax_numerators(extremes.data(), 0, 1.0f), 0.0f);
}

// The plain definition, element by element.
float quantize_reference(const float* x, int64_t n, int8_t* qs) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float scaled = x[i] * inverse;
    qs[i] = static_cast<int8_t>(std::clamp(static_cast<int>(scaled + (scaled >= 0.0f ? 0.5f : -0.5f)), -127, 127));
  }
  return amax / 127.0f;
}

TEST(VectorOps, QuantizeInt8MatchesThePlainDefinitionBitForBit) {
  for (int64_t n : {1, 7, 8, 32, 37, 256}) {
    auto x = random_values(n, 3.0f, 9);
    // Exact halves after scaling (amax 127 makes the scale 1) and a zero.
    x[0] = n > 1 ? 127.0f : x[0];
    if (n > 3) {
      x[1] = 2.5f;
      x[2] = -2.5f;
      x[3] = 0.0f;
    }
    std::vector<int8_t> q(static_cast<size_t>(n)), expected(static_cast<size_t>(n));
    const float d = quantize_int8(x.data(), n, q.data());
    const float expected_d = quantize_reference(x.data(), n, expected.data());
    EXPECT_EQ(std::memcmp(&d, &expected_d, sizeof d), 0) << n;
    EXPECT_EQ(q, expected) << n;
    if (n > 3) {
      EXPECT_EQ(q[1], 3) << "halves round away from zero";
      EXPECT_EQ(q[2], -3);
    }
  }
  std::vector<float> zeros(40, 0.0f);
  std::vector<int8_t> q(40, 1);
  EXPECT_EQ(quantize_int8(zeros.data(), 40, q.data()), 0.0f);
  EXPECT_EQ(q, std::vector<int8_t>(40, 0));
}

TEST(VectorOps, SiluTimes) {
  for (int64_t n : {1, 5, 8, 13, 64}) {
    auto gate = random_values(n, 8.0f, 5);
    const auto up = random_values(n, 2.0f, 6);
    const auto original = gate;
    silu_times(gate.data(), up.data(), n);
    for (size_t i = 0; i < gate.size(); ++i) {
      const double g = original[i];
      EXPECT_NEAR(gate[i], g / (1.0 + std::exp(-g)) * up[i], 1e-5) << i;
    }
  }
}

// A gated unit, gate[i] = op(gate[i], up[i]), on every ISA: within 1e-5 (relative, plus 1e-5)
// of `exact` in double precision, and the same bits on all of them.
template <class Op, class Exact>
void expect_gated_unit_on_every_isa(Op op, Exact exact, float gate_spread, float up_spread, uint32_t seed) {
  for (int64_t n : {1, 5, 8, 13, 64}) {
    const auto gate = random_values(n, gate_spread, seed);
    const auto up = random_values(n, up_spread, seed + 1);
    std::vector<float> first_isa;
    for (Isa isa : available_isas()) {
      force_isa(isa);
      auto out = gate;
      op(out.data(), up.data(), n);
      for (size_t i = 0; i < out.size(); ++i) {
        const double want = exact(gate[i], up[i]);
        EXPECT_NEAR(out[i], want, 1e-5 * (1.0 + std::abs(want))) << isa_name(isa) << " " << i;
      }
      if (first_isa.empty()) first_isa = out;
      EXPECT_EQ(std::memcmp(out.data(), first_isa.data(), out.size() * sizeof(float)), 0) << isa_name(isa);
    }
    force_isa(detected_isa());
  }
}

// Large gates of both signs, where the exponential saturates.
TEST(VectorOps, GeluTimesOnEveryIsa) {
  expect_gated_unit_on_every_isa(gelu_times, [](double g, double u) {
    return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g))) * u;
  }, 12.0f, 2.0f, 9);
}

// Values beyond the limit on both sides, so that every clamp is taken.
TEST(VectorOps, ClampedSwigluTimesOnEveryIsa) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  expect_gated_unit_on_every_isa(
      [](float* gate, const float* up, int64_t n) { clamped_swiglu_times(gate, up, n, kAlpha, kLimit); },
      [](double gate, double up) {
        const double g = std::min<double>(gate, kLimit);
        return g / (1.0 + std::exp(-kAlpha * g)) * (std::clamp<double>(up, -kLimit, kLimit) + 1.0);
      },
      12.0f, 12.0f, 7);
}

}  // namespace
}  // namespace strata::tensor
