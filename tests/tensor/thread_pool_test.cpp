#include "tensor/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <map>
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

// The chunks of one parallel_for, in any order.
using Chunks = std::vector<std::pair<int64_t, int64_t>>;

Chunks chunks_of_loop(ThreadPool& pool, int64_t n) {
  std::mutex mutex;
  Chunks chunks;
  pool.parallel_for(n, [&](int64_t begin, int64_t end) {
    std::lock_guard lock(mutex);
    chunks.emplace_back(begin, end);
  });
  return chunks;
}

void expect_each_item_once(Chunks chunks, int64_t n) {
  std::sort(chunks.begin(), chunks.end());
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.front().first, 0);
  EXPECT_EQ(chunks.back().second, n);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_LT(chunks[i].first, chunks[i].second);
    if (i > 0) {
      EXPECT_EQ(chunks[i].first, chunks[i - 1].second) << "a gap or an overlap";
    }
  }
}

TEST(ThreadPool, ChunksCoverEveryItemOnce) {
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 100, 5000}) expect_each_item_once(chunks_of_loop(pool, n), n);
  }
}

// for_rows: fewer rows than threads run at once on the calling thread; more, in parallel
// chunks that cover each row once.
TEST(ThreadPool, ForRowsRunsFewRowsOnTheCallingThread) {
  ThreadPool pool(3);
  const auto caller = std::this_thread::get_id();
  std::vector<std::pair<int64_t, int64_t>> calls;
  for_rows(2, pool, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    calls.emplace_back(begin, end);
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(int64_t{0}, int64_t{2}));
  std::mutex mutex;
  Chunks chunks;
  std::atomic<bool> worker_ran{false};
  for_rows(3000, pool, [&](int64_t begin, int64_t end) {
    {
      std::lock_guard lock(mutex);
      chunks.emplace_back(begin, end);
    }
    if (std::this_thread::get_id() != caller) {
      worker_ran = true;
      return;
    }
    // The calling thread waits for a worker, lest it take every row before one wakes.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!worker_ran && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  });
  expect_each_item_once(chunks, 3000);
  EXPECT_TRUE(worker_ran);
}

// More items than one pass of the threads' runs holds (2^32 - 1) take several passes.
TEST(ThreadPool, LoopsLongerThanOnePassCoverEveryItemOnce) {
  ThreadPool pool(2);
  const int64_t n = (int64_t{1} << 32) + 5;
  expect_each_item_once(chunks_of_loop(pool, n), n);
}

// A matmul's threads each stream their rows from memory; every jump to items that do not
// follow the thread's last chunk starts a new stream, which the prefetcher must learn again.
// With two threads a jump happens at the start and once per steal, and each steal halves
// what is left, so there are only a few.
TEST(ThreadPool, EachThreadMostlyContinuesWhereItsLastChunkEnded) {
  ThreadPool pool(2);
  for (int64_t n : {64, 1000, 100000}) {
    std::mutex mutex;
    std::map<std::thread::id, std::vector<std::pair<int64_t, int64_t>>> chunks_by_thread;
    std::atomic<uint64_t> sink{0};
    pool.parallel_for(n, [&](int64_t begin, int64_t end) {
      {
        std::lock_guard lock(mutex);
        chunks_by_thread[std::this_thread::get_id()].emplace_back(begin, end);
      }
      uint64_t work = 0;  // some work per item, so that both threads take part
      for (int64_t i = begin * 200; i < end * 200; ++i) work += static_cast<uint64_t>(i) * 2654435761u;
      sink.fetch_add(work, std::memory_order_relaxed);
    });
    int jumps = 0;
    for (const auto& [thread, chunks] : chunks_by_thread) {
      for (size_t i = 0; i < chunks.size(); ++i) jumps += i == 0 || chunks[i].first != chunks[i - 1].second;
    }
    EXPECT_LE(jumps, 2 + std::bit_width(static_cast<uint64_t>(n))) << n << " items";
  }
}

// The point of chunks: a thread held up in one chunk does not hold up the rest. The busy
// chunk is the first one any thread starts: which thread that is depends on scheduling (a
// worker may run everything before the caller starts, as happened under QEMU).
TEST(ThreadPool, OtherThreadsTakeTheChunksOfABusyOne) {
  ThreadPool pool(2);
  const int64_t items = 64;
  std::atomic<int64_t> others_done{0};
  std::mutex mutex;
  std::vector<std::pair<int64_t, std::thread::id>> runner;  // the busy chunk first
  pool.parallel_for(items, [&](int64_t begin, int64_t end) {
    bool busy = false;
    {
      std::lock_guard lock(mutex);
      busy = runner.empty();
      runner.emplace_back(begin, std::this_thread::get_id());
    }
    if (busy) {
      // Busy until every other item is done (or give up after 10 s, and fail below).
      for (int i = 0; i < 10000 && others_done.load() < items - (end - begin); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else {
      others_done.fetch_add(end - begin);
    }
  });
  ASSERT_GT(runner.size(), 1u);
  for (size_t i = 1; i < runner.size(); ++i) {
    EXPECT_NE(runner[i].second, runner[0].second) << "chunk at " << runner[i].first << " ran on the busy thread";
  }
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
