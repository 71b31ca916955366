// Persistent worker threads for data-parallel loops called many times per token.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::tensor {

class ThreadPool {
 public:
  // n_threads counts the calling thread, which works on each loop alongside the workers.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Small chunks at the end let a thread slowed by the serial work before a loop, or by
  // uneven items (causal attention rows), hand its tail to the others.
  static constexpr int kShareDivisor = 2;

  // Calls fn on contiguous chunks that cover [0, n_items) once, in parallel: each thread
  // claims the next chunk when it is done with the last, 1 / (kShareDivisor * size()) of the
  // items left (at least one), so chunks shrink towards the end. Which thread runs which chunk
  // varies from call to call, so fn's result must not depend on it. Returns when all are
  // done; rethrows the first exception fn threw. Not reentrant.
  void parallel_for(int64_t n_items, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void worker_main();
  void run_chunks();

  const int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_items_ = 0;
  std::atomic<int64_t> next_item_{0};
  std::atomic<uint32_t> generation_{0};  // bumped to publish a job (or shutdown)
  std::atomic<int> pending_{0};          // workers still running the current job
  bool stopping_ = false;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace strata::tensor
