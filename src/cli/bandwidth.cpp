#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "tensor/thread_pool.h"

namespace strata::cli {

double measure_read_bandwidth(int threads) {
  // Far larger than any cache, so every pass streams from memory like a decode step does.
  constexpr size_t kBytes = size_t{1} << 30;
  constexpr size_t kWords = kBytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[kWords]);
  tensor::ThreadPool pool(threads);
  pool.parallel_for(static_cast<int64_t>(kWords), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) buffer[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  });
  std::vector<uint64_t> sums(static_cast<size_t>(threads) * 8);
  double best = 0.0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(kWords), [&](int64_t begin, int64_t end) {
      // Four independent sums let the loads overlap; the result is kept so the reads stay.
      uint64_t a = 0, b = 0, c = 0, d = 0;
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        a += buffer[static_cast<size_t>(i)];
        b += buffer[static_cast<size_t>(i + 1)];
        c += buffer[static_cast<size_t>(i + 2)];
        d += buffer[static_cast<size_t>(i + 3)];
      }
      for (; i < end; ++i) a += buffer[static_cast<size_t>(i)];
      sums[static_cast<size_t>(begin * threads / static_cast<int64_t>(kWords)) * 8] += a + b + c + d;
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(kBytes) / seconds);
  }
  volatile uint64_t keep = 0;
  for (uint64_t s : sums) keep = keep + s;
  return best;
}

}  // namespace strata::cli
