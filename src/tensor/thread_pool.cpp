#include "tensor/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

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
    _mm_pause();
  }
  for (;;) {
    const T now = value.load(std::memory_order_acquire);
    if (done(now)) return now;
    value.wait(now, std::memory_order_acquire);
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1) {
    throw std::invalid_argument("ThreadPool needs at least one thread, got " +
                                std::to_string(n_threads));
  }
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back(&ThreadPool::worker_main, this);
}

ThreadPool::~ThreadPool() {
  stopping_ = true;
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run_chunks() {
  int64_t begin = next_item_.load(std::memory_order_relaxed);
  while (begin < job_items_) {
    // Guided: a share of what is left, so chunks shrink towards the end and the threads finish
    // together, while the first ones stay long runs of neighbouring items.
    const int64_t size = std::max<int64_t>(1, (job_items_ - begin) / (kShareDivisor * n_threads_));
    if (!next_item_.compare_exchange_weak(begin, begin + size, std::memory_order_relaxed)) continue;
    try {
      (*job_)(begin, begin + size);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    begin = next_item_.load(std::memory_order_relaxed);
  }
}

void ThreadPool::worker_main() {
  uint32_t seen = 0;
  for (;;) {
    seen = spin_then_wait(generation_, [seen](uint32_t g) { return g != seen; });
    if (stopping_) return;
    run_chunks();
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
  job_items_ = n_items;
  next_item_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_chunks();
  spin_then_wait(pending_, [](int p) { return p == 0; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace strata::tensor
