#include "tensor/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/fp16.h"
#include "tensor/quant_blocks.h"
#include "test_util.h"

namespace strata::tensor {
namespace {

using testing::kSupportedTypes;
using testing::IsaScope;
using testing::random_floats;

struct TestMatrix {
  DType type;
  int64_t rows;
  int64_t cols;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantized weights
  Matrix view() const { return {type, rows, cols, bytes.data()}; }
};

TestMatrix make_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  TestMatrix m{type, rows, cols, {}, {}};
  const size_t row_size = *row_bytes(type, static_cast<uint64_t>(cols));
  m.bytes.resize(row_size * static_cast<size_t>(rows));
  m.values.resize(static_cast<size_t>(rows * cols));
  const std::vector<float> source = random_floats(m.values.size(), seed, 0.5f);
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, &source[r * cols], &m.bytes[r * row_size], cols);
    dequantize_row(type, &m.bytes[r * row_size], &m.values[r * cols], cols);
  }
  return m;
}

int activation_block(DType type) {
  switch (type) {
    case DType::F32: case DType::F16: case DType::BF16: return 0;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_XS:
      return 256;
    default: return 32;
  }
}

struct Expected {
  double value;
  double tolerance;        // against the exact product
  double float_tolerance;  // between two ISAs, which share the activation quantization
};

// Quantizing an activation to round(x / d), d = amax / 127 over its block, moves it by at
// most d / 2; that error weighted by |w| bounds the difference to the exact product.
Expected expected_dot(const float* w, const float* x, int64_t cols, int block) {
  double exact = 0, magnitude = 0, activation_error = 0;
  for (int64_t k = 0; k < cols; ++k) {
    exact += double(w[k]) * x[k];
    magnitude += std::fabs(double(w[k]) * x[k]);
  }
  if (block != 0) {
    for (int64_t b = 0; b < cols; b += block) {
      double amax = 0;
      for (int64_t k = b; k < b + block; ++k) amax = std::max(amax, std::fabs(double(x[k])));
      for (int64_t k = b; k < b + block; ++k) activation_error += std::fabs(w[k]) * amax / 254.0;
    }
  }
  const double rounding = double(cols) * 1.2e-7 * (magnitude + activation_error) + 1e-30;
  return {exact, activation_error * 1.0001 + rounding, rounding};
}

std::vector<float> run(const Matrix& w, const std::vector<float>& x, int64_t n_tokens,
                       ThreadPool& pool) {
  std::vector<float> y(static_cast<size_t>(w.rows * n_tokens), NAN);
  matmul(PreparedMatrix(w), x.data(), n_tokens, y.data(), pool);
  return y;
}

struct Shape {
  int64_t rows;
  int64_t cols;
};

std::vector<Shape> shapes_for(DType type) {
  std::vector<Shape> shapes{{1, 256}, {7, 512}, {33, 768}};
  if (activation_block(type) == 0) shapes.push_back({5, 83});  // ragged SIMD tail
  return shapes;
}

class MatmulTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  static inline ThreadPool pool1{1}, pool2{2}, pool3{3};
};

TEST_P(MatmulTypeTest, EveryIsaMatchesDoubleReferenceAndScalar) {
  const DType type = GetParam();
  constexpr int64_t kMaxTokens = 40;
  for (const Shape& shape : shapes_for(type)) {
    const TestMatrix m = make_matrix(type, shape.rows, shape.cols, 3);
    std::vector<float> x = random_floats(static_cast<size_t>(kMaxTokens * shape.cols), 4);
    std::fill_n(x.begin() + 2 * shape.cols, shape.cols, 0.0f);  // an all-zero token row
    std::vector<Expected> expected;
    for (int64_t t = 0; t < kMaxTokens; ++t) {
      for (int64_t r = 0; r < shape.rows; ++r) {
        expected.push_back(expected_dot(&m.values[r * shape.cols], &x[t * shape.cols],
                                        shape.cols, activation_block(type)));
      }
    }
    std::vector<float> scalar;
    for (Isa isa : available_isas()) {
      IsaScope scope(isa);
      for (int64_t n_tokens = 1; n_tokens <= kMaxTokens; n_tokens = n_tokens < 17 ? n_tokens + 1 : kMaxTokens) {
        const std::vector<float> y = run(m.view(), x, n_tokens, pool2);
        if (isa == Isa::Scalar && n_tokens == kMaxTokens) scalar = y;
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_NEAR(y[i], expected[i].value, expected[i].tolerance)
              << isa_name(isa) << " " << shape.rows << "x" << shape.cols << " n_tokens "
              << n_tokens << " token " << i / shape.rows << " row " << i % shape.rows;
        }
        if (n_tokens == kMaxTokens && isa != Isa::Scalar) {
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_NEAR(y[i], scalar[i], expected[i].float_tolerance)
                << isa_name(isa) << " vs scalar, " << shape.rows << "x" << shape.cols << " index " << i;
          }
        }
        if (n_tokens == kMaxTokens) break;
      }
    }
  }
}

