#include "cluster/node_resources.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensor/matmul.h"
#include "tensor/quant.h"
#include "tensor/thread_pool.h"

// ---- The operating-system specific part: memory available now, and physical memory. ----
#ifdef __APPLE__
#include <mach/mach.h>
#include <sys/sysctl.h>

namespace strata::cluster {
namespace {

std::optional<uint64_t> available_memory() {
  vm_statistics64_data_t stats;
  mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
  if (host_statistics64(mach_host_self(), HOST_VM_INFO64, reinterpret_cast<host_info64_t>(&stats), &count) !=
      KERN_SUCCESS) {
    return std::nullopt;
  }
  vm_size_t page_size = 0;
  if (host_page_size(mach_host_self(), &page_size) != KERN_SUCCESS) return std::nullopt;
  // Inactive and purgeable pages are given up on demand, as Linux counts them in MemAvailable.
  const uint64_t pages = uint64_t{stats.free_count} + stats.inactive_count + stats.purgeable_count;
  return pages * page_size;
}

uint64_t physical_memory() {
  uint64_t bytes = 0;
  size_t size = sizeof bytes;
  return sysctlbyname("hw.memsize", &bytes, &size, nullptr, 0) == 0 ? bytes : 0;
}

}  // namespace
}  // namespace strata::cluster

#else  // Linux
#include <fstream>

namespace strata::cluster {
namespace {

std::optional<uint64_t> meminfo_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

// Inside a container MemAvailable describes the host; the container's own limit (cgroup v2,
// seen at the root of its cgroup namespace) is what the OOM killer enforces.
std::optional<uint64_t> cgroup_memory_left() {
  std::ifstream max_file("/sys/fs/cgroup/memory.max");
  std::ifstream current_file("/sys/fs/cgroup/memory.current");
  uint64_t limit = 0;
  uint64_t used = 0;
  if (!(max_file >> limit) || !(current_file >> used)) return std::nullopt;  // absent, or "max"
  return limit > used ? limit - used : 0;
}

std::optional<uint64_t> available_memory() {
  const std::optional<uint64_t> available = meminfo_available();
  const std::optional<uint64_t> cgroup = cgroup_memory_left();
  if (available && cgroup) return std::min(*available, *cgroup);
  return available ? available : cgroup;
}

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0;
}

}  // namespace
}  // namespace strata::cluster
#endif
// ---- End of the operating-system specific part. ----

namespace strata::cluster {
namespace {

constexpr int kLeastPasses = 3;
constexpr double kAgreement = 0.9;

// A 4096 × 4096 Q4_0 matrix (9 MiB) is the size of a 7B model's attention matrices. Prepared
// copies of it, used in turn, twice the last-level cache together (at least 64 MiB), so that
// the probe reads from memory as a decode step of a real model does: a probe that fits in the
// cache reads up to twice as fast as decode (2 copies on a machine with a large cache: 36 GiB/s
// against 18.5 with 16 copies, which a 1.1B model's decode matched). At most 16 (144 MiB), so
// that a node starts quickly.
constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 4096;
constexpr uint64_t kLeastProbeBytes = 64ull << 20;
constexpr int kMostCopies = 16;
// Short passes with pauses between them, until speed_confirmed, at most kMostPasses (about 1.5 s).
constexpr auto kPassTime = std::chrono::milliseconds(15);
constexpr auto kPause = std::chrono::milliseconds(15);
constexpr int kMostPasses = 50;
// Kernel time does not depend on the weights' values: a few distinct rows, repeated, will do.
constexpr int64_t kDistinctRows = 16;

uint64_t next_random(uint64_t& state) {  // splitmix64
  state += 0x9E3779B97F4A7C15ull;
  uint64_t x = state;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<uint8_t> random_q4_0_matrix() {
  const uint64_t row_bytes = *tensor::row_bytes(tensor::DType::Q4_0, kCols);
  std::vector<uint8_t> matrix(row_bytes * kRows);
  std::vector<float> values(kCols);
  uint64_t state = 1;
  for (int64_t row = 0; row < kDistinctRows; ++row) {
    for (float& v : values) v = static_cast<float>(next_random(state) >> 40) * 0x1.0p-24f - 0.5f;
    tensor::quantize_row(tensor::DType::Q4_0, values.data(), matrix.data() + row * row_bytes, kCols);
  }
  for (int64_t row = kDistinctRows; row < kRows; ++row) {
    std::copy_n(matrix.data() + (row % kDistinctRows) * row_bytes, row_bytes, matrix.data() + row * row_bytes);
  }
  return matrix;
}

}  // namespace

uint64_t detect_usable_memory() {
  const std::optional<uint64_t> available = available_memory();
  return available ? *available : physical_memory();
}

// The last-level cache, as the system says it, or 0.
uint64_t last_level_cache_bytes() {
#if defined(_SC_LEVEL3_CACHE_SIZE)
  for (const int level : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = sysconf(level);
    if (bytes > 0) return static_cast<uint64_t>(bytes);
  }
#endif
  return 0;
}

bool speed_confirmed(std::span<const double> rates) {
  if (rates.size() < static_cast<size_t>(kLeastPasses)) return false;
  std::vector<double> sorted(rates.begin(), rates.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  return sorted[1] >= kAgreement * sorted[0];
}

double measure_weight_speed(int threads) {
  if (threads < 1) throw std::invalid_argument("the weight speed probe needs at least 1 thread, not " + std::to_string(threads));
  const std::vector<uint8_t> quantized = random_q4_0_matrix();
  tensor::ThreadPool pool(threads);
  const uint64_t probe_bytes = std::max(2 * last_level_cache_bytes(), kLeastProbeBytes);
  const auto copy_count = static_cast<int>(
      std::clamp<uint64_t>((probe_bytes + quantized.size() - 1) / quantized.size(), 2, kMostCopies));
  std::vector<tensor::PreparedMatrix> copies(static_cast<size_t>(copy_count));
  pool.parallel_for(copy_count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      copies[static_cast<size_t>(i)] = tensor::PreparedMatrix({tensor::DType::Q4_0, kRows, kCols, quantized.data()});
    }
  });
  std::vector<float> x(kCols, 0.25f);
  std::vector<float> y(kRows);
  size_t next = 0;
  auto product = [&] {
    tensor::matmul(copies[next], x.data(), 1, y.data(), pool);
    next = (next + 1) % copies.size();
  };
  for (int i = 0; i < copy_count; ++i) product();  // threads started, copies touched

  std::vector<double> rates;
  while (!speed_confirmed(rates) && rates.size() < static_cast<size_t>(kMostPasses)) {
    if (!rates.empty()) std::this_thread::sleep_for(kPause);
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = std::chrono::steady_clock::duration::zero();
    int64_t products = 0;
    while (elapsed < kPassTime) {
      product();
      ++products;
      elapsed = std::chrono::steady_clock::now() - start;
    }
    rates.push_back(static_cast<double>(products * static_cast<int64_t>(quantized.size())) /
                    std::chrono::duration<double>(elapsed).count());
  }
  return *std::max_element(rates.begin(), rates.end());
}

}  // namespace strata::cluster
