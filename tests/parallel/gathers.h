// Members of a group gathering on threads of a test, each value of a part telling its member,
// row and column, so that a gathered row shows where each of its values came from.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "parallel/socket_exchange.h"

namespace strata::parallel {

inline float value(int m, size_t r, size_t c) { return static_cast<float>(m * 1000000 + r * 1000 + c) + 0.5f; }

inline std::vector<float> part_of(int member, int width, size_t rows) {
  std::vector<float> part;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < static_cast<size_t>(width); ++c) part.push_back(value(member, r, c));
  }
  return part;
}

inline std::vector<float> rows_whole(const std::vector<int>& widths, size_t rows) {
  std::vector<float> whole;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t m = 0; m < widths.size(); ++m) {
      for (size_t c = 0; c < static_cast<size_t>(widths[m]); ++c) whole.push_back(value(static_cast<int>(m), r, c));
    }
  }
  return whole;
}

// exchanges[m] gathers `calls` (each a number of rows) on a thread of its own: every member has
// every row whole, in member order.
inline void expect_gathers_in_member_order(const std::vector<std::unique_ptr<SocketExchange>>& exchanges,
                                           const std::vector<int>& widths, const std::vector<size_t>& calls) {
  const int members = static_cast<int>(exchanges.size());
  size_t row_width = 0;
  for (const int w : widths) row_width += static_cast<size_t>(w);
  std::vector<std::vector<std::vector<float>>> gathered(static_cast<size_t>(members));
  std::vector<std::thread> threads;
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] {
      for (const size_t rows : calls) {
        std::vector<float> full(rows * row_width);
        exchanges[m]->all_gather(part_of(m, widths[m], rows), widths, rows, full);
        gathered[m].push_back(std::move(full));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t call = 0; call < calls.size(); ++call) {
    const std::vector<float> expected = rows_whole(widths, calls[call]);
    for (int m = 0; m < members; ++m) EXPECT_EQ(gathered[m][call], expected) << "call " << call << ", member " << m;
  }
}

}  // namespace strata::parallel