TEST_P(MatmulTypeTest, ResultsAreBitIdenticalAcrossBatchingAndThreads) {
  const DType type = GetParam();
  // Odd block counts and a ragged float tail exercise the kernels' edge paths.
  const int64_t cols = activation_block(type) == 0 ? 520 : activation_block(type) == 32 ? 480 : 768;
  const int64_t rows = 37;
  const int64_t n_tokens = 9;
  const TestMatrix m = make_matrix(type, rows, cols, 8);
  const std::vector<float> x = random_floats(static_cast<size_t>(n_tokens * cols), 9);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(isa_name(isa));
    const std::vector<float> batch = run(m.view(), x, n_tokens, pool1);
    for (ThreadPool* pool : {&pool2, &pool3}) {
      const std::vector<float> threaded = run(m.view(), x, n_tokens, *pool);
      ASSERT_EQ(0, std::memcmp(batch.data(), threaded.data(), batch.size() * sizeof(float)))
          << pool->size() << " threads";
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
      const std::vector<float> one(x.begin() + t * cols, x.begin() + (t + 1) * cols);
      const std::vector<float> single = run(m.view(), one, 1, pool2);
      ASSERT_EQ(0, std::memcmp(single.data(), &batch[t * rows], rows * sizeof(float)))
          << "token " << t << " alone";
    }
    // Token 4 at another position among different neighbours.
    std::vector<float> other = random_floats(static_cast<size_t>(6 * cols), 10, 4.0f);
    std::copy_n(x.begin() + 4 * cols, cols, other.begin() + cols);
    const std::vector<float> mixed = run(m.view(), other, 6, pool3);
    ASSERT_EQ(0, std::memcmp(&mixed[rows], &batch[4 * rows], rows * sizeof(float)));
  }
}

// Row 0's first Q4_x/Q5_x block at the largest levels, row 1's at the smallest (for Q5_0
// -16); the formats with a min get a negative m in both.
template <class Block>
void set_extreme_levels(uint8_t* row0, uint8_t* row1) {
  auto& highest = *reinterpret_cast<Block*>(row0);
  auto& lowest = *reinterpret_cast<Block*>(row1);
  std::memset(highest.qs, 0xFF, sizeof highest.qs);
  std::memset(lowest.qs, 0, sizeof lowest.qs);
  if constexpr (requires { highest.qh; }) {
    std::memset(highest.qh, 0xFF, sizeof highest.qh);
    std::memset(lowest.qh, 0, sizeof lowest.qh);
  }
  if constexpr (requires { highest.m; }) highest.m = lowest.m = fp32_to_fp16(-0.75f);
}

