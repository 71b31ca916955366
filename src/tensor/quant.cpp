#include "tensor/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "tensor/fp16.h"
#include "tensor/quant_blocks.h"

namespace strata::tensor {
namespace {

// Q4_K/Q5_K sub-blocks 0..3 keep scale and min in the low 6 bits of bytes 0..3 and 4..7;
// sub-blocks 4..7 keep their low 4 bits in bytes 8..11 and their top 2 bits in the spare
// top bits of bytes 0..7 (ggml's get_scale_min_k4). Done four bytes at a time: each
// word holds the values of four sub-blocks, one per byte, little-endian.
struct KScaleWords {
  uint32_t scales_0_3;
  uint32_t scales_4_7;
  uint32_t mins_0_3;
  uint32_t mins_4_7;
};

KScaleWords unpack_k_scales(const uint8_t* packed) {
  uint32_t word[3];
  std::memcpy(word, packed, sizeof word);
  constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kLow2 = 0x03030303;
  return {word[0] & kLow6, (word[2] & kLow4) | (((word[0] >> 6) & kLow2) << 4), word[1] & kLow6,
          ((word[2] >> 4) & kLow4) | (((word[1] >> 6) & kLow2) << 4)};
}

// Round half away from zero; plain truncation keeps this fast without SSE4.1.
int round_to_int(float v) { return static_cast<int>(v + (v >= 0.0f ? 0.5f : -0.5f)); }

int clamp_int(int v, int lo, int hi) { return std::min(std::max(v, lo), hi); }

float rounded_fp16(float v) { return fp16_to_fp32(fp32_to_fp16(v)); }

[[noreturn]] void throw_unsupported(DType type, const char* what) {
  throw std::invalid_argument(std::string(what) + ": unsupported tensor type " +
                              std::string(dtype_name(type)) + " (id " +
                              std::to_string(static_cast<uint32_t>(type)) + ")");
}

// --- 32-element formats -------------------------------------------------------------

// Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; the optional
// fifth bit of element j is bit j of the little-endian qh word.
void unpack_nibbles32(const uint8_t* qs, const uint8_t* qh, int offset, int8_t* q) {
  uint32_t high = 0;
  if (qh != nullptr) std::memcpy(&high, qh, 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((high >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((high >> (j + 16)) & 1u) << 4);
    q[j] = static_cast<int8_t>(lo - offset);
    q[j + 16] = static_cast<int8_t>(hi - offset);
  }
}

void pack_nibbles32(const uint8_t* levels, uint8_t* qs, uint8_t* qh) {
  uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((levels[j] & 0x0F) | ((levels[j + 16] & 0x0F) << 4));
    high |= static_cast<uint32_t>((levels[j] >> 4) & 1u) << j;
    high |= static_cast<uint32_t>((levels[j + 16] >> 4) & 1u) << (j + 16);
  }
  if (qh != nullptr) std::memcpy(qh, &high, 4);
}

void set_single_group(UnpackedBlock& out, float d, float dm, bool has_min) {
  out.elements = kQK;
  out.group_size = kQK;
  out.d = d;
  out.dm = has_min ? dm : -0.0f;
  out.scale[0] = 1;
  out.min[0] = has_min ? 1 : 0;
}

// Symmetric formats: the element of largest magnitude maps to the most negative level,
// the way ggml does it, so that the asymmetric level range is used fully.
template <int kLevels>
float quantize_symmetric32(const float* x, uint8_t* levels) {
  float extreme = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > std::fabs(extreme)) extreme = x[j];
  }
  const float d = rounded_fp16(extreme / -(kLevels / 2));
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) {
    levels[j] = static_cast<uint8_t>(
        clamp_int(round_to_int(x[j] * inverse) + kLevels / 2, 0, kLevels - 1));
  }
  return d;
}

struct ScaleAndMin {
  float d;
  float m;
};

