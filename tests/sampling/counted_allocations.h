// This test binary's operator new counts the allocations of at least a size, while a
// CountedAllocations lives: a test can check that a step allocates nothing that large.
#pragma once

#include <cstddef>

namespace strata::sampling::tests {

class CountedAllocations {
 public:
  explicit CountedAllocations(size_t at_least_bytes);  // one at a time
  ~CountedAllocations();
  CountedAllocations(const CountedAllocations&) = delete;
  CountedAllocations& operator=(const CountedAllocations&) = delete;
  size_t count() const;  // so far
};

}  // namespace strata::sampling::tests