// Puts the extremes the kernels' integer paths must hold exactly into the first block of
// rows 0 and 1: the largest levels, scales and mins, and for the signed formats the most
// negative level and scale; for the float formats, subnormal, -0 and large weights in row 0.
void set_extreme_blocks(TestMatrix& m) {
  const size_t row_size = *row_bytes(m.type, static_cast<uint64_t>(m.cols));
  uint8_t* row0 = m.bytes.data();
  uint8_t* row1 = row0 + row_size;
  switch (m.type) {
    case DType::F32: {
      const float values[] = {1e-45f, -1e-45f, -0.0f, 6e4f, -3e30f};  // subnormals, -0, large
      std::memcpy(row0, values, sizeof values);
      break;
    }
    case DType::F16: case DType::BF16: {
      const uint16_t bits[] = {0x0001, 0x8001, 0x8000, 0x7BFF, 0xFBFF};  // subnormals, -0, +-65504 (F16)
      std::memcpy(row0, bits, sizeof bits);
      break;
    }
    case DType::Q4_1: set_extreme_levels<BlockQ4_1>(row0, row1); break;
    case DType::Q5_0: set_extreme_levels<BlockQ5_0>(row0, row1); break;
    case DType::Q5_1: set_extreme_levels<BlockQ5_1>(row0, row1); break;
    case DType::Q8_0:
      reinterpret_cast<BlockQ8_0*>(row0)->qs[0] = -128;
      reinterpret_cast<BlockQ8_0*>(row0)->qs[5] = 127;
      break;
    case DType::Q4_K: case DType::Q5_K: {
      // Q5_K is Q4_K's d, dmin, scales with qh before qs: all ones everywhere but d, dmin
      // makes every scale and min 63 and every level 15 or 31.
      std::memset(row0 + 4, 0xFF, info(m.type).block_bytes - 4);
      break;
    }
    case DType::Q6_K: {
      auto* lowest = reinterpret_cast<BlockQ6_K*>(row0);
      std::memset(lowest->ql, 0, sizeof lowest->ql);
      std::memset(lowest->qh, 0, sizeof lowest->qh);
      std::memset(lowest->scales, 0x80, sizeof lowest->scales);  // -128
      auto* highest = reinterpret_cast<BlockQ6_K*>(row1);
      std::memset(highest->ql, 0xFF, sizeof highest->ql);
      std::memset(highest->qh, 0xFF, sizeof highest->qh);
      std::memset(highest->scales, 127, sizeof highest->scales);
      break;
    }
    case DType::Q2_K: {
      // Every level, scale and min at its largest: 3, 15 and 15.
      auto* block = reinterpret_cast<BlockQ2_K*>(row0);
      std::memset(block->scales, 0xFF, sizeof block->scales);
      std::memset(block->qs, 0xFF, sizeof block->qs);
      break;
    }
    case DType::Q3_K: {
      // Row 0: every level -4, every scale -32; row 1: every level 3, every scale 31.
      auto* lowest = reinterpret_cast<BlockQ3_K*>(row0);
      std::memset(lowest->hmask, 0, sizeof lowest->hmask);
      std::memset(lowest->qs, 0, sizeof lowest->qs);
      std::memset(lowest->scales, 0, sizeof lowest->scales);
      auto* highest = reinterpret_cast<BlockQ3_K*>(row1);
      std::memset(highest->hmask, 0xFF, sizeof highest->hmask);
      std::memset(highest->qs, 0xFF, sizeof highest->qs);
      std::memset(highest->scales, 0xFF, sizeof highest->scales);
      break;
    }
    case DType::IQ4_NL:  // index 0 is -127, 15 is 113
      std::memset(reinterpret_cast<BlockIQ4_NL*>(row0)->qs, 0, sizeof BlockIQ4_NL::qs);
      std::memset(reinterpret_cast<BlockIQ4_NL*>(row1)->qs, 0xFF, sizeof BlockIQ4_NL::qs);
      break;
    case DType::IQ4_XS: {  // scales -32 with level -127; 31 with 113
      auto* lowest = reinterpret_cast<BlockIQ4_XS*>(row0);
      lowest->scales_h = 0;
      std::memset(lowest->scales_l, 0, sizeof lowest->scales_l);
      std::memset(lowest->qs, 0, sizeof lowest->qs);
      auto* highest = reinterpret_cast<BlockIQ4_XS*>(row1);
      highest->scales_h = 0xFFFF;
      std::memset(highest->scales_l, 0xFF, sizeof highest->scales_l);
      std::memset(highest->qs, 0xFF, sizeof highest->qs);
      break;
    }
    case DType::MXFP4: {
      // The two subnormal scales, in every block of a row so that they decide its result,
      // and the values 12 and -12.
      auto* smallest = reinterpret_cast<BlockMXFP4*>(row0);
      auto* next = reinterpret_cast<BlockMXFP4*>(row1);
      for (int64_t b = 0; b < m.cols / kQK; ++b) smallest[b].e = 0, next[b].e = 1;
      std::memset(smallest->qs, 0x77, sizeof smallest->qs);
      std::memset(next->qs, 0xFF, sizeof next->qs);
      break;
    }
    default: break;
  }
}

