#include "tensor/vector_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace strata::tensor {
namespace {

std::vector<float> random_values(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(VectorOps, DotMatchesDoubleOnRaggedLengths) {
  for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 64, 100, 128, 1000}) {
    const auto a = random_values(n, 1.0f, 1), b = random_values(n, 1.0f, 2);
    double expected = 0.0, magnitude = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      expected += static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
      magnitude += std::abs(static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)]);
    }
    EXPECT_NEAR(dot(a.data(), b.data(), n), expected, 1e-6 * magnitude + 1e-30) << n;
  }
}

TEST(VectorOps, DotDoesNotDependOnAlignment) {
  const auto a = random_values(80, 1.0f, 3), b = random_values(80, 1.0f, 4);
  std::vector<float> shifted_a(81), shifted_b(81);
  std::copy(a.begin(), a.end(), shifted_a.begin() + 1);
  std::copy(b.begin(), b.end(), shifted_b.begin() + 1);
  EXPECT_EQ(dot(a.data(), b.data(), 80), dot(shifted_a.data() + 1, shifted_b.data() + 1, 80));
}

TEST(VectorOps, ExpIsWithinAFewUlps) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  x.push_back(0.0f);
  std::vector<float> y = x;
  exp_in_place(y.data(), static_cast<int64_t>(y.size()));
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double expected = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] - expected) / expected);
  }
  EXPECT_LT(worst, 3.0e-7) << "about 2.5 float ulps";
  EXPECT_EQ(y.back(), 1.0f);
  std::vector<float> extremes{-1000.0f, 1000.0f, -INFINITY};
  exp_in_place(extremes.data(), 3);
  EXPECT_LT(extremes[0], 1e-37f);
  EXPECT_TRUE(std::isfinite(extremes[1]));
  EXPECT_GE(extremes[2], 0.0f);
}

TEST(VectorOps, SiluTimesAndAddScaled) {
  for (int64_t n : {1, 5, 8, 13, 64}) {
    auto gate = random_values(n, 8.0f, 5);
    const auto up = random_values(n, 2.0f, 6);
    const auto original = gate;
    silu_times(gate.data(), up.data(), n);
    for (size_t i = 0; i < gate.size(); ++i) {
      const double g = original[i];
      EXPECT_NEAR(gate[i], g / (1.0 + std::exp(-g)) * up[i], 1e-5) << i;
    }
    auto y = random_values(n, 1.0f, 7);
    const auto y0 = y;
    const auto x = random_values(n, 1.0f, 8);
    add_scaled(0.5f, x.data(), y.data(), n);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], y0[i] + 0.5f * x[i]);
  }
}

}  // namespace
}  // namespace strata::tensor