template <int kLevels>
ScaleAndMin quantize_affine32(const float* x, uint8_t* levels) {
  const auto [lo, hi] = std::minmax_element(x, x + kQK);
  const float m = rounded_fp16(*lo);
  const float d = rounded_fp16((*hi - *lo) / (kLevels - 1));
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) {
    levels[j] = static_cast<uint8_t>(clamp_int(round_to_int((x[j] - m) * inverse), 0, kLevels - 1));
  }
  return {d, m};
}

void quantize_q4_0(const float* x, BlockQ4_0& b) {
  uint8_t levels[kQK];
  b.d = fp32_to_fp16(quantize_symmetric32<16>(x, levels));
  pack_nibbles32(levels, b.qs, nullptr);
}

void quantize_q5_0(const float* x, BlockQ5_0& b) {
  uint8_t levels[kQK];
  b.d = fp32_to_fp16(quantize_symmetric32<32>(x, levels));
  pack_nibbles32(levels, b.qs, b.qh);
}

void quantize_q4_1(const float* x, BlockQ4_1& b) {
  uint8_t levels[kQK];
  const ScaleAndMin s = quantize_affine32<16>(x, levels);
  b.d = fp32_to_fp16(s.d);
  b.m = fp32_to_fp16(s.m);
  pack_nibbles32(levels, b.qs, nullptr);
}

void quantize_q5_1(const float* x, BlockQ5_1& b) {
  uint8_t levels[kQK];
  const ScaleAndMin s = quantize_affine32<32>(x, levels);
  b.d = fp32_to_fp16(s.d);
  b.m = fp32_to_fp16(s.m);
  pack_nibbles32(levels, b.qs, b.qh);
}

void quantize_q8_0(const float* x, BlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = rounded_fp16(amax / 127.0f);
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = fp32_to_fp16(d);
  for (int j = 0; j < kQK; ++j) {
    b.qs[j] = static_cast<int8_t>(clamp_int(round_to_int(x[j] * inverse), -127, 127));
  }
}

// --- Table formats ---------------------------------------------------------------------

// Nibbles laid out as unpack_nibbles32 reads them, each the index of its value.
void unpack_table_nibbles(const uint8_t* qs, const int8_t* table, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = table[qs[j] & 0x0F];
    q[j + 16] = table[qs[j] >> 4];
  }
}

// The index of the table value nearest v, the lowest of those equally near (0 for NaN).
int nearest_index(const int8_t* table, float v) {
  int best = 0;
  for (int i = 1; i < 16; ++i) {
    if (std::fabs(v - table[i]) < std::fabs(v - table[best])) best = i;
  }
  return best;
}

// A table's distinct values in ascending order, each with its lowest index: the nearest value to
// v is then one of the two around it, found without measuring all 16 (quantizing a large
// model spent most of its time doing that). The same index as nearest_index: below 2^23 the
// distances of values a whole number apart never round to one float, so only the two around v
// can be nearest; beyond (and for NaN and infinities, which no block's step makes) it asks
// nearest_index.
class SortedTable {
 public:
  explicit SortedTable(const int8_t* table) : table_(table) {
    for (int i = 0; i < 16; ++i) {
      const float value = table[i];
      const auto at = std::lower_bound(values_, values_ + count_, value);
      if (at != values_ + count_ && *at == value) continue;  // the lower index keeps it
      const auto position = at - values_;
      std::copy_backward(values_ + position, values_ + count_, values_ + count_ + 1);
      std::copy_backward(indices_ + position, indices_ + count_, indices_ + count_ + 1);
      values_[position] = value;
      indices_[position] = static_cast<uint8_t>(i);
      ++count_;
    }
    // The values are whole numbers: those at or below v are those at or below floor(v).
    for (int k = kLowest; k <= kHighest; ++k) {
      at_or_below_[k - kLowest] =
          static_cast<uint8_t>(std::upper_bound(values_, values_ + count_, static_cast<float>(k)) - values_);
    }
  }

