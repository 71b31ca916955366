#include "counted_allocations.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace {
std::atomic<size_t> counted{0};
std::atomic<size_t> threshold{SIZE_MAX};  // none counted
}  // namespace

// In a translation unit of their own, so that no caller's free() meets an inlined new.
void* operator new(std::size_t size) {
  if (size >= threshold.load(std::memory_order_relaxed)) counted.fetch_add(1, std::memory_order_relaxed);
  if (void* memory = std::malloc(size == 0 ? 1 : size)) return memory;
  throw std::bad_alloc();
}
void operator delete(void* memory) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t) noexcept { std::free(memory); }

namespace strata::sampling::tests {

CountedAllocations::CountedAllocations(size_t at_least_bytes) {
  counted = 0;
  threshold = at_least_bytes;
}

CountedAllocations::~CountedAllocations() { threshold = SIZE_MAX; }

size_t CountedAllocations::count() const { return counted.load(); }

}  // namespace strata::sampling::tests
