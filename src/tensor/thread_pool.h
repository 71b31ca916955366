// Persistent worker threads for data-parallel loops called many times per token.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
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

  // Calls fn on contiguous chunks that cover [0, n_items) once, in parallel. Each thread
  // starts on its own equal run of neighbouring items and works through it front to back, so
  // it reads one stream of memory that the hardware prefetcher can follow. A thread that
  // finishes its run takes the back half of what another has left, which then becomes its
  // own run. Which thread runs which chunk varies from call to call, so fn's result must not
  // depend on it. Returns when all are done; rethrows the first exception fn threw.
  // Not reentrant.
  void parallel_for(int64_t n_items, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  // A thread claims this share of what is left of its run at a time, so that a thread that
  // runs out of work early still finds something to take.
  static constexpr int kShareDivisor = 4;

  // The items a thread has yet to claim, [begin, end) in one word so that its owner (taking
  // from the front) and the others (taking from the back) claim with one compare-exchange.
  struct alignas(64) Run {
    std::atomic<uint64_t> bounds{0};
  };

  void worker_main(int thread);
  void run_chunks(int thread);
  bool steal_into(int thread);
  void call(int64_t begin, int64_t end);

  const int n_threads_;
  std::unique_ptr<Run[]> runs_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_offset_ = 0;  // added to the claimed items, for loops longer than a Run holds
  std::atomic<uint32_t> generation_{0};  // bumped to publish a job (or shutdown)
  std::atomic<int> pending_{0};          // workers still running the current job
  bool stopping_ = false;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// pool.parallel_for for items that take little time each (a row's copy, scale or sum): on the
// calling thread alone when there are fewer items than threads, which would wait on each other
// longer than the work takes.
void for_rows(int64_t rows, ThreadPool& pool, const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace strata::tensor
