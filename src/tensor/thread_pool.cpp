#include "tensor/thread_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "tensor/platform.h"

namespace strata::tensor {
namespace {

// Long enough to cover the gap between the matmuls of one layer, short enough not to
// steal much from other processes when the model is idle.
constexpr int kSpinIterations = 4000;

// Returns the value that satisfied done.
template <class T, class Pred>
T spin_then_wait(const std::atomic<T>& value, Pred done) {
  for (int i = 0; i < kSpinIterations; ++i) {
    const T now = value.load(std::memory_order_acquire);
    if (done(now)) return now;
    platform::cpu_relax();
  }
  for (;;) {
    const T now = value.load(std::memory_order_acquire);
    if (done(now)) return now;
    value.wait(now, std::memory_order_acquire);
  }
}

constexpr uint64_t pack(uint32_t begin, uint32_t end) { return uint64_t{end} << 32 | begin; }
constexpr uint32_t begin_of(uint64_t bounds) { return static_cast<uint32_t>(bounds); }
constexpr uint32_t end_of(uint64_t bounds) { return static_cast<uint32_t>(bounds >> 32); }

// The most items one pass of the runs covers; longer loops take several passes.
constexpr int64_t kMaxRunItems = UINT32_MAX;

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1) {
    throw std::invalid_argument("ThreadPool needs at least one thread, got " +
                                std::to_string(n_threads));
  }
  runs_ = std::make_unique<Run[]>(static_cast<size_t>(n_threads));
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back(&ThreadPool::worker_main, this, i);
}

ThreadPool::~ThreadPool() {
  stopping_ = true;
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::call(int64_t begin, int64_t end) {
  try {
    (*job_)(job_offset_ + begin, job_offset_ + end);
  } catch (...) {
    std::lock_guard lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::run_chunks(int thread) {
  std::atomic<uint64_t>& own = runs_[thread].bounds;
  do {
    uint64_t bounds = own.load(std::memory_order_relaxed);
    while (begin_of(bounds) < end_of(bounds)) {
      const uint32_t begin = begin_of(bounds);
      const uint32_t size = std::max<uint32_t>(1, (end_of(bounds) - begin) / kShareDivisor);
      if (!own.compare_exchange_weak(bounds, pack(begin + size, end_of(bounds)), std::memory_order_relaxed)) {
        continue;
      }
      call(begin, begin + size);
      bounds = own.load(std::memory_order_relaxed);
    }
  } while (steal_into(thread));
}

bool ThreadPool::steal_into(int thread) {
  for (int k = 1; k < n_threads_; ++k) {
    std::atomic<uint64_t>& victim = runs_[(thread + k) % n_threads_].bounds;
    uint64_t bounds = victim.load(std::memory_order_relaxed);
    while (begin_of(bounds) < end_of(bounds)) {
      const uint32_t end = end_of(bounds);
      const uint32_t split = end - (end - begin_of(bounds) + 1) / 2;
      if (victim.compare_exchange_weak(bounds, pack(begin_of(bounds), split), std::memory_order_relaxed)) {
        // Only this thread stores into its own run, and only when the run is empty.
        runs_[thread].bounds.store(pack(split, end), std::memory_order_relaxed);
        return true;
      }
    }
  }
  return false;
}

void ThreadPool::worker_main(int thread) {
  uint32_t seen = 0;
  for (;;) {
    seen = spin_then_wait(generation_, [seen](uint32_t g) { return g != seen; });
    if (stopping_) return;
    run_chunks(thread);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n_items,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n_items <= 0) return;
  if (n_threads_ == 1) {
    fn(0, n_items);
    return;
  }
  job_ = &fn;
  error_ = nullptr;
  for (job_offset_ = 0; job_offset_ < n_items; job_offset_ += kMaxRunItems) {
    const int64_t items = std::min(kMaxRunItems, n_items - job_offset_);
    for (int t = 0; t < n_threads_; ++t) {
      runs_[t].bounds.store(pack(static_cast<uint32_t>(items * t / n_threads_),
                                 static_cast<uint32_t>(items * (t + 1) / n_threads_)),
                            std::memory_order_relaxed);
    }
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    run_chunks(0);
    spin_then_wait(pending_, [](int p) { return p == 0; });
  }
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void for_rows(int64_t rows, ThreadPool& pool, const std::function<void(int64_t, int64_t)>& fn) {
  if (rows < pool.size()) {
    fn(0, rows);
  } else {
    pool.parallel_for(rows, fn);
  }
}

}  // namespace strata::tensor
