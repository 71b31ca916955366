#include <emmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "tensor/thread_pool.h"

namespace strata::cli {

ReadBandwidth measure_read_bandwidth(int threads) {
  // Far larger than any cache, so every pass streams from memory like a decode step does.
  constexpr size_t kBytes = size_t{1} << 30;
  constexpr size_t kWords = kBytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[kWords]);
  tensor::ThreadPool pool(threads);
  pool.parallel_for(static_cast<int64_t>(kWords), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) buffer[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  });
  std::atomic<uint64_t> checksum{0};
  std::vector<double> rates;
  for (int pass = 0; pass < 7; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(kWords / 8), [&](int64_t begin, int64_t end) {
      // 64 bytes per iteration into four independent 128-bit sums (SSE2 is baseline x86-64),
      // so the probe is limited by memory, not by the adds; the sums are kept so the reads stay.
      const auto* lines = reinterpret_cast<const __m128i*>(buffer.get());
      __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
      for (int64_t line = begin; line < end; ++line) {
        const __m128i* p = lines + line * 4;
        a = _mm_add_epi64(a, _mm_load_si128(p));
        b = _mm_add_epi64(b, _mm_load_si128(p + 1));
        c = _mm_add_epi64(c, _mm_load_si128(p + 2));
        d = _mm_add_epi64(d, _mm_load_si128(p + 3));
      }
      const __m128i total = _mm_add_epi64(_mm_add_epi64(a, b), _mm_add_epi64(c, d));
      checksum.fetch_add(static_cast<uint64_t>(_mm_cvtsi128_si64(total)), std::memory_order_relaxed);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(kBytes) / seconds);
  }
  volatile uint64_t keep = checksum.load();
  (void)keep;
  std::sort(rates.begin(), rates.end());
  return {rates[rates.size() / 2], rates.back()};
}

}  // namespace strata::cli
