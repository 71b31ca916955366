#include "tensor/fp16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace strata::tensor {
namespace {

TEST(Fp16, KnownValuesConvertBothWays) {
  struct Case { float value; uint16_t bits; };
  const Case cases[] = {
      {0.0f, 0x0000},     {-0.0f, 0x8000},         {1.0f, 0x3C00},   {-2.0f, 0xC000},
      {0.5f, 0x3800},     {65504.0f, 0x7BFF},      {0x1p-14f, 0x0400}, {0x1p-24f, 0x0001},
      {0x1.ff8p-15f, 0x03FF /* largest subnormal */}, {0.333251953125f, 0x3555},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(fp32_to_fp16(c.value), c.bits) << c.value;
    EXPECT_EQ(std::bit_cast<uint32_t>(fp16_to_fp32(c.bits)), std::bit_cast<uint32_t>(c.value)) << c.bits;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(0.1f), 0x2E66);
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);      // tie, even below
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, even above
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);              // subnormal tie to zero
  EXPECT_EQ(fp32_to_fp16(3 * 0x1p-25f), 0x0002);          // subnormal tie up to even
  EXPECT_EQ(fp32_to_fp16(0x1.ffcp-15f), 0x0400);          // rounds up into the normals
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);              // tie goes to infinity
}

TEST(Fp16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp32_to_fp16(inf), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-inf), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(fp16_to_fp32(0x7C00), inf);
  const uint16_t nan = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E01)));
}

// Every finite half survives the round trip, and the float half-way between two
// neighbours rounds to the one with an even mantissa, its neighbours to the nearer one.
TEST(Fp16, ExhaustiveRoundTripAndMidpoints) {
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const auto bits = static_cast<uint16_t>(h | sign);
      ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(bits)), bits);
    }
    if (h + 1 == 0x7C00) continue;
    const float lo = fp16_to_fp32(static_cast<uint16_t>(h));
    const float hi = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;
    ASSERT_EQ(fp32_to_fp16(mid), (h % 2 == 0) ? h : h + 1) << h;
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, hi)), h + 1) << h;
  }
}

TEST(Bf16, KnownValuesAndRounding) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);  // max float -> inf
  EXPECT_EQ(bf16_to_fp32(0x4049), 3.140625f);
  const uint16_t nan = fp32_to_bf16(std::bit_cast<float>(0x7F800001u));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(nan)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), h);
    }
  }
}

}  // namespace
}  // namespace strata::tensor
