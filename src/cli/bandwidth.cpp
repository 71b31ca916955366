#include <emmintrin.h>
#include <xmmintrin.h>

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

namespace {

// One pass over `lines` (64 bytes each) on `pool`, in bytes per second. With `kPrefetch` each
// line also asks for the one kAhead bytes further on: some machines' hardware prefetchers
// leave a plain stream well short of what memory gives (an Intel Xeon VM: about 17 GB/s plain,
// 21-24 prefetching), so a plain pass alone would set the roofline too low.
template <bool kPrefetch>
double pass_rate(tensor::ThreadPool& pool, const __m128i* lines, std::atomic<uint64_t>& checksum) {
  constexpr int64_t kAhead = 8192;
  const auto start = std::chrono::steady_clock::now();
  pool.parallel_for(static_cast<int64_t>(kWords / 8), [&](int64_t begin, int64_t end) {
    // 64 bytes per iteration into four independent 128-bit sums (SSE2 is baseline x86-64),
    // so the probe is limited by memory, not by the adds; the sums are kept so the reads stay.
    __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
    for (int64_t line = begin; line < end; ++line) {
      const __m128i* p = lines + line * 4;
      if constexpr (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(p) + kAhead, _MM_HINT_T0);
      a = _mm_add_epi64(a, _mm_load_si128(p));
      b = _mm_add_epi64(b, _mm_load_si128(p + 1));
      c = _mm_add_epi64(c, _mm_load_si128(p + 2));
      d = _mm_add_epi64(d, _mm_load_si128(p + 3));
    }
    const __m128i total = _mm_add_epi64(_mm_add_epi64(a, b), _mm_add_epi64(c, d));
    checksum.fetch_add(static_cast<uint64_t>(_mm_cvtsi128_si64(total)), std::memory_order_relaxed);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(kBytes) / seconds;
}

double median(std::vector<double> rates) {
  std::nth_element(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

double BandwidthProbe::median_of(int passes) {
  std::atomic<uint64_t> checksum{0};
  std::vector<double> plain, prefetching;
  const auto* lines = reinterpret_cast<const __m128i*>(state_->buffer.get());
  for (int pass = 0; pass < passes; ++pass) {
    plain.push_back(pass_rate<false>(state_->pool, lines, checksum));
    prefetching.push_back(pass_rate<true>(state_->pool, lines, checksum));
  }
  volatile uint64_t keep = checksum.load();
  (void)keep;
  return std::max(median(std::move(plain)), median(std::move(prefetching)));
}

}  // namespace strata::cli
