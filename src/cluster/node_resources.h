// What a node measures about itself when it starts, for the placement (see placement.h).
#pragma once

#include <cstdint>
#include <span>

namespace strata::cluster {

// Memory this process may use now for weights and KV cache: what the OS reports as available
// (Linux: MemAvailable, capped by a cgroup v2 memory.max; macOS: free, inactive and purgeable
// pages), or physical memory when that cannot be read.
uint64_t detect_usable_memory();

// Quantized mat-vec throughput with `threads` threads, in weight bytes streamed per second:
// single-token Q4_0 products over twice the last-level cache (64 to 144 MiB of weights), like
// a decode step; the fastest of short passes once another comes within 10% of it. Takes about
// 0.1 s on a quiet machine, up to 1.5 s beside a busy process, and that memory while it runs.
// Throws std::invalid_argument for threads < 1.
double measure_weight_speed(int threads);

// Whether the probe's pass rates so far confirm their fastest: at least 3 passes, and another
// within 10% of it. Another process on the machine (a node loading its layers beside this one)
// slows passes unevenly and seldom two alike, so the probe goes on while it lasts.
bool speed_confirmed(std::span<const double> rates);

}  // namespace strata::cluster