// The interleaved layout promises more than one ISA's determinism: all ISAs agree bit for
// bit, which lets nodes with different CPUs share a model.
TEST(Matmul, EveryTypeGivesTheSameBitsOnEveryIsa) {
  ThreadPool pool(2);
  for (DType type : kSupportedTypes) {
    SCOPED_TRACE(dtype_name(type));
    const int64_t cols = activation_block(type) == 0 ? 483 : activation_block(type) == 32 ? 480 : 768;
    TestMatrix m = make_matrix(type, 37, cols, 11);  // a partial last group of 16 rows
    set_extreme_blocks(m);
    const int64_t n_tokens = 11;
    std::vector<float> x = random_floats(static_cast<size_t>(n_tokens * m.cols), 12, 3.0f);
    // Activations quantized to +127 and -127 throughout the first block of tokens 0 and 1.
    std::fill_n(x.begin(), activation_block(type), 3.0f);
    std::fill_n(x.begin() + cols, activation_block(type), -3.0f);
    std::vector<float> scalar;
    for (Isa isa : available_isas()) {
      IsaScope scope(isa);
      const std::vector<float> y = run(m.view(), x, n_tokens, pool);
      if (isa == Isa::Scalar) {
        scalar = y;
      } else {
        ASSERT_EQ(0, std::memcmp(y.data(), scalar.data(), y.size() * sizeof(float))) << isa_name(isa);
      }
    }
  }
}

// Products that share their input give what each gives alone, whether or not their
// formats let them share the quantized input (Q4_K and Q6_K do not: different offsets).
TEST(Matmul, ProductsSharingAnInputEqualSeparateProducts) {
  ThreadPool pool(2);
  const int64_t cols = 512, n_tokens = 5;
  const std::vector<float> x = random_floats(static_cast<size_t>(n_tokens * cols), 21);
  for (const auto& types : std::vector<std::vector<DType>>{{DType::Q4_0, DType::Q4_0, DType::Q4_0},
                                                           {DType::Q4_1, DType::Q5_0, DType::Q8_0},
                                                           {DType::Q5_1, DType::Q4_0, DType::Q5_1},
                                                           {DType::Q4_K, DType::Q5_K, DType::Q6_K},
                                                           {DType::Q2_K, DType::Q4_K, DType::Q2_K},
                                                           {DType::Q3_K, DType::Q3_K, DType::Q2_K},
                                                           {DType::Q8_0, DType::F16, DType::Q8_0},
                                                           {DType::IQ4_NL, DType::Q8_0, DType::MXFP4},
                                                           {DType::IQ4_XS, DType::Q4_K, DType::IQ4_XS},
                                                           {DType::Q2_K, DType::IQ4_XS, DType::Q3_K}}) {
    std::vector<TestMatrix> matrices;
    std::vector<PreparedMatrix> prepared;
    for (size_t i = 0; i < types.size(); ++i) {
      matrices.push_back(make_matrix(types[i], 16 * static_cast<int64_t>(i) + 7, cols, 22 + static_cast<uint32_t>(i)));
    }
    for (const TestMatrix& m : matrices) prepared.emplace_back(m.view());
    std::vector<std::vector<float>> joint(3);
    for (size_t i = 0; i < 3; ++i) joint[i].assign(static_cast<size_t>(matrices[i].rows * n_tokens), NAN);
    matmul({{prepared[0], joint[0].data()}, {prepared[1], joint[1].data()}, {prepared[2], joint[2].data()}},
           x.data(), n_tokens, pool);
    for (size_t i = 0; i < 3; ++i) {
      const std::vector<float> alone = run(matrices[i].view(), x, n_tokens, pool);
      ASSERT_EQ(0, std::memcmp(alone.data(), joint[i].data(), alone.size() * sizeof(float)))
          << dtype_name(types[i]) << " product " << i;
    }
  }
}

