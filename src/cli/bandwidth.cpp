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

// Eight times a 32 MiB L3, so that every pass streams from memory like a decode step does, and
// short enough (5-8 ms) to measure between a few decode tokens.
constexpr size_t kBytes = size_t{256} << 20;
constexpr size_t kWords = kBytes / sizeof(uint64_t);

struct BandwidthProbe::State {
  explicit State(int threads) : buffer(new uint64_t[kWords]), pool(threads) {}
  std::unique_ptr<uint64_t[]> buffer;
  tensor::ThreadPool pool;
};

BandwidthProbe::BandwidthProbe(int threads) : state_(std::make_unique<State>(threads)) {
  uint64_t* buffer = state_->buffer.get();
  state_->pool.parallel_for(static_cast<int64_t>(kWords), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) buffer[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  });
}

BandwidthProbe::~BandwidthProbe() = default;

double BandwidthProbe::median_of(int passes) {
  std::atomic<uint64_t> checksum{0};
  std::vector<double> rates;
  const auto* lines = reinterpret_cast<const __m128i*>(state_->buffer.get());
  for (int pass = 0; pass < passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    state_->pool.parallel_for(static_cast<int64_t>(kWords / 8), [&](int64_t begin, int64_t end) {
      // 64 bytes per iteration into four independent 128-bit sums (SSE2 is baseline x86-64),
      // so the probe is limited by memory, not by the adds; the sums are kept so the reads stay.
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
  std::nth_element(rates.begin(), rates.begin() + passes / 2, rates.end());
  return rates[static_cast<size_t>(passes / 2)];
}

}  // namespace strata::cli
