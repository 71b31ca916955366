#include "cluster/node_resources.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace strata::cluster {
namespace {

TEST(NodeResources, UsableMemoryIsPlausible) {
  const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  const uint64_t usable = detect_usable_memory();
  EXPECT_GT(usable, uint64_t{64} << 20);
  EXPECT_LE(usable, physical);
}

TEST(NodeResources, WeightSpeedProbeIsPositiveAndShort) {
  const auto start = std::chrono::steady_clock::now();
  const double bytes_per_second = measure_weight_speed(2);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(std::isfinite(bytes_per_second));
  EXPECT_GT(bytes_per_second, 0.0);
  // About 150 ms on an idle machine, at most 50 passes beside a busy one; shared CI machines
  // get a generous margin.
  EXPECT_LT(seconds, 5.0);
}

// Passes slowed by another process on the machine do not confirm a speed; a pass as fast as
// the fastest (within 10%) does, after three.
TEST(NodeResources, TheProbeGoesOnUntilItsFastestPassIsSeenAgain) {
  EXPECT_FALSE(speed_confirmed(std::vector<double>{}));
  EXPECT_FALSE(speed_confirmed(std::vector<double>{30e9, 30e9})) << "fewer than 3 passes";
  EXPECT_TRUE(speed_confirmed(std::vector<double>{30e9, 30e9, 30e9}));
  EXPECT_FALSE(speed_confirmed(std::vector<double>{12e9, 30e9, 11e9, 26e9})) << "26 is under 90% of 30";
  EXPECT_TRUE(speed_confirmed(std::vector<double>{12e9, 30e9, 11e9, 27e9}));
  EXPECT_TRUE(speed_confirmed(std::vector<double>{4e9, 27e9, 30e9})) << "in any order";
}

TEST(NodeResources, WeightSpeedProbeRefusesZeroThreads) {
  EXPECT_THROW(measure_weight_speed(0), std::invalid_argument);
}

}  // namespace
}  // namespace strata::cluster
