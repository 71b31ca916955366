// A seeded random number generator whose output is identical on every platform and compiler,
// so that a request's seed reproduces its tokens anywhere.
#pragma once

#include <cstdint>

namespace strata::sampling {

// xoshiro256** seeded through splitmix64 (any seed, including 0, gives a well-mixed state).
class Random {
 public:
  explicit Random(uint64_t seed);
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits; computed by hand because the standard distributions
  // are not specified bit for bit.
  double next_unit();

 private:
  uint64_t state_[4];
};

}  // namespace strata::sampling