  uint8_t nearest(float v) const {
    if (!(std::fabs(v) < 0x1p23f)) return static_cast<uint8_t>(nearest_index(table_, v));
    const int whole = std::clamp(static_cast<int>(std::floor(v)), kLowest, kHighest);
    const int above = at_or_below_[whole - kLowest];
    if (above == 0) return indices_[0];
    if (above == count_) return indices_[count_ - 1];
    const float below_distance = std::fabs(v - values_[above - 1]);
    const float above_distance = std::fabs(v - values_[above]);
    if (below_distance != above_distance) return indices_[below_distance < above_distance ? above - 1 : above];
    return std::min(indices_[above - 1], indices_[above]);
  }

 private:
  static constexpr int kLowest = -129;  // below every int8 value
  static constexpr int kHighest = 127;
  const int8_t* table_;
  uint8_t at_or_below_[kHighest - kLowest + 1] = {};
  float values_[16] = {};
  uint8_t indices_[16] = {};
  int count_ = 0;
};

// 32 elements with step d: their nearest table indices, packed as unpack_table_nibbles reads.
void pack_table_nibbles(const float* x, float d, const SortedTable& table, uint8_t* qs) {
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  uint8_t index[kQK];
  for (int j = 0; j < kQK; ++j) index[j] = table.nearest(x[j] * inverse);
  pack_nibbles32(index, qs, nullptr);
}

const SortedTable& iq4nl_table() {
  static const SortedTable table(kIq4nlValues);
  return table;
}

const SortedTable& mxfp4_table() {
  static const SortedTable table(kMxfp4Values);
  return table;
}

// The step that maps the element of largest magnitude onto IQ4_NL's outermost value, -127,
// as ggml does (the table reaches further below zero than above).
float iq4_step(const float* x) {
  float extreme = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > std::fabs(extreme)) extreme = x[j];
  }
  return extreme / kIq4nlValues[0];
}

void quantize_iq4_nl(const float* x, BlockIQ4_NL& b) {
  const float d = rounded_fp16(iq4_step(x));
  b.d = fp32_to_fp16(d);
  pack_table_nibbles(x, d, iq4nl_table(), b.qs);
}

// Each run's signed 6-bit scale (-31 .. 31 here, of -32 .. 31) in units of the largest run step / 31.
void quantize_iq4_xs(const float* x, BlockIQ4_XS& b) {
  float step[8];
  float largest = 0.0f;
  for (int s = 0; s < 8; ++s) {
    step[s] = iq4_step(x + 32 * s);
    largest = std::max(largest, std::fabs(step[s]));
  }
  const float d = rounded_fp16(largest / 31.0f);
  b.d = fp32_to_fp16(d);
  b.scales_h = 0;
  std::memset(b.scales_l, 0, sizeof b.scales_l);
  for (int s = 0; s < 8; ++s) {
    const int scale = d != 0.0f ? clamp_int(round_to_int(step[s] / d), -32, 31) : 0;
    const int biased = scale + 32;
    b.scales_l[s / 2] |= static_cast<uint8_t>((biased & 0x0F) << (4 * (s % 2)));
    b.scales_h |= static_cast<uint16_t>((biased >> 4) << (2 * s));
    pack_table_nibbles(x + 32 * s, d * static_cast<float>(scale), iq4nl_table(), b.qs + 16 * s);
  }
}

// The smallest exponent whose step takes the largest magnitude within the table's 12.
void quantize_mxfp4(const float* x, BlockMXFP4& b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  int e = amax > 0.0f ? clamp_int(std::ilogb(amax) + 128 - 4, 0, 254) : 0;
  while (e < 254 && 12.0f * e8m0_to_fp32_half(static_cast<uint8_t>(e)) < amax) ++e;
  b.e = static_cast<uint8_t>(e);
  pack_table_nibbles(x, e8m0_to_fp32_half(b.e), mxfp4_table(), b.qs);
}

// --- K-quants -------------------------------------------------------------------------

