// What a node measures about itself when it starts, for the placement (see placement.h).
#pragma once

#include <cstdint>

namespace strata::cluster {

// Memory this process may use now for weights and KV cache: what the OS reports as available
// (Linux: MemAvailable, capped by a cgroup v2 memory.max; macOS: free, inactive and purgeable
// pages), or physical memory when that cannot be read.
uint64_t detect_usable_memory();

// Quantized mat-vec throughput with `threads` threads, in weight bytes streamed per second:
// single-token Q4_0 products over 18 MiB of weights, more than most last-level caches hold,
// like a decode step. Takes about 150 ms and 30 MiB while it runs. Throws
// std::invalid_argument for threads < 1.
double measure_weight_speed(int threads);

}  // namespace strata::cluster