// Jobs over inputs of their own (of different widths and token counts, some sharing one
// input, one with no tokens) give what each gives alone, in one loop or several.
TEST(Matmul, JobsOverTheirOwnInputsEqualSeparateProducts) {
  ThreadPool pool(2);
  for (const auto& types : std::vector<std::vector<DType>>{{DType::Q4_0, DType::Q4_0, DType::Q8_0, DType::Q8_0, DType::Q4_0},
                                                           {DType::Q4_K, DType::Q4_K, DType::Q6_K, DType::Q6_K, DType::Q5_K},
                                                           {DType::F32, DType::F16, DType::Q4_0, DType::Q4_0, DType::F32}}) {
    // Jobs 2 and 3: as wide and as many tokens, but inputs of their own (two experts).
    const std::vector<int64_t> cols{512, 512, 256, 256, 768}, tokens{3, 3, 1, 1, 9};
    std::vector<std::vector<float>> inputs;
    for (size_t i = 0; i < types.size(); ++i) {
      inputs.push_back(random_floats(static_cast<size_t>(tokens[i] * cols[i]), 40 + static_cast<uint32_t>(i)));
    }
    inputs[1] = inputs[0];  // the second job takes the first's input (the same rows, another copy)
    std::vector<TestMatrix> matrices;
    std::vector<PreparedMatrix> prepared;
    for (size_t i = 0; i < types.size(); ++i) {
      matrices.push_back(make_matrix(types[i], 16 * static_cast<int64_t>(i) + 9, cols[i], 50 + static_cast<uint32_t>(i)));
    }
    for (const TestMatrix& m : matrices) prepared.emplace_back(m.view());
    std::vector<std::vector<float>> joint(types.size());
    std::vector<MatmulJob> jobs;
    std::vector<float> untouched(16, NAN);
    for (size_t i = 0; i < types.size(); ++i) {
      joint[i].assign(static_cast<size_t>(matrices[i].rows * tokens[i]), NAN);
      if (i == 2) jobs.push_back({{prepared[0], untouched.data()}, inputs[0].data(), 0});
      // Jobs 0 and 1 read one buffer, as a gate and an up product do.
      jobs.push_back({{prepared[i], joint[i].data()}, (i == 1 ? inputs[0] : inputs[i]).data(), tokens[i]});
    }
    matmul(std::span<const MatmulJob>(jobs), pool);
    EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float v) { return std::isnan(v); }));
    for (size_t i = 0; i < types.size(); ++i) {
      const std::vector<float> alone = run(matrices[i].view(), inputs[i], tokens[i], pool);
      ASSERT_EQ(0, std::memcmp(alone.data(), joint[i].data(), alone.size() * sizeof(float)))
          << dtype_name(types[i]) << " job " << i;
    }
  }
}

// Matrices prepared together in one allocation (a MoE layer's experts) multiply as each
// prepared alone, each in its own part of the memory, which lives as long as any of them.
TEST(Matmul, MatricesPreparedTogetherEqualEachPreparedAlone) {
  ThreadPool pool(2);
  const std::vector<DType> types{DType::Q4_0, DType::Q4_K, DType::F16, DType::Q4_K, DType::Q6_K, DType::MXFP4};
  const std::vector<int64_t> rows{9, 40, 16, 0, 33, 17}, cols{64, 512, 48, 256, 256, 96};
  std::vector<TestMatrix> matrices;
  std::vector<Matrix> views;
  for (size_t i = 0; i < types.size(); ++i) {
    matrices.push_back(make_matrix(types[i], rows[i], cols[i], 70 + static_cast<uint32_t>(i)));
    views.push_back(matrices.back().view());
  }
  std::vector<PreparedMatrix> kept;
  {
    const std::vector<PreparedMatrix> together = PreparedMatrix::together(views);
    ASSERT_EQ(together.size(), views.size());
    for (size_t i = 0; i < together.size(); ++i) {
      EXPECT_EQ(together[i].source().data, views[i].data);
      EXPECT_EQ(together[i].interleaved() == nullptr, rows[i] == 0) << i;
      if (i > 0 && rows[i] > 0 && rows[i - 1] > 0) {
        EXPECT_GT(together[i].interleaved(), together[i - 1].interleaved());
      }
    }
    kept = {together[1], together[2], together[5]};  // the others and the vector go
  }
  for (size_t k = 0; k < kept.size(); ++k) {
    const size_t i = std::vector<size_t>{1, 2, 5}[k];
    for (int64_t tokens : {1, 3}) {
      const std::vector<float> x = random_floats(static_cast<size_t>(tokens * cols[i]), 80 + static_cast<uint32_t>(i));
      std::vector<float> y(static_cast<size_t>(rows[i] * tokens), NAN);
      matmul(kept[k], x.data(), tokens, y.data(), pool);
      const std::vector<float> alone = run(views[i], x, tokens, pool);
      ASSERT_EQ(0, std::memcmp(alone.data(), y.data(), alone.size() * sizeof(float))) << dtype_name(types[i]);
    }
  }
  const uint8_t bytes[1024] = {};
  const std::vector<Matrix> unsupported{views[0], {DType::IQ2_XXS, 1, 256, bytes}};
  EXPECT_THROW(PreparedMatrix::together(unsupported), std::invalid_argument);
}

