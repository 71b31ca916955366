#include "tensor/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace strata::tensor {
namespace {

TEST(ThreadPool, RejectsZeroThreads) { EXPECT_THROW(ThreadPool(0), std::invalid_argument); }

TEST(ThreadPool, SingleThreadRunsInlineOnce) {
  ThreadPool pool(1);
  std::vector<std::pair<int64_t, int64_t>> calls;
  const auto caller = std::this_thread::get_id();
  pool.parallel_for(10, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    calls.emplace_back(begin, end);
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(int64_t{0}, int64_t{10}));
}

TEST(ThreadPool, ContiguousChunksCoverEveryItemOnce) {
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 100}) {
      std::mutex mutex;
      std::vector<std::pair<int64_t, int64_t>> ranges;
      pool.parallel_for(n, [&](int64_t begin, int64_t end) {
        std::lock_guard lock(mutex);
        ranges.emplace_back(begin, end);
      });
      const int64_t chunks = std::min<int64_t>(n, threads * ThreadPool::kChunksPerThread);
      std::vector<std::pair<int64_t, int64_t>> expected;
      for (int64_t i = 0; i < chunks; ++i) expected.emplace_back(n * i / chunks, n * (i + 1) / chunks);
      std::sort(ranges.begin(), ranges.end());
      EXPECT_EQ(ranges, expected) << threads << " threads, " << n << " items";
    }
  }
}

// The point of chunks: a thread held up in one chunk does not hold up the rest.
TEST(ThreadPool, OtherThreadsTakeTheChunksOfABusyOne) {
  ThreadPool pool(2);
  const int64_t chunks = 2 * ThreadPool::kChunksPerThread;
  std::atomic<int64_t> others_done{0};
  std::mutex mutex;
  std::vector<std::thread::id> runner(static_cast<size_t>(chunks));
  pool.parallel_for(chunks, [&](int64_t begin, int64_t) {
    {
      std::lock_guard lock(mutex);
      runner[static_cast<size_t>(begin)] = std::this_thread::get_id();
    }
    if (begin == 0) {
      // Busy until every other chunk is done (or give up after 10 s, and fail below).
      for (int i = 0; i < 10000 && others_done.load() < chunks - 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else {
      others_done.fetch_add(1);
    }
  });
  for (int64_t c = 1; c < chunks; ++c) EXPECT_NE(runner[static_cast<size_t>(c)], runner[0]) << "chunk " << c;
}

TEST(ThreadPool, ManyCallsEachCoverEveryItemOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  for (int call = 0; call < 300; ++call) {
    pool.parallel_for(1000, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (const auto& h : hits) ASSERT_EQ(h.load(), 300);
}

TEST(ThreadPool, RethrowsWorkerException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(10,
                                 [](int64_t begin, int64_t) {
                                   if (begin > 0) throw std::runtime_error("worker failed");
                                 }),
               std::runtime_error);
  int64_t total = 0;
  std::mutex mutex;
  pool.parallel_for(10, [&](int64_t begin, int64_t end) {
    std::lock_guard lock(mutex);
    total += end - begin;
  });
  EXPECT_EQ(total, 10);  // still usable
}

}  // namespace
}  // namespace strata::tensor
