#include "tensor/quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

#include "tensor/fp16.h"
#include "test_util.h"

namespace strata::tensor {
namespace {

using testing::dequantized;
using testing::quantized;
using testing::random_floats;

// --- Independent decoders, written from the ggml block descriptions as loops over the
// packed bytes (not over elements, as the library does). -----------------------------

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// Q4_0/Q4_1/Q5_0/Q5_1: [d][m?][qh?][qs x16]; byte j holds elements j (low) and j+16.
void decode_32(const uint8_t* block, bool has_min, bool has_high, float* y) {
  const float d = half(block);
  const float m = has_min ? half(block + 2) : 0.0f;
  const uint8_t* p = block + (has_min ? 4 : 2);
  uint32_t qh = 0;
  if (has_high) {
    std::memcpy(&qh, p, 4);
    p += 4;
  }
  const int offset = has_min ? 0 : (has_high ? 16 : 8);
  for (int j = 0; j < 16; ++j) {
    const int x0 = (p[j] & 0xF) | (has_high ? static_cast<int>(((qh >> j) << 4) & 0x10) : 0);
    const int x1 = (p[j] >> 4) | (has_high ? static_cast<int>((qh >> (j + 12)) & 0x10) : 0);
    if (has_min) {
      y[j] = x0 * d + m;
      y[j + 16] = x1 * d + m;
    } else {
      y[j] = (x0 - offset) * d;
      y[j + 16] = (x1 - offset) * d;
    }
  }
}

void decode_q8_0(const uint8_t* block, float* y) {
  const float d = half(block);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<int8_t>(block[2 + j]) * d;
}

void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K: [d][dmin][scales x12][qs x128]; Q5_K puts [qh x32] before qs.
void decode_k4(const uint8_t* block, bool five, float* y) {
  const float d = half(block);
  const float dmin = half(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qh = block + 16;
  const uint8_t* q = block + (five ? 48 : 16);
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) {
      const int hi = five && (qh[l] & u1) ? 16 : 0;
      *y++ = d1 * ((q[l] & 0xF) + hi) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int hi = five && (qh[l] & u2) ? 16 : 0;
      *y++ = d2 * ((q[l] >> 4) + hi) - m2;
    }
    q += 32;
    is += 2;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

// Q6_K: [ql x128][qh x64][scales x16 (int8)][d].
void decode_q6_k(const uint8_t* block, float* y) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(block + 192);
  const float d = half(block + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// Q2_K: [scales x16: scale | min << 4][qs x64][d][dmin]. Each 128 elements read 32 bytes of
// qs four times, two bits further each pass; every 16 elements take the next scale byte.
void decode_q2_k(const uint8_t* block, float* y) {
  const uint8_t* scales = block;
  const uint8_t* q = block + 16;
  const float d = half(block + 80);
  const float dmin = half(block + 82);
  int is = 0;
  for (int n = 0; n < 2; ++n, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half16 = 0; half16 < 2; ++half16) {
        const uint8_t sc = scales[is++];
        const float dl = d * (sc & 0xF);
        const float ml = dmin * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * ((q[16 * half16 + l] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K: [hmask x32][qs x64][scales x12][d]. Levels as Q2_K's, less 4 where the element's
// hmask bit (one bit per 32 elements, in order) is clear. The 12 scale bytes: bytes 0..7 hold
// the low nibbles of scales 0..7 and (high nibbles) 8..15; bytes 8..11 hold their top two
// bits, scale j in byte 8 + j % 4 at bit 2 * (j / 4). Stored as value + 32.
void decode_q3_k(const uint8_t* block, float* y) {
  const uint8_t* hmask = block;
  const uint8_t* q = block + 32;
  const uint8_t* packed = block + 96;
  const float d = half(block + 108);
  int scales[16];
  for (int j = 0; j < 8; ++j) {
    scales[j] = packed[j] & 0xF;
    scales[j + 8] = packed[j] >> 4;
  }
  for (int j = 0; j < 16; ++j) scales[j] = (scales[j] | ((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
  int is = 0;
  uint8_t bit = 1;
  for (int n = 0; n < 2; ++n, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, bit = static_cast<uint8_t>(bit << 1)) {
      for (int half16 = 0; half16 < 2; ++half16) {
        const float dl = d * scales[is++];
        for (int l = 16 * half16; l < 16 * half16 + 16; ++l) {
          *y++ = dl * (((q[l] >> shift) & 3) - ((hmask[l] & bit) ? 0 : 4));
        }
      }
    }
  }
}

// The 4-bit tables as ggml-common.h lists them: IQ4_NL's non-linear levels and MXFP4's
// E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) doubled.
constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr int8_t kE2m1Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 16 bytes of nibbles: byte j holds elements j (low) and j + 16 (high) of 32 at step d.
void decode_table_nibbles(const uint8_t* qs, const int8_t* table, float d, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = d * table[qs[j] & 0xF];
    y[j + 16] = d * table[qs[j] >> 4];
  }
}

// IQ4_XS: [d][scales_h (u16)][scales_l x4][qs x128]; run s of 32 has the 6-bit scale
// (nibble s % 2 of scales_l[s / 2]) | (bits 2s..2s+1 of scales_h) << 4, less 32.
void decode_iq4_xs(const uint8_t* block, float* y) {
  const float d = half(block);
  const int scales_h = block[2] | block[3] << 8;
  for (int s = 0; s < 8; ++s) {
    const int low = s % 2 == 0 ? block[4 + s / 2] & 0xF : block[4 + s / 2] >> 4;
    const int scale = (low | ((scales_h >> (2 * s)) & 3) << 4) - 32;
    decode_table_nibbles(block + 8 + 16 * s, kIq4nl, d * static_cast<float>(scale), y + 32 * s);
  }
}

// MXFP4: [e][qs x16]; the E8M0 scale 2^(e - 127), halved for the doubled table.
void decode_mxfp4(const uint8_t* block, float* y) {
  decode_table_nibbles(block + 1, kE2m1Doubled, std::ldexp(1.0f, block[0] - 128), y);
}

void decode_independently(DType type, const uint8_t* block, float* y) {
  switch (type) {
    case DType::Q4_0: return decode_32(block, false, false, y);
    case DType::Q4_1: return decode_32(block, true, false, y);
    case DType::Q5_0: return decode_32(block, false, true, y);
    case DType::Q5_1: return decode_32(block, true, true, y);
    case DType::Q8_0: return decode_q8_0(block, y);
    case DType::Q4_K: return decode_k4(block, false, y);
    case DType::Q5_K: return decode_k4(block, true, y);
    case DType::Q6_K: return decode_q6_k(block, y);
    case DType::Q2_K: return decode_q2_k(block, y);
    case DType::Q3_K: return decode_q3_k(block, y);
    case DType::IQ4_NL: return decode_table_nibbles(block + 2, kIq4nl, half(block), y);
    case DType::IQ4_XS: return decode_iq4_xs(block, y);
    case DType::MXFP4: return decode_mxfp4(block, y);
    default: FAIL() << "no independent decoder";
  }
}

void put_half(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Byte offsets of a block's fp16 fields, which random bytes must not turn into NaNs.
std::vector<int> half_offsets(DType type) {
  switch (type) {
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: return {0, 2};
    case DType::Q6_K: return {208};
    case DType::Q2_K: return {80, 82};
    case DType::Q3_K: return {108};
    case DType::MXFP4: return {};  // every exponent byte is a number
    default: return {0};
  }
}

class QuantTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(QuantTypeTest, RandomBlocksMatchIndependentDecoder) {
  const DType type = GetParam();
  const DTypeInfo& ti = info(type);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  const int n_blocks = 5;
  std::vector<uint8_t> bytes(n_blocks * ti.block_bytes);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  for (int i = 0; i < n_blocks; ++i) {
    for (int offset : half_offsets(type)) put_half(&bytes[i * ti.block_bytes + offset], scale(rng));
  }
  const std::vector<float> got = dequantized(type, bytes, n_blocks * ti.block_elements);
  std::vector<float> want(got.size());
  for (int i = 0; i < n_blocks; ++i) {
    decode_independently(type, &bytes[i * ti.block_bytes], &want[i * ti.block_elements]);
  }
  // Bits, not values: ggml's -0 products must stay -0.
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << "element " << i << ": " << got[i] << " vs " << want[i];
  }
}

struct RoundTripBound {
  DType type;
  double max_relative_rms;  // error RMS over value RMS
};

class RoundTripTest : public ::testing::TestWithParam<RoundTripBound> {};

TEST_P(RoundTripTest, ErrorWithinBound) {
  const auto [type, bound] = GetParam();
  const size_t n = 4096;
  const std::vector<float> x = random_floats(n, 11, 3.0f);
  const std::vector<float> y = dequantized(type, quantized(type, x), n);
  double err2 = 0, sig2 = 0;
  for (size_t i = 0; i < n; ++i) {
    err2 += (x[i] - y[i]) * double(x[i] - y[i]);
    sig2 += x[i] * double(x[i]);
  }
  EXPECT_LE(std::sqrt(err2 / sig2), bound) << dtype_name(type);
}

INSTANTIATE_TEST_SUITE_P(
    Types, RoundTripTest,
    ::testing::Values(RoundTripBound{DType::F32, 0.0}, RoundTripBound{DType::F16, 3e-4},
                      RoundTripBound{DType::BF16, 3e-3}, RoundTripBound{DType::Q8_0, 0.006},
                      RoundTripBound{DType::Q4_0, 0.12}, RoundTripBound{DType::Q4_1, 0.12},
                      RoundTripBound{DType::Q5_0, 0.06}, RoundTripBound{DType::Q5_1, 0.06},
                      RoundTripBound{DType::Q4_K, 0.12}, RoundTripBound{DType::Q5_K, 0.06},
                      RoundTripBound{DType::Q6_K, 0.03}, RoundTripBound{DType::Q3_K, 0.17},
                      RoundTripBound{DType::Q2_K, 0.36}, RoundTripBound{DType::IQ4_NL, 0.09},
                      RoundTripBound{DType::IQ4_XS, 0.09}, RoundTripBound{DType::MXFP4, 0.13}),
    [](const auto& info) { return std::string(dtype_name(info.param.type)); });

// Within one 32-element block the worst element error is bounded by the quantization
// step: half a step for in-range values, one step where the symmetric formats clamp.
TEST(Quant, SimpleFormatsPerElementBound) {
  const std::vector<float> x = random_floats(1024, 5);
  for (DType type : {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_1, DType::Q5_1}) {
    const std::vector<float> y = dequantized(type, quantized(type, x), x.size());
    const double levels = type == DType::Q4_0 || type == DType::Q4_1 ? 16 : type == DType::Q8_0 ? 255 : 32;
    for (size_t b = 0; b < x.size(); b += 32) {
      double lo = x[b], hi = x[b];
      for (size_t i = b; i < b + 32; ++i) lo = std::min<double>(lo, x[i]), hi = std::max<double>(hi, x[i]);
      const double range = type == DType::Q4_1 || type == DType::Q5_1
                               ? hi - lo : 2 * std::max(std::fabs(lo), std::fabs(hi));
      const double step = range / (levels - 1);
      for (size_t i = b; i < b + 32; ++i) {
        ASSERT_LE(std::fabs(x[i] - y[i]), 1.01 * step) << dtype_name(type) << " element " << i;
      }
    }
  }
}

TEST(Quant, HandBuiltBlocksDecodeToKnownValues) {
  // Q4_0, d = 0.5: byte 0 = 0x21 gives element 0 = (1 - 8) / 2, element 16 = (2 - 8) / 2.
  uint8_t q4_0[18] = {};
  put_half(q4_0, 0.5f);
  q4_0[2] = 0x21;
  q4_0[3] = 0xF8;
  float y[256];
  dequantize_row(DType::Q4_0, q4_0, y, 32);
  EXPECT_EQ(y[0], -3.5f);
  EXPECT_EQ(y[16], -3.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[17], 3.5f);
  EXPECT_EQ(y[2], -4.0f);

  // Q5_0, d = 1: qh bit 16 sets element 16's fifth bit.
  uint8_t q5_0[22] = {};
  put_half(q5_0, 1.0f);
  q5_0[2 + 2] = 0x01;  // bit 16
  q5_0[6] = 0x3F;      // element 0 = 15, element 16 = 3 | 16
  dequantize_row(DType::Q5_0, q5_0, y, 32);
  EXPECT_EQ(y[0], 15.0f - 16.0f);
  EXPECT_EQ(y[16], 19.0f - 16.0f);
  EXPECT_EQ(y[1], -16.0f);

  // Q4_K, d = 1, dmin = 0.5: sub-block 5 gets scale 0x23 and min 0x31 through the split
  // 4+2-bit packing; its elements are nibble 1 of qs[64 .. 95].
  uint8_t q4_k[144] = {};
  put_half(q4_k, 1.0f);
  put_half(q4_k + 2, 0.5f);
  uint8_t* scales = q4_k + 4;
  scales[9] = 0x13;          // low 4 bits: scale 3, min 1
  scales[1] = 2 << 6;        // scale high bits 2
  scales[5] = 3 << 6;        // min high bits 3
  q4_k[16 + 64] = 0x70;      // element 160: nibble 7
  dequantize_row(DType::Q4_K, q4_k, y, 256);
  EXPECT_EQ(y[160], 0x23 * 7.0f - 0.5f * 0x31);
  EXPECT_EQ(y[161], -0.5f * 0x31);
  EXPECT_EQ(y[0], 0.0f);  // scale 0, min 0 (low 6 bits of bytes 0 and 4)

  // Q6_K, d = 0.25: element 200 = 128 + 64 + 8 is the high nibble of ql[64 + 8] with bits
  // 4..5 of qh[32 + 8]; scale group 200 / 16 = 12.
  uint8_t q6_k[210] = {};
  put_half(q6_k + 208, 0.25f);
  q6_k[64 + 8] = 0x50;
  q6_k[128 + 32 + 8] = 0x20;
  q6_k[192 + 12] = static_cast<uint8_t>(-3);
  dequantize_row(DType::Q6_K, q6_k, y, 256);
  EXPECT_EQ(y[200], 0.25f * -3 * ((0x5 | (2 << 4)) - 32));

  // Q2_K, d = 0.5, dmin = 0.25: element 200 = 128 + 64 + 8 is bits 4..5 of qs[32 + 8], in
  // group 12, whose byte holds scale 6 and min 3.
  uint8_t q2_k[84] = {};
  put_half(q2_k + 80, 0.5f);
  put_half(q2_k + 82, 0.25f);
  q2_k[16 + 32 + 8] = 0x30;  // level 3 in bits 4..5
  q2_k[12] = 0x36;
  dequantize_row(DType::Q2_K, q2_k, y, 256);
  EXPECT_EQ(y[200], 0.5f * 6 * 3 - 0.25f * 3);
  EXPECT_EQ(y[201], -0.25f * 3);
  EXPECT_EQ(y[0], 0.0f);

  // Q3_K, d = 0.5: element 200's low bits as Q2_K's, its third bit is bit 4 + 2 of
  // hmask[8]; group 12's scale is 12 - 32 = -20: low nibble 0xC in the high nibble of
  // byte 4, top bits 0 (byte 8, bits 6..7). Element 201 has neither bit set: level 0 - 4.
  uint8_t q3_k[110] = {};
  put_half(q3_k + 108, 0.5f);
  q3_k[32 + 32 + 8] = 0x10;  // low bits 1
  q3_k[8] = 1 << 6;          // third bit: level 1 + 4
  q3_k[96 + 4] = 0xC0;
  dequantize_row(DType::Q3_K, q3_k, y, 256);
  EXPECT_EQ(y[200], 0.5f * -20 * 1);
  EXPECT_EQ(y[201], 0.5f * -20 * -4);
  EXPECT_EQ(y[0], 0.5f * -32 * -4);  // scale byte 0: stored 0, so -32
  // IQ4_NL, d = 0.5: byte 0 = 0xF0 gives element 0 = -127 / 2 and element 16 = 113 / 2.
  uint8_t iq4_nl[18] = {};
  put_half(iq4_nl, 0.5f);
  iq4_nl[2] = 0xF0;
  dequantize_row(DType::IQ4_NL, iq4_nl, y, 32);
  EXPECT_EQ(y[0], -63.5f);
  EXPECT_EQ(y[16], 56.5f);
  EXPECT_EQ(y[1], -63.5f);

  // IQ4_XS, d = 2: run 5 takes nibble 1 of scales_l[2] = 0x9 and bits 10..11 of scales_h = 2,
  // so 0x29 - 32 = 9; its element 160 + 16 + 3 is the high nibble of qs[80 + 3].
  uint8_t iq4_xs[136] = {};
  put_half(iq4_xs, 2.0f);
  iq4_xs[3] = 2 << 2;  // scales_h bits 10..11
  iq4_xs[4 + 2] = 0x90;
  iq4_xs[8 + 80 + 3] = 0xC0;  // nibble 12: 53
  dequantize_row(DType::IQ4_XS, iq4_xs, y, 256);
  EXPECT_EQ(y[179], 2.0f * 9 * 53);
  EXPECT_EQ(y[163], 2.0f * 9 * -127);
  EXPECT_EQ(y[0], 2.0f * -32 * -127);  // scale 0 - 32

  // MXFP4: e = 130 is 2^3, so nibble 7 (6.0 doubled) is 12 * 2^2 = 48 and nibble 0xD is -3 * 2^2;
  // e = 0 is 2^-127, subnormal, which ggml keeps: element 0 = 6 * 2^-127.
  uint8_t mxfp4[17] = {130, 0xD7};
  dequantize_row(DType::MXFP4, mxfp4, y, 32);
  EXPECT_EQ(y[0], 48.0f);
  EXPECT_EQ(y[16], -24.0f);
  EXPECT_EQ(y[1], 0.0f);
  mxfp4[0] = 0;
  dequantize_row(DType::MXFP4, mxfp4, y, 32);
  EXPECT_EQ(y[0], 0x1.8p-125f);
}

// Of the 16 levels of `table`, the index nearest v, the lowest of those equally near: every
// level measured.
int nearest_level(const int8_t* table, float v) {
  int best = 0;
  for (int i = 1; i < 16; ++i) {
    if (std::fabs(v - table[i]) < std::fabs(v - table[best])) best = i;
  }
  return best;
}

// Quantizing to a table takes, per element, the level nearest x / step, of two equally near
// the lower index: on blocks whose elements lie exactly between two levels, and on random ones.
TEST(Quant, TableFormatsTakeTheNearestLevelAndTheLowerIndexOnTies) {
  const auto check = [](DType type, const int8_t* table, const std::vector<float>& x) {
    ASSERT_EQ(x.size(), 32u);
    const std::vector<uint8_t> block = quantized(type, x);
    // IQ4_NL: [d][qs x16]; MXFP4: [e][qs x16], its step 2^(e - 128).
    const float step = type == DType::IQ4_NL ? half(block.data()) : std::ldexp(1.0f, block[0] - 128);
    const uint8_t* qs = block.data() + (type == DType::IQ4_NL ? 2 : 1);
    for (int j = 0; j < 32; ++j) {
      const int index = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
      EXPECT_EQ(index, nearest_level(table, x[static_cast<size_t>(j)] * (1.0f / step)))
          << dtype_name(type) << " element " << j << " = " << x[static_cast<size_t>(j)] << " at step " << step;
    }
  };
  // The extreme -127 makes IQ4_NL's step 1, and 12 MXFP4's; then every midpoint of two levels.
  std::vector<float> iq4 = {-127.0f};
  std::vector<float> mxfp4 = {12.0f};
  for (int i = 0; i + 1 < 16; ++i) iq4.push_back((kIq4nl[i] + kIq4nl[i + 1]) / 2.0f);
  for (const float between : {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f}) {
    mxfp4.push_back(between);
    mxfp4.push_back(-between);
  }
  std::mt19937 random(3);
  std::uniform_real_distribution<float> level(-127.0f, 113.0f);
  while (iq4.size() < 32) iq4.push_back(level(random));
  while (mxfp4.size() < 32) mxfp4.push_back(level(random) / 11.0f);
  check(DType::IQ4_NL, kIq4nl, iq4);
  check(DType::MXFP4, kE2m1Doubled, mxfp4);
  for (int seed = 0; seed < 50; ++seed) {
    check(DType::IQ4_NL, kIq4nl, random_floats(32, static_cast<uint32_t>(seed), 2.0f));
    check(DType::MXFP4, kE2m1Doubled, random_floats(32, static_cast<uint32_t>(100 + seed), 2.0f));
  }
}

TEST(Quant, UnsupportedTypesThrowNamingTheType) {
  float values[256] = {};
  uint8_t bytes[1024] = {};
  for (DType type : {DType::IQ3_S, DType::IQ2_XXS, DType::Q8_1, DType::I32}) {
    const std::string name(dtype_name(type));
    try {
      dequantize_row(type, bytes, values, 256);
      ADD_FAILURE() << name << " did not throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    EXPECT_THROW(quantize_row(type, values, bytes, 256), std::invalid_argument);
  }
}

TEST(Quant, RaggedRowThrows) {
  float values[64] = {};
  uint8_t bytes[64] = {};
  EXPECT_THROW(quantize_row(DType::Q4_0, values, bytes, 33), std::invalid_argument);
  EXPECT_THROW(dequantize_row(DType::Q4_K, bytes, values, 32), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Types, QuantTypeTest,
                         ::testing::Values(DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                                           DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace strata::tensor