// A column range of each of several matrices, prepared together, multiplies as that range's
// bytes copied into a matrix would, and lives on after its sources are gone.
TEST(Matmul, ColumnsAreMatricesOfTheirOwn) {
  ThreadPool pool(2);
  const std::vector<DType> types{DType::Q4_0, DType::Q4_K, DType::F32, DType::F16, DType::Q8_0, DType::MXFP4};
  // Two ranges of each type's columns: whole blocks, the second after a gap.
  const std::vector<std::vector<PreparedMatrix::ColumnRange>> ranges{
      {{64, 96}, {192, 64}}, {{256, 512}, {768, 256}}, {{3, 13}, {20, 1}},
      {{5, 40}, {45, 7}},    {{32, 64}, {128, 32}},    {{32, 32}, {96, 64}}};
  for (size_t i = 0; i < types.size(); ++i) {
    const int64_t rows = 21, cols = 1024;
    std::vector<PreparedMatrix> parts;
    std::vector<std::vector<uint8_t>> copied;  // of each source, each range's bytes
    {
      const TestMatrix a = make_matrix(types[i], rows, cols, 90 + static_cast<uint32_t>(i));
      const TestMatrix b = make_matrix(types[i], rows, cols, 190 + static_cast<uint32_t>(i));
      const std::vector<Matrix> sources{a.view(), b.view()};
      parts = PreparedMatrix::columns(sources, ranges[i]);
      const size_t row = *row_bytes(types[i], cols);
      for (const TestMatrix* source : {&a, &b}) {
        for (const PreparedMatrix::ColumnRange& range : ranges[i]) {
          const size_t skip = *row_bytes(types[i], range.first), width = *row_bytes(types[i], range.count);
          std::vector<uint8_t>& bytes = copied.emplace_back();
          for (int64_t r = 0; r < rows; ++r) {
            const auto from = source->bytes.begin() + static_cast<std::ptrdiff_t>(r * row + skip);
            bytes.insert(bytes.end(), from, from + static_cast<std::ptrdiff_t>(width));
          }
        }
      }
      const std::vector<PreparedMatrix::ColumnRange> past_the_end{{cols - 32, 64}}, mid_block{{1, 64}};
      EXPECT_THROW(PreparedMatrix::columns(sources, past_the_end), std::invalid_argument);
      if (info(types[i]).block_elements > 1) {
        EXPECT_THROW(PreparedMatrix::columns(sources, mid_block), std::invalid_argument);
      }
    }
    ASSERT_EQ(parts.size(), 4u);
    for (size_t m = 0; m < parts.size(); ++m) {
      const int64_t width = ranges[i][m % 2].count;
      EXPECT_EQ(parts[m].source().cols, width);
      EXPECT_EQ(parts[m].source().rows, rows);
      // Source after source in memory, each source's ranges one after another.
      if (m > 0) {
        EXPECT_EQ(parts[m - 1].interleaved_region().data() + parts[m - 1].interleaved_region().size(),
                  parts[m].interleaved_region().data())
            << dtype_name(types[i]) << " part " << m;
      }
      for (int64_t tokens : {1, 5}) {
        const std::vector<float> x = random_floats(static_cast<size_t>(tokens * width), 95);
        std::vector<float> y(static_cast<size_t>(rows * tokens), NAN);
        matmul(parts[m], x.data(), tokens, y.data(), pool);
        const std::vector<float> expected = run({types[i], rows, width, copied[m].data()}, x, tokens, pool);
        ASSERT_EQ(0, std::memcmp(expected.data(), y.data(), y.size() * sizeof(float)))
            << dtype_name(types[i]) << " part " << m;
      }
    }
  }
}