// Inverse of unpack_k_scales.
void pack_k_scales(const uint8_t* scale, const uint8_t* min, uint8_t* packed) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>((scale[j] & 63) | ((scale[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>((min[j] & 63) | ((min[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((scale[j + 4] & 0x0F) | ((min[j + 4] & 0x0F) << 4));
  }
}

// Element 64p + 32h + l of a Q4_K/Q5_K block is nibble h of qs[32p + l]; its Q5_K fifth
// bit is bit (2p + h) of qh[l].
void unpack_k4(const uint8_t* qs, const uint8_t* qh, int8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const int sub = e / 32;
    const int l = e % 32;
    const uint8_t byte = qs[32 * (sub / 2) + l];
    int level = (sub % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
    if (qh != nullptr) level |= ((qh[l] >> sub) & 1) << 4;
    q[e] = static_cast<int8_t>(level);
  }
}

void pack_k4(const uint8_t* levels, uint8_t* qs, uint8_t* qh) {
  std::memset(qs, 0, kQK_K / 2);
  if (qh != nullptr) std::memset(qh, 0, kQK_K / 8);
  for (int e = 0; e < kQK_K; ++e) {
    const int sub = e / 32;
    const int l = e % 32;
    qs[32 * (sub / 2) + l] |= static_cast<uint8_t>((levels[e] & 0x0F) << (4 * (sub % 2)));
    if (qh != nullptr) qh[l] |= static_cast<uint8_t>(((levels[e] >> 4) & 1) << sub);
  }
}

// Affine K-quants (Q2_K, Q4_K, Q5_K): kGroups groups of 256 / kGroups elements, each with a
// scale and a min of kScaleMax + 1 steps under the super-block's d and dmin.
template <int kGroups>
struct AffineK {
  float d;
  float dmin;
  uint8_t scale[kGroups];
  uint8_t min[kGroups];
  uint8_t levels[kQK_K];
};

template <int kGroups, int kLevels, int kScaleMax>
AffineK<kGroups> quantize_affine_k(const float* x) {
  constexpr int kSize = kQK_K / kGroups;
  float group_scale[kGroups];
  float group_min[kGroups];  // subtracted, >= 0: ggml keeps zero inside every group's range
  for (int j = 0; j < kGroups; ++j) {
    const auto [lo, hi] = std::minmax_element(x + kSize * j, x + kSize * j + kSize);
    const float low = std::min(*lo, 0.0f);
    group_scale[j] = (std::max(*hi, low) - low) / (kLevels - 1);
    group_min[j] = -low;
  }
  AffineK<kGroups> q;
  q.d = rounded_fp16(*std::max_element(group_scale, group_scale + kGroups) / kScaleMax);
  q.dmin = rounded_fp16(*std::max_element(group_min, group_min + kGroups) / kScaleMax);
  for (int j = 0; j < kGroups; ++j) {
    q.scale[j] = static_cast<uint8_t>(q.d != 0.0f ? clamp_int(round_to_int(group_scale[j] / q.d), 0, kScaleMax) : 0);
    q.min[j] = static_cast<uint8_t>(q.dmin != 0.0f ? clamp_int(round_to_int(group_min[j] / q.dmin), 0, kScaleMax) : 0);
    const float step = q.d * q.scale[j];
    const float offset = q.dmin * q.min[j];
    for (int l = 0; l < kSize; ++l) {
      const int level = step != 0.0f ? round_to_int((x[kSize * j + l] + offset) / step) : 0;
      q.levels[kSize * j + l] = static_cast<uint8_t>(clamp_int(level, 0, kLevels - 1));
    }
  }
  return q;
}

template <class Block, int kLevels>
void quantize_k4(const float* x, Block& b, uint8_t* qh) {
  const AffineK<8> q = quantize_affine_k<8, kLevels, 63>(x);
  b.d = fp32_to_fp16(q.d);
  b.dmin = fp32_to_fp16(q.dmin);
  pack_k_scales(q.scale, q.min, b.scales);
  pack_k4(q.levels, b.qs, qh);
}

// Element 128n + 32j + l of a Q2_K or Q3_K block: its low 2 bits are bits 2j..2j+1 of
// qs[32n + l]; Q3_K's third bit is bit 4n + j of hmask[l]. It belongs to scale group e / 16.
struct CrumbPosition {
  int qs;
  int qs_shift;
  int hmask_bit;
};

CrumbPosition crumb_position(int e) {
  const int n = e / 128;
  const int j = e % 128 / 32;
  return {32 * n + e % 32, 2 * j, 4 * n + j};
}

void unpack_q2_k(const BlockQ2_K& b, UnpackedBlock& out) {
  out.elements = kQK_K;
  out.group_size = 16;
  out.d = fp16_to_fp32(b.d);
  out.dm = -fp16_to_fp32(b.dmin);
  for (int e = 0; e < kQK_K; ++e) {
    const CrumbPosition p = crumb_position(e);
    out.q[e] = static_cast<int8_t>((b.qs[p.qs] >> p.qs_shift) & 3);
  }
  for (int g = 0; g < 16; ++g) {
    out.scale[g] = static_cast<int8_t>(b.scales[g] & 0x0F);
    out.min[g] = static_cast<uint8_t>(b.scales[g] >> 4);
  }
}

void quantize_q2_k(const float* x, BlockQ2_K& b) {
  const AffineK<16> q = quantize_affine_k<16, 4, 15>(x);
  std::memset(b.qs, 0, sizeof b.qs);
  for (int e = 0; e < kQK_K; ++e) {
    const CrumbPosition p = crumb_position(e);
    b.qs[p.qs] |= static_cast<uint8_t>(q.levels[e] << p.qs_shift);
  }
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>(q.scale[g] | q.min[g] << 4);
  b.d = fp32_to_fp16(q.d);
  b.dmin = fp32_to_fp16(q.dmin);
}

// Q3_K scale g (6 bits, stored + 32): its low 4 bits are nibble g / 8 of scales[g % 8], its
// high 2 bits are bits 2(g / 4)..2(g / 4)+1 of scales[8 + g % 4].
int q3_k_scale(const uint8_t* scales, int g) {
  const int low = (scales[g % 8] >> (4 * (g / 8))) & 0x0F;
  const int high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
  return (low | high << 4) - 32;
}

void unpack_q3_k(const BlockQ3_K& b, UnpackedBlock& out) {
  out.elements = kQK_K;
  out.group_size = 16;
  out.d = fp16_to_fp32(b.d);
  out.dm = -0.0f;
  for (int e = 0; e < kQK_K; ++e) {
    const CrumbPosition p = crumb_position(e);
    const int level = ((b.qs[p.qs] >> p.qs_shift) & 3) | ((b.hmask[e % 32] >> p.hmask_bit) & 1) << 2;
    out.q[e] = static_cast<int8_t>(level - 4);
  }
  for (int g = 0; g < 16; ++g) {
    out.scale[g] = static_cast<int8_t>(q3_k_scale(b.scales, g));
    out.min[g] = 0;
  }
}

// Element 128h + 32g + l of a Q6_K block: low 4 bits are nibble (g / 2) of
// ql[64h + 32(g % 2) + l], high 2 bits are bits 2g..2g+1 of qh[32h + l]; it belongs to
// scale group e / 16.
struct Q6Position {
  int ql;
  int ql_shift;
  int qh;
  int qh_shift;
};

Q6Position q6_position(int e) {
  const int h = e / 128;
  const int g = (e % 128) / 32;
  const int l = e % 32;
  return {64 * h + 32 * (g % 2) + l, 4 * (g / 2), 32 * h + l, 2 * g};
}

void unpack_q6_k(const BlockQ6_K& b, UnpackedBlock& out) {
  out.elements = kQK_K;
  out.group_size = 16;
  out.d = fp16_to_fp32(b.d);
  out.dm = -0.0f;
  for (int e = 0; e < kQK_K; ++e) {
    const Q6Position p = q6_position(e);
    const int level = ((b.ql[p.ql] >> p.ql_shift) & 0x0F) | (((b.qh[p.qh] >> p.qh_shift) & 3) << 4);
    out.q[e] = static_cast<int8_t>(level - 32);
  }
  for (int g = 0; g < 16; ++g) {
    out.scale[g] = b.scales[g];
    out.min[g] = 0;
  }
}

// Symmetric K-quants (Q3_K, Q6_K): 16 groups of 16 whose signed scales of kScaleMax + 1
// steps either way share the super-block's d; as in the 32-element formats, each group's
// element of largest magnitude maps to the most negative level. Levels are u = q + kHalf.
struct SymmetricK {
  float d;
  int8_t scale[16];
  uint8_t levels[kQK_K];
};

template <int kHalf, int kScaleMax>
SymmetricK quantize_symmetric_k(const float* x) {
  float group_scale[16];
  float largest = 0.0f;
  for (int g = 0; g < 16; ++g) {
    float extreme = 0.0f;
    for (int l = 0; l < 16; ++l) {
      if (std::fabs(x[16 * g + l]) > std::fabs(extreme)) extreme = x[16 * g + l];
    }
    group_scale[g] = extreme / -static_cast<float>(kHalf);
    largest = std::max(largest, std::fabs(group_scale[g]));
  }
  SymmetricK q;
  q.d = rounded_fp16(largest / static_cast<float>(kScaleMax));
  for (int g = 0; g < 16; ++g) {
    const int scale = q.d != 0.0f ? clamp_int(round_to_int(group_scale[g] / q.d), -kScaleMax - 1, kScaleMax) : 0;
    q.scale[g] = static_cast<int8_t>(scale);
    const float step = q.d * static_cast<float>(scale);
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * g + l;
      q.levels[e] = static_cast<uint8_t>(clamp_int(step != 0.0f ? round_to_int(x[e] / step) : 0, -kHalf, kHalf - 1) + kHalf);
    }
  }
  return q;
}

void quantize_q6_k(const float* x, BlockQ6_K& b) {
  const SymmetricK q = quantize_symmetric_k<32, 127>(x);
  std::memset(b.ql, 0, sizeof b.ql);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int e = 0; e < kQK_K; ++e) {
    const Q6Position p = q6_position(e);
    b.ql[p.ql] |= static_cast<uint8_t>((q.levels[e] & 0x0F) << p.ql_shift);
    b.qh[p.qh] |= static_cast<uint8_t>((q.levels[e] >> 4) << p.qh_shift);
  }
  std::memcpy(b.scales, q.scale, sizeof b.scales);
  b.d = fp32_to_fp16(q.d);
}

void quantize_q3_k(const float* x, BlockQ3_K& b) {
  const SymmetricK q = quantize_symmetric_k<4, 31>(x);
  std::memset(b.qs, 0, sizeof b.qs);
  std::memset(b.hmask, 0, sizeof b.hmask);
  std::memset(b.scales, 0, sizeof b.scales);
  for (int e = 0; e < kQK_K; ++e) {
    const CrumbPosition p = crumb_position(e);
    b.qs[p.qs] |= static_cast<uint8_t>((q.levels[e] & 3) << p.qs_shift);
    b.hmask[e % 32] |= static_cast<uint8_t>((q.levels[e] >> 2) << p.hmask_bit);
  }
  for (int g = 0; g < 16; ++g) {
    const int stored = q.scale[g] + 32;
    b.scales[g % 8] |= static_cast<uint8_t>((stored & 0x0F) << (4 * (g / 8)));
    b.scales[8 + g % 4] |= static_cast<uint8_t>((stored >> 4) << (2 * (g / 4)));
  }
  b.d = fp32_to_fp16(q.d);
}

template <class Block, class Fn>
void for_each_block(void* dst, int64_t n, int block_elements, Fn&& fn) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / block_elements; ++i) fn(blocks[i], i * block_elements);
}

void check_row(DType type, int64_t n, const char* what) {
  if (!info(type).computable) throw_unsupported(type, what);
  if (n < 0 || n % info(type).block_elements != 0) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) +
                                " elements is not a whole number of " +
                                std::string(dtype_name(type)) + " blocks");
  }
}

}  // namespace

