// Bit-for-bit comparison of float rows, for the tests that promise the same bits.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <span>

namespace strata::model::testing {

// Whether two float rows hold the same bits (EXPECT_EQ would take -0 for +0).
inline ::testing::AssertionResult same_bits(std::span<const float> actual, std::span<const float> expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << actual.size() << " floats, not " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "float " << i << " of " << actual.size() << " is " << actual[i]
                                           << ", not " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::model::testing