// A leaf program's outputs are its leaves' products, each as a matrix of the leaf's columns
// alone gives it, added as its steps say; the last leaf may be short.
TEST(Matmul, LeafProgramsAddTheLeavesProductsAsTheirStepsSay) {
  ThreadPool pool(2);
  using Kind = LeafStep::Kind;
  // ((leaf 0 + leaf 1) + (leaf 2 + leaf 3)) into output 0.
  const std::vector<LeafStep> tree{{Kind::Leaf, 0, 0}, {Kind::Leaf, 1, 1}, {Kind::Add, 0, 1},
                                   {Kind::Leaf, 1, 2}, {Kind::Leaf, 2, 3}, {Kind::Add, 1, 2},
                                   {Kind::Add, 0, 1},  {Kind::Store, 0, 0}};
  // leaf 0 into output 0, leaf 1 + leaf 2 into output 1.
  const std::vector<LeafStep> two{{Kind::Leaf, 0, 0}, {Kind::Store, 0, 0}, {Kind::Leaf, 0, 1},
                                  {Kind::Leaf, 5, 2}, {Kind::Add, 0, 5},   {Kind::Store, 0, 1}};
  const std::vector<DType> types{DType::Q4_0, DType::Q4_K, DType::F32, DType::F16, DType::Q8_0};
  const std::vector<int64_t> leaf_cols{128, 512, 7, 16, 64};
  for (size_t i = 0; i < types.size(); ++i) {
    const int64_t rows = 37;
    for (const bool four_leaves : {true, false}) {
      // Four whole leaves, or two and a short third (half a leaf's columns, whole blocks).
      const int64_t cols = four_leaves ? 4 * leaf_cols[i] : 2 * leaf_cols[i] + leaf_cols[i] / 2;
      const TestMatrix m = make_matrix(types[i], rows, cols, 120 + static_cast<uint32_t>(i));
      const PreparedMatrix w(m.view());
      const std::vector<LeafStep>& steps = four_leaves ? tree : two;
      const LeafProgram program{leaf_cols[i], steps, four_leaves ? 1 : 2};
      for (const int64_t tokens : {int64_t{1}, int64_t{9}}) {
        const std::vector<float> x = random_floats(static_cast<size_t>(tokens * cols), 130);
        std::vector<float> y(static_cast<size_t>(tokens * rows * program.outputs), NAN);
        const MatmulJob job{{w, y.data()}, x.data(), tokens, &program};
        matmul(std::span(&job, 1), pool);
        // Each leaf's product from a matrix of its columns over its columns of x.
        std::vector<std::vector<float>> leaf;
        for (int64_t first = 0; first < cols; first += leaf_cols[i]) {
          const int64_t width = std::min(leaf_cols[i], cols - first);
          const Matrix whole = m.view();
          const PreparedMatrix::ColumnRange range{first, width};
          const PreparedMatrix part = PreparedMatrix::columns({&whole, 1}, {&range, 1}).front();
          std::vector<float> part_x;
          for (int64_t t = 0; t < tokens; ++t) {
            part_x.insert(part_x.end(), x.begin() + t * cols + first, x.begin() + t * cols + first + width);
          }
          leaf.emplace_back(static_cast<size_t>(tokens * rows));
          matmul(part, part_x.data(), tokens, leaf.back().data(), pool);
        }
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            const auto at = [&](int l) { return leaf[static_cast<size_t>(l)][static_cast<size_t>(t * rows + r)]; };
            const std::vector<float> expected =
                four_leaves ? std::vector<float>{(at(0) + at(1)) + (at(2) + at(3))} : std::vector<float>{at(0), at(1) + at(2)};
            for (int o = 0; o < program.outputs; ++o) {
              const float got = y[static_cast<size_t>((t * program.outputs + o) * rows + r)];
              ASSERT_EQ(0, std::memcmp(&got, &expected[static_cast<size_t>(o)], sizeof got))
                  << dtype_name(types[i]) << " token " << t << " row " << r << " output " << o;
            }
          }
        }
      }
    }
  }
  // Leaves that do not start at the layout's units, steps past the slots, leaves or outputs,
  // and a slot added to itself.
  const TestMatrix m = make_matrix(DType::Q4_0, 16, 256, 140);
  const PreparedMatrix w(m.view());
  std::vector<float> x(256), y(32);
  const std::vector<LeafStep> doubled{{Kind::Leaf, 0, 0}, {Kind::Add, 0, 0}, {Kind::Store, 0, 0}};
  for (const LeafProgram& bad : {LeafProgram{32, tree, 1}, LeafProgram{0, tree, 1}, LeafProgram{128, tree, 1},
                                 LeafProgram{64, two, 1}, LeafProgram{256, doubled, 1}}) {
    const MatmulJob job{{w, y.data()}, x.data(), 1, &bad};
    EXPECT_THROW(matmul(std::span(&job, 1), pool), std::invalid_argument);
  }
  EXPECT_EQ(leaf_unit(DType::Q4_0), 64);
  EXPECT_EQ(leaf_unit(DType::Q3_K), 512);
  EXPECT_EQ(leaf_unit(DType::F32), 1);
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulTypeTest, ::testing::ValuesIn(kSupportedTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Matmul, UnsupportedTypeThrowsNamingTheType) {
  ThreadPool pool(1);
  const uint8_t bytes[1024] = {};
  const float x[256] = {};
  float y[4];
  for (DType type : {DType::IQ2_XXS, DType::IQ3_S, DType::Q8_K}) {
    try {
      matmul(PreparedMatrix({type, 1, 256, bytes}), x, 1, y, pool);
      ADD_FAILURE() << dtype_name(type) << " did not throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(dtype_name(type))), std::string::npos);
    }
  }
}