void unpack_block(DType type, const void* block, UnpackedBlock& out) {
  switch (type) {
    case DType::Q4_0: {
      const auto& b = *static_cast<const BlockQ4_0*>(block);
      set_single_group(out, fp16_to_fp32(b.d), 0.0f, false);
      unpack_nibbles32(b.qs, nullptr, 8, out.q);
      return;
    }
    case DType::Q4_1: {
      const auto& b = *static_cast<const BlockQ4_1*>(block);
      set_single_group(out, fp16_to_fp32(b.d), fp16_to_fp32(b.m), true);
      unpack_nibbles32(b.qs, nullptr, 0, out.q);
      return;
    }
    case DType::Q5_0: {
      const auto& b = *static_cast<const BlockQ5_0*>(block);
      set_single_group(out, fp16_to_fp32(b.d), 0.0f, false);
      unpack_nibbles32(b.qs, b.qh, 16, out.q);
      return;
    }
    case DType::Q5_1: {
      const auto& b = *static_cast<const BlockQ5_1*>(block);
      set_single_group(out, fp16_to_fp32(b.d), fp16_to_fp32(b.m), true);
      unpack_nibbles32(b.qs, b.qh, 0, out.q);
      return;
    }
    case DType::Q8_0: {
      const auto& b = *static_cast<const BlockQ8_0*>(block);
      set_single_group(out, fp16_to_fp32(b.d), 0.0f, false);
      std::memcpy(out.q, b.qs, kQK);
      return;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      // The two layouts share everything but Q5_K's qh, which sits before qs.
      const auto* q4 = static_cast<const BlockQ4_K*>(block);
      const auto* q5 = static_cast<const BlockQ5_K*>(block);
      const bool five = type == DType::Q5_K;
      out.elements = kQK_K;
      out.group_size = 32;
      out.d = fp16_to_fp32(q4->d);
      out.dm = -fp16_to_fp32(q4->dmin);
      const KScaleWords words = unpack_k_scales(q4->scales);
      uint8_t scale[8];
      std::memcpy(scale, &words.scales_0_3, 4);
      std::memcpy(scale + 4, &words.scales_4_7, 4);
      std::memcpy(out.min, &words.mins_0_3, 4);
      std::memcpy(out.min + 4, &words.mins_4_7, 4);
      for (int j = 0; j < 8; ++j) out.scale[j] = static_cast<int8_t>(scale[j]);
      unpack_k4(five ? q5->qs : q4->qs, five ? q5->qh : nullptr, out.q);
      return;
    }
    case DType::Q6_K:
      unpack_q6_k(*static_cast<const BlockQ6_K*>(block), out);
      return;
    case DType::Q2_K:
      unpack_q2_k(*static_cast<const BlockQ2_K*>(block), out);
      return;
    case DType::Q3_K:
      unpack_q3_k(*static_cast<const BlockQ3_K*>(block), out);
      return;
    case DType::IQ4_NL: {
      const auto& b = *static_cast<const BlockIQ4_NL*>(block);
      set_single_group(out, fp16_to_fp32(b.d), 0.0f, false);
      unpack_table_nibbles(b.qs, kIq4nlValues, out.q);
      return;
    }
    case DType::MXFP4: {
      const auto& b = *static_cast<const BlockMXFP4*>(block);
      set_single_group(out, e8m0_to_fp32_half(b.e), 0.0f, false);
      unpack_table_nibbles(b.qs, kMxfp4Values, out.q);
      return;
    }
    case DType::IQ4_XS: {
      const auto& b = *static_cast<const BlockIQ4_XS*>(block);
      out.elements = kQK_K;
      out.group_size = 32;
      out.d = fp16_to_fp32(b.d);
      out.dm = -0.0f;
      for (int s = 0; s < 8; ++s) {
        const int biased = ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0F) | (((b.scales_h >> (2 * s)) & 3) << 4);
        out.scale[s] = static_cast<int8_t>(biased - 32);
        out.min[s] = 0;
        unpack_table_nibbles(b.qs + 16 * s, kIq4nlValues, out.q + 32 * s);
      }
      return;
    }
    default:
      throw_unsupported(type, "unpack_block");
  }
}

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  check_row(type, n, "dequantize_row");
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16:
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = type == DType::F16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
      }
      return;
    }
    default:
      break;
  }
  const DTypeInfo& ti = info(type);
  const auto* bytes = static_cast<const uint8_t*>(src);
  UnpackedBlock u;
  for (int64_t i = 0; i < n / ti.block_elements; ++i) {
    unpack_block(type, bytes + i * ti.block_bytes, u);
    float* y = dst + i * ti.block_elements;
    for (int e = 0; e < u.elements; ++e) {
      const int g = e / u.group_size;
      y[e] = u.d * static_cast<float>(u.scale[g]) * static_cast<float>(u.q[e]) +
             u.dm * static_cast<float>(u.min[g]);
    }
  }
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  check_row(type, n, "quantize_row");
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16:
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        h[i] = type == DType::F16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
      }
      return;
    }
    case DType::Q4_0:
      return for_each_block<BlockQ4_0>(dst, n, kQK, [&](BlockQ4_0& b, int64_t i) { quantize_q4_0(src + i, b); });
    case DType::Q4_1:
      return for_each_block<BlockQ4_1>(dst, n, kQK, [&](BlockQ4_1& b, int64_t i) { quantize_q4_1(src + i, b); });
    case DType::Q5_0:
      return for_each_block<BlockQ5_0>(dst, n, kQK, [&](BlockQ5_0& b, int64_t i) { quantize_q5_0(src + i, b); });
    case DType::Q5_1:
      return for_each_block<BlockQ5_1>(dst, n, kQK, [&](BlockQ5_1& b, int64_t i) { quantize_q5_1(src + i, b); });
    case DType::Q8_0:
      return for_each_block<BlockQ8_0>(dst, n, kQK, [&](BlockQ8_0& b, int64_t i) { quantize_q8_0(src + i, b); });
    case DType::Q4_K:
      return for_each_block<BlockQ4_K>(dst, n, kQK_K, [&](BlockQ4_K& b, int64_t i) {
        quantize_k4<BlockQ4_K, 16>(src + i, b, nullptr);
      });
    case DType::Q5_K:
      return for_each_block<BlockQ5_K>(dst, n, kQK_K, [&](BlockQ5_K& b, int64_t i) {
        quantize_k4<BlockQ5_K, 32>(src + i, b, b.qh);
      });
    case DType::Q6_K:
      return for_each_block<BlockQ6_K>(dst, n, kQK_K, [&](BlockQ6_K& b, int64_t i) { quantize_q6_k(src + i, b); });
    case DType::Q2_K:
      return for_each_block<BlockQ2_K>(dst, n, kQK_K, [&](BlockQ2_K& b, int64_t i) { quantize_q2_k(src + i, b); });
    case DType::Q3_K:
      return for_each_block<BlockQ3_K>(dst, n, kQK_K, [&](BlockQ3_K& b, int64_t i) { quantize_q3_k(src + i, b); });
    case DType::IQ4_NL:
      return for_each_block<BlockIQ4_NL>(dst, n, kQK, [&](BlockIQ4_NL& b, int64_t i) { quantize_iq4_nl(src + i, b); });
    case DType::IQ4_XS:
      return for_each_block<BlockIQ4_XS>(dst, n, kQK_K, [&](BlockIQ4_XS& b, int64_t i) { quantize_iq4_xs(src + i, b); });
    case DType::MXFP4:
      return for_each_block<BlockMXFP4>(dst, n, kQK, [&](BlockMXFP4& b, int64_t i) { quantize_mxfp4(src + i, b); });
    default:
      throw_unsupported(type, "quantize_row");
  }
}

}  // namespace strata::tensor
