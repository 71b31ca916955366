// A seeded random number generator whose output is identical on every platform and compiler,
// so that a request's seed reproduces its tokens anywhere.
#pragma once

#include <array>
#include <cstdint>

namespace strata::sampling {

// xoshiro256** seeded through splitmix64 (any seed, including 0, gives a well-mixed state).
class Random {
 public:
  // Its whole state: a generator made from it goes on where this one is.
  using State = std::array<uint64_t, 4>;

  explicit Random(uint64_t seed);
  explicit Random(const State& state) : state_(state) {}
  const State& state() const { return state_; }
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits; computed by hand because the standard distributions
  // are not specified bit for bit.
  double next_unit();

 private:
  State state_;
};

}  // namespace strata::sampling