TEST(Matmul, RaggedBlockColumnsThrow) {
  const uint8_t bytes[1024] = {};
  EXPECT_THROW(PreparedMatrix({DType::Q4_0, 1, 48, bytes}), std::invalid_argument);
  EXPECT_THROW(PreparedMatrix({DType::Q6_K, 1, 128, bytes}), std::invalid_argument);
}

TEST(Matmul, ForcingAnUnavailableIsaGivesTheDetectedOne) {
  const std::span<const Isa> isas = available_isas();
  ASSERT_EQ(isas.front(), Isa::Scalar);
  EXPECT_EQ(isas.back(), detected_isa());
  const auto has = [&](Isa isa) { return std::find(isas.begin(), isas.end(), isa) != isas.end(); };
#if defined(__aarch64__)
  EXPECT_TRUE(has(Isa::Neon)) << "every aarch64 CPU has NEON";
#endif
#if !defined(__x86_64__)
  EXPECT_FALSE(has(Isa::Avx2) || has(Isa::Avx512)) << "the x86 paths are not compiled for this architecture";
#endif
#if !defined(__aarch64__)
  EXPECT_FALSE(has(Isa::Neon) || has(Isa::NeonDotprod)) << "the NEON paths are not compiled for this architecture";
#endif
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::NeonDotprod}) {
    IsaScope scope(isa);
    EXPECT_EQ(active_isa(), has(isa) ? isa : detected_isa()) << isa_name(isa);
  }
  EXPECT_STREQ(isa_name(Isa::Avx2), "avx2");
  EXPECT_STREQ(isa_name(Isa::NeonDotprod), "neon-dotprod");
}

// Where a run knows which CPU it is on (tests/cross runs qemu's CPU models), the path the
// detection picks must be that CPU's fastest: a probe that failed would fall back silently.
TEST(Matmul, DetectedIsaIsTheOneThisCpuShouldGet) {
  const char* expected = std::getenv("STRATA_EXPECTED_ISA");
  if (expected == nullptr) GTEST_SKIP() << "STRATA_EXPECTED_ISA is not set";
  EXPECT_STREQ(isa_name(detected_isa()), expected);
}

}  // namespace
}  // namespace strata::tensor
