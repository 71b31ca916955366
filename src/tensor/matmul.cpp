#include "tensor/matmul.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/interleaved.h"
#include "tensor/matmul_kernels.h"
#include "tensor/platform.h"
#include "tensor/quant_blocks.h"

namespace strata::tensor {
namespace {

using kernels::InterleavedActivation;
using kernels::InterleavedActivation256;
using kernels::InterleavedKernels;

// Scalar first, the fastest last.
std::vector<Isa> probe_isas() {
  std::vector<Isa> isas{Isa::Scalar};
#if defined(__x86_64__)
  const platform::X86Features x86 = platform::x86_features();
  if (x86.avx2_fma_f16c) isas.push_back(Isa::Avx2);
  if (x86.avx512_f_bw_vl_vnni) isas.push_back(Isa::Avx512);
#elif defined(__aarch64__)
  isas.push_back(Isa::Neon);
  if (platform::arm_dot_product()) isas.push_back(Isa::NeonDotprod);
#endif
  return isas;
}

std::atomic<Isa>& active() {
  static std::atomic<Isa> isa{detected_isa()};
  return isa;
}

// The kernel entry points of one ISA's build.
struct IsaKernels {
  InterleavedKernels (*interleaved)(DType);
  kernels::VectorKernels (*vector_ops)();
};

// Only the ISAs that available_isas() can return are compiled for the target.
IsaKernels kernels_of(Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::Avx512: return {kernels::avx512_interleaved, kernels::avx512_vector_ops};
    case Isa::Avx2: return {kernels::avx2_interleaved, kernels::avx2_vector_ops};
#else
    case Isa::Avx512:
    case Isa::Avx2:
#endif
#if defined(__aarch64__)
    case Isa::NeonDotprod: return {kernels::neon_dotprod_interleaved, kernels::neon_dotprod_vector_ops};
    case Isa::Neon: return {kernels::neon_interleaved, kernels::neon_vector_ops};
#else
    case Isa::NeonDotprod:
    case Isa::Neon:
#endif
    case Isa::Scalar: break;
  }
  return {kernels::scalar_interleaved, kernels::scalar_vector_ops};
}

// sum[i] = sum[i] + other[i] over a leaf tile's tokens, n a whole number of its kRows: two
// slots that check_leaves keeps apart, in runs of a fixed length, so that -O2 adds them in
// vectors (one element at a time cost a dense down's leaves as much as their kernel).
void add_into(float* __restrict sum, const float* __restrict other, int n) {
  for (int i = 0; i < n; i += interleaved::kRows) {
    for (int r = 0; r < interleaved::kRows; ++r) sum[i + r] = sum[i + r] + other[i + r];
  }
}

int sum_of(const int8_t* qs, int n) {
  int sum = 0;
  for (int i = 0; i < n; ++i) sum += qs[i];
  return sum;
}

// Quantizes a row of `cols` values into the activation layout a kernel reads.
template <class Activation>
void quantize_interleaved(const float* x, int64_t cols, int offset, Activation* out) {
  constexpr int kBlock = static_cast<int>(sizeof(Activation::qs));
  // Looked up once per row: the public quantize_int8 would look up the active ISA per block.
  const auto quantize_block = kernels::active_vector_ops().quantize_int8;
  const int64_t blocks = cols / kBlock;
  for (int64_t b = 0; b < blocks; ++b) out[b].d = quantize_block(x + b * kBlock, kBlock, out[b].qs);
  // The sums in a pass of their own: read right after the quantizer's narrower stores, each
  // load of qs waited for them to reach the cache (a failed store forward), which made the
  // sums cost more than the quantizing.
  for (int64_t b = 0; b < blocks; ++b) {
    Activation& a = out[b];
    if constexpr (kBlock == kQK) {
      const int sum = sum_of(a.qs, kBlock);
      a.start = -offset * sum;
      a.sum = static_cast<float>(sum);
    } else {
      for (int j = 0; j < 16; ++j) {
        a.group_sums[j] = static_cast<int16_t>(sum_of(a.qs + 16 * j, 16));
        a.starts[j] = -offset * a.group_sums[j];
      }
      for (int s = 0; s < 8; ++s) a.sums[s] = static_cast<int16_t>(a.group_sums[2 * s] + a.group_sums[2 * s + 1]);
    }
  }
}

// The byte and bit of lane `lane` that hold the `bits`-bit level fields of chunk m, byte k
// (interleaved.h): the low-nibble element's field at that bit, the high-nibble one's above it.
struct FieldPosition {
  int byte;
  int shift;
};

FieldPosition field_position(int bits, int m, int lane, int k) {
  const int chunks_per_plane = 4 / bits;
  return {64 * (m / chunks_per_plane) + 4 * lane + k, 2 * bits * (m % chunks_per_plane)};
}

// value + 128 -> an index of the table that holds the value: packing a table format back into
// nibbles stays a lookup per element.
using TableIndices = std::array<uint8_t, 256>;
constexpr TableIndices table_indices(interleaved::Table table) {
  TableIndices indices{};
  for (int i = 15; i >= 0; --i) indices[interleaved::table_values(table)[i] + 128] = static_cast<uint8_t>(i);
  return indices;
}
constexpr TableIndices kIq4nlIndices = table_indices(interleaved::Table::Iq4nl);
constexpr TableIndices kMxfp4Indices = table_indices(interleaved::Table::Mxfp4);

// The level an element is stored as: u = q + offset, or a table format's index of q.
int stored_level(interleaved::Format f, int q) {
  switch (f.table) {
    case interleaved::Table::None: return q + f.offset;
    case interleaved::Table::Iq4nl: return kIq4nlIndices[q + 128];
    case interleaved::Table::Mxfp4: return kMxfp4Indices[q + 128];
  }
  return 0;
}

// A block's levels into lane `lane` of its group's levels (interleaved.h), each element as
// stored_level says: bytes for Q8_0, else low and high fields in planes. Into zeroed memory:
// the fields are ORed. Each byte takes its two elements at once: loading a model is mostly this.
void pack_levels(DType type, interleaved::Format f, const UnpackedBlock& w, int lane, uint8_t* levels) {
  if (type == DType::Q8_0) {
    for (int i = 0; i < w.elements; i += 4) {
      for (int k = 0; k < 4; ++k) levels[i / 4 * 64 + 4 * lane + k] = static_cast<uint8_t>(w.q[i + k] + f.offset);
    }
    return;
  }
  const int low_mask = (1 << f.low_bits) - 1;
  for (int s = 0; s < w.elements / 32; ++s) {
    uint8_t* low_planes = levels + interleaved::sub_block_bytes(f) * s;
    uint8_t* high_planes = low_planes + 64 * f.low_bits;
    const int8_t* q = w.q + 32 * s;
    for (int m = 0; m < 4; ++m) {
      for (int k = 0; k < 4; ++k) {
        // Element 32s + 4m + k in the low nibble, 32s + 16 + 4m + k in the high one.
        const int low = stored_level(f, q[4 * m + k]);
        const int high = stored_level(f, q[16 + 4 * m + k]);
        const FieldPosition l = field_position(f.low_bits, m, lane, k);
        low_planes[l.byte] |=
            static_cast<uint8_t>((low & low_mask) << l.shift | (high & low_mask) << (l.shift + f.low_bits));
        if (f.high_bits != 0) {
          const FieldPosition h = field_position(f.high_bits, m, lane, k);
          high_planes[h.byte] |= static_cast<uint8_t>((low >> f.low_bits) << h.shift |
                                                      (high >> f.low_bits) << (h.shift + f.high_bits));
        }
      }
    }
  }
}

// Where a block's d (fp16, MXFP4's E8M0 byte) and, for the formats with a min term, the
// fp16 factor of that term (Q4_1/Q5_1 m, Q2_K/Q4_K/Q5_K dmin) sit within it.
struct HalfOffsets {
  size_t d;
  size_t min_factor;
};

HalfOffsets half_offsets(DType type) {
  switch (type) {
    case DType::Q6_K: return {offsetof(BlockQ6_K, d), 0};
    case DType::Q3_K: return {offsetof(BlockQ3_K, d), 0};
    case DType::Q2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::MXFP4: return {offsetof(BlockMXFP4, e), 0};
    default: return {0, 2};  // every other block begins with them
  }
}

// The scales of a block, from its source bytes and unpacked view, into lane `lane` of its
// group's meta (interleaved.h).
void pack_meta(DType type, interleaved::Format f, const uint8_t* source, const UnpackedBlock& w, int lane,
               uint8_t* meta) {
  const HalfOffsets halves = half_offsets(type);
  if (f.e8m0) {
    meta[lane] = source[halves.d];  // MXFP4's E8M0 byte, which fp16 cannot hold
  } else {
    std::memcpy(meta + 2 * lane, source + halves.d, 2);
  }
  if (f.has_min) std::memcpy(meta + interleaved::kMetaMinFactor + 2 * lane, source + halves.min_factor, 2);
  if (f.block != kQK_K) return;
  if (f.scale_min_nibbles) {
    for (int j = 0; j < 16; ++j) {
      meta[interleaved::kMetaScaleMinPairs + 2 * interleaved::kRows * (j / 2) + 2 * lane + j % 2] =
          static_cast<uint8_t>(w.scale[j] | w.min[j] << 4);
    }
  } else if (f.has_min) {
    for (int s = 0; s < 8; ++s) {
      meta[interleaved::kMetaScales45 + interleaved::kRows * s + lane] = static_cast<uint8_t>(w.scale[s]);
      meta[interleaved::kMetaMins + 2 * interleaved::kRows * (s / 2) + 2 * lane + s % 2] = w.min[s];
    }
  } else {
    for (int j = 0; j < kQK_K / f.group; ++j) {
      meta[interleaved::kMetaScales6 + interleaved::kRows * j + lane] = static_cast<uint8_t>(w.scale[j]);
    }
  }
}

// A float row's elements, as stored, into lane `lane` of its group's columns; float groups
// have no meta, so column k starts at k * levels_bytes. (Per-element calls, a variable-size
// copy and levels_at's division made loading an F16 model 20x slower.)
template <class Element>
void pack_float_row(const uint8_t* row, int64_t cols, int lane, uint8_t* group) {
  constexpr size_t kColumnBytes = sizeof(Element) * interleaved::kRows;
  uint8_t* out = group + sizeof(Element) * static_cast<size_t>(lane);
  for (int64_t k = 0; k < cols; ++k) {
    std::memcpy(out + kColumnBytes * static_cast<size_t>(k), row + sizeof(Element) * static_cast<size_t>(k),
                sizeof(Element));
  }
}

// Into zeroed memory: pack_levels ORs bit fields together.
void pack_interleaved(const Matrix& m, interleaved::Format f, std::byte* out) {
  const int64_t n_blocks = m.cols / f.block;
  const size_t group_size = interleaved::group_bytes(f, n_blocks);
  const size_t row_size = *row_bytes(m.type, static_cast<uint64_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    auto* group = reinterpret_cast<uint8_t*>(out) + static_cast<size_t>(r / interleaved::kRows) * group_size;
    const int lane = static_cast<int>(r % interleaved::kRows);
    const auto* row = static_cast<const uint8_t*>(m.data) + static_cast<size_t>(r) * row_size;
    if (f.block == 1) {
      if (row_size == 2 * static_cast<size_t>(m.cols)) {
        pack_float_row<uint16_t>(row, m.cols, lane, group);
      } else {
        pack_float_row<uint32_t>(row, m.cols, lane, group);
      }
      continue;
    }
    const uint32_t block_bytes = info(m.type).block_bytes;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* source = row + static_cast<size_t>(b) * block_bytes;
      UnpackedBlock w;
      unpack_block(m.type, source, w);
      pack_meta(m.type, f, source, w, lane, interleaved::meta_at(f, group, b));
      pack_levels(m.type, f, w, lane, interleaved::levels_at(f, group, b));
    }
  }
}

// Jobs whose formats share one activation layout and offset (interleaved_compatible). Each
// job's input is quantized once for all the jobs after it that take the same input.
template <class Activation>
void interleaved_matmul(std::span<const MatmulJob> jobs, ThreadPool& pool) {
  const interleaved::Format format = interleaved::format_of(jobs.front().product.w.source().type);

  // Buffers reused between calls; the lambdas below run on other threads, so they must
  // reach them through these plain pointers, not the thread_local names.
  thread_local std::vector<size_t> first_token_row;  // per job: the first of its token rows
  thread_local std::vector<const void*> token_buffer;
  first_token_row.resize(jobs.size());
  size_t token_rows_total = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const bool shared = i > 0 && jobs[i].x == jobs[i - 1].x && jobs[i].n_tokens == jobs[i - 1].n_tokens &&
                        jobs[i].product.w.source().cols == jobs[i - 1].product.w.source().cols;
    first_token_row[i] = shared ? first_token_row[i - 1] : token_rows_total;
    if (!shared) token_rows_total += static_cast<size_t>(jobs[i].n_tokens);
  }
  token_buffer.resize(token_rows_total);
  const void** token_rows = token_buffer.data();
  if constexpr (std::is_same_v<Activation, float>) {  // float weights take x as it is
    for (size_t i = 0; i < jobs.size(); ++i) {
      for (int64_t t = 0; t < jobs[i].n_tokens; ++t) {
        token_rows[first_token_row[i] + static_cast<size_t>(t)] = jobs[i].x + t * jobs[i].product.w.source().cols;
      }
    }
  } else {
    // One quantized row per distinct input row, in job order, of cols / block activations.
    struct Row {
      const float* x;
      int64_t cols;
      size_t first_activation;
    };
    thread_local std::vector<Row> row_buffer;
    thread_local std::vector<Activation> activation_buffer;
    row_buffer.resize(token_rows_total);
    size_t activations_total = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (i > 0 && first_token_row[i] == first_token_row[i - 1]) continue;
      const int64_t cols = jobs[i].product.w.source().cols;
      for (int64_t t = 0; t < jobs[i].n_tokens; ++t) {
        row_buffer[first_token_row[i] + static_cast<size_t>(t)] = {jobs[i].x + t * cols, cols, activations_total};
        activations_total += static_cast<size_t>(cols / format.block);
      }
    }
    activation_buffer.resize(activations_total);
    Activation* activations = activation_buffer.data();
    const Row* source_rows = row_buffer.data();
    for (size_t r = 0; r < token_rows_total; ++r) token_rows[r] = activations + source_rows[r].first_activation;
    const auto quantize_rows = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const Row& row = source_rows[r];
        quantize_interleaved(row.x, row.cols, format.offset, activations + row.first_activation);
      }
    };
    for_rows(static_cast<int64_t>(token_rows_total), pool, quantize_rows);
  }

  // One loop over the groups of all jobs, job after job.
  struct Part {
    const uint8_t* groups;
    size_t group_size;
    int64_t rows;
    int64_t n_blocks;
    int64_t first_group;  // in the joint numbering
    const void* const* tokens;
    int64_t n_tokens;
    InterleavedKernels kernel;
    float* y;
    const LeafProgram* leaves;
    int64_t leaf_blocks;     // of each leaf
    size_t leaf_bytes;       // of each leaf in a group
  };
  thread_local std::vector<Part> part_buffer;  // reused: this runs once per matmul
  std::vector<Part>& parts = part_buffer;
  parts.clear();
  int64_t n_groups = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Matrix& w = jobs[i].product.w.source();
    const interleaved::Format f = interleaved::format_of(w.type);
    const int64_t n_blocks = w.cols / f.block;
    const LeafProgram* leaves = jobs[i].leaves;
    const int64_t leaf_blocks = leaves != nullptr ? leaves->leaf_cols / f.block : n_blocks;
    parts.push_back({reinterpret_cast<const uint8_t*>(jobs[i].product.w.interleaved()),
                     interleaved::group_bytes(f, n_blocks), w.rows, n_blocks, n_groups,
                     token_rows + first_token_row[i], jobs[i].n_tokens,
                     kernels_of(active_isa()).interleaved(w.type), jobs[i].product.y, leaves, leaf_blocks,
                     interleaved::group_bytes(f, leaf_blocks)});
    n_groups += (w.rows + interleaved::kRows - 1) / interleaved::kRows;
  }
  // A group's rows of `tokens` tokens from t0 through a leaf program: each leaf's product into
  // a slot, as the kernel gives a matrix of its columns alone, and the slots added and stored.
  const auto leaf_tile = [](const Part& part, int64_t g, int64_t t0, int tokens) {
    constexpr int kTile = kernels::kMaxInterleavedTokens * interleaved::kRows;
    float slots[kLeafSlots][kTile];
    const void* leaf_tokens[kernels::kMaxInterleavedTokens];
    const uint8_t* group = part.groups + static_cast<size_t>(g) * part.group_size;
    const int64_t first_row = g * interleaved::kRows;
    const int rows = static_cast<int>(std::min<int64_t>(interleaved::kRows, part.rows - first_row));
    for (const LeafStep& step : part.leaves->steps) {
      float* slot = slots[step.slot];
      switch (step.kind) {
        case LeafStep::Kind::Leaf: {
          const int64_t first_block = static_cast<int64_t>(step.arg) * part.leaf_blocks;
          for (int t = 0; t < tokens; ++t) {
            leaf_tokens[t] = static_cast<const Activation*>(part.tokens[t0 + t]) + first_block;
          }
          part.kernel.run(group + static_cast<size_t>(step.arg) * part.leaf_bytes,
                          std::min(part.leaf_blocks, part.n_blocks - first_block), leaf_tokens, tokens, slot);
          break;
        }
        case LeafStep::Kind::Add:
          add_into(slot, slots[step.arg], tokens * interleaved::kRows);
          break;
        case LeafStep::Kind::Store:
          for (int t = 0; t < tokens; ++t) {
            std::copy_n(slot + t * interleaved::kRows, rows,
                        part.y + ((t0 + t) * part.leaves->outputs + step.arg) * part.rows + first_row);
          }
          break;
      }
    }
  };
  pool.parallel_for(n_groups, [&](int64_t group_begin, int64_t group_end) {
    float out[kernels::kMaxInterleavedTokens * interleaved::kRows];
    size_t part_index = 0;
    for (int64_t joint = group_begin; joint < group_end; ++joint) {
      while (part_index + 1 < parts.size() && joint >= parts[part_index + 1].first_group) ++part_index;
      const Part& part = parts[part_index];
      const int64_t g = joint - part.first_group;
      const int64_t first_row = g * interleaved::kRows;
      const int rows = static_cast<int>(std::min<int64_t>(interleaved::kRows, part.rows - first_row));
      for (int64_t t0 = 0; t0 < part.n_tokens; t0 += part.kernel.max_tokens) {
        const int tokens = static_cast<int>(std::min<int64_t>(part.kernel.max_tokens, part.n_tokens - t0));
        if (part.leaves != nullptr) {
          leaf_tile(part, g, t0, tokens);
          continue;
        }
        part.kernel.run(part.groups + static_cast<size_t>(g) * part.group_size, part.n_blocks, part.tokens + t0,
                        tokens, out);
        for (int t = 0; t < tokens; ++t) {
          std::copy_n(out + t * interleaved::kRows, rows, part.y + (t0 + t) * part.rows + first_row);
        }
      }
    }
  });
}

// Whether two interleaved matrices can share one loop (and, with the same input and cols,
// one quantized input).
bool interleaved_compatible(const PreparedMatrix& a, const PreparedMatrix& b) {
  const interleaved::Format fa = interleaved::format_of(a.source().type);
  const interleaved::Format fb = interleaved::format_of(b.source().type);
  return a.interleaved() != nullptr && b.interleaved() != nullptr && fa.block == fb.block && fa.offset == fb.offset;
}

void interleaved_matmul(std::span<const MatmulJob> jobs, ThreadPool& pool) {
  const int block = interleaved::format_of(jobs.front().product.w.source().type).block;
  if (block == kQK) {
    interleaved_matmul<InterleavedActivation>(jobs, pool);
  } else if (block == 1) {
    interleaved_matmul<float>(jobs, pool);
  } else {
    interleaved_matmul<InterleavedActivation256>(jobs, pool);
  }
}

// The bytes of `source`'s interleaved copy; throws for what the kernels cannot take.
size_t interleaved_bytes(const Matrix& source) {
  const auto weight_row_bytes = row_bytes(source.type, static_cast<uint64_t>(source.cols));
  const interleaved::Format format = interleaved::format_of(source.type);
  if (format.block == 0) {
    throw std::invalid_argument("matmul: unsupported weight type " + std::string(dtype_name(source.type)));
  }
  if (source.rows < 0 || source.cols < 0 || !weight_row_bytes) {
    throw std::invalid_argument("matmul: " + std::to_string(source.rows) + "x" +
                                std::to_string(source.cols) + " " + std::string(dtype_name(source.type)) +
                                " matrix is not a whole number of blocks per row");
  }
  const int64_t n_groups = (source.rows + interleaved::kRows - 1) / interleaved::kRows;
  return static_cast<size_t>(n_groups) * interleaved::group_bytes(format, source.cols / format.block);
}

// Zeroed memory for interleaved copies, on whole 2 MiB pages where the kernel offers them: a
// decode step streams every byte, and fewer TLB misses measured a few percent faster; a MoE
// model's experts on small pages decoded at half the speed, four streams at a fifth
// (Qwen3-30B-A3B, docs/PERFORMANCE.md). The tail keeps small pages, so that no memory is held
// beyond the matrices.
std::shared_ptr<std::byte> huge_page_buffer(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  void* buffer = nullptr;
  if (posix_memalign(&buffer, kHugePage, bytes) != 0) throw std::bad_alloc();
  std::shared_ptr<std::byte> owned(static_cast<std::byte*>(buffer), [](std::byte* p) { std::free(p); });
#ifdef MADV_HUGEPAGE  // Linux; macOS has no such advice
  if (bytes >= kHugePage) madvise(buffer, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
  std::memset(buffer, 0, bytes);
  return owned;
}

}  // namespace

// Packs `source` at `interleaved` (nullptr: a matrix without rows), memory `storage` owns.
PreparedMatrix::PreparedMatrix(const Matrix& source, std::shared_ptr<const std::byte> storage, std::byte* interleaved)
    : source_(source), storage_(std::move(storage)), interleaved_(interleaved) {
  if (interleaved != nullptr) pack_interleaved(source, interleaved::format_of(source.type), interleaved);
}

PreparedMatrix::PreparedMatrix(const Matrix& source) : PreparedMatrix(std::move(together({&source, 1}).front())) {}

std::span<const std::byte> PreparedMatrix::interleaved_region() const {
  if (interleaved_ == nullptr) return {};
  return {interleaved_, interleaved_bytes(source_)};
}

std::vector<PreparedMatrix> PreparedMatrix::together(std::span<const Matrix> sources) {
  std::vector<size_t> sizes;
  size_t total = 0;
  for (const Matrix& source : sources) {
    sizes.push_back(interleaved_bytes(source));  // whole cache lines, as units are (interleaved.h)
    total += sizes.back();
  }
  const std::shared_ptr<std::byte> buffer = total > 0 ? huge_page_buffer(total) : nullptr;
  std::vector<PreparedMatrix> prepared;
  prepared.reserve(sources.size());
  size_t offset = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    prepared.push_back(PreparedMatrix(sources[i], buffer, sizes[i] > 0 ? buffer.get() + offset : nullptr));
    offset += sizes[i];
  }
  return prepared;
}

std::vector<PreparedMatrix> PreparedMatrix::columns(std::span<const Matrix> sources,
                                                    std::span<const ColumnRange> ranges) {
  std::vector<Matrix> parts;
  std::vector<std::byte> copies;
  for (const Matrix& source : sources) {
    const uint64_t stride = *row_bytes(source.type, static_cast<uint64_t>(source.cols));
    for (const ColumnRange& range : ranges) {
      const auto skipped = row_bytes(source.type, static_cast<uint64_t>(range.first));
      const auto width = row_bytes(source.type, static_cast<uint64_t>(range.count));
      if (range.first < 0 || range.count <= 0 || range.first + range.count > source.cols || !skipped || !width) {
        throw std::invalid_argument("columns " + std::to_string(range.first) + " .. " +
                                    std::to_string(range.first + range.count) + " are not whole blocks of a " +
                                    std::string(dtype_name(source.type)) + " matrix of " +
                                    std::to_string(source.cols) + " columns");
      }
      const size_t at = copies.size();
      copies.resize(at + *width * static_cast<uint64_t>(source.rows));
      for (int64_t r = 0; r < source.rows; ++r) {
        std::memcpy(copies.data() + at + *width * static_cast<uint64_t>(r),
                    static_cast<const std::byte*>(source.data) + stride * static_cast<uint64_t>(r) + *skipped, *width);
      }
      parts.push_back({source.type, source.rows, range.count, reinterpret_cast<const void*>(at)});
    }
  }
  for (Matrix& part : parts) part.data = copies.data() + reinterpret_cast<size_t>(part.data);
  std::vector<PreparedMatrix> prepared = together(parts);
  for (PreparedMatrix& matrix : prepared) matrix.source_.data = nullptr;  // the copies go with this scope
  return prepared;
}

std::span<const Isa> available_isas() {
  static const std::vector<Isa> isas = probe_isas();
  return isas;
}

Isa detected_isa() { return available_isas().back(); }

Isa active_isa() { return active().load(std::memory_order_relaxed); }

kernels::VectorKernels kernels::active_vector_ops() { return kernels_of(active_isa()).vector_ops(); }

void force_isa(Isa isa) {
  const std::span<const Isa> isas = available_isas();
  const bool available = std::find(isas.begin(), isas.end(), isa) != isas.end();
  active().store(available ? isa : detected_isa(), std::memory_order_relaxed);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Neon: return "neon";
    case Isa::NeonDotprod: return "neon-dotprod";
  }
  return "unknown";
}

void matmul(const PreparedMatrix& prepared, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  matmul({Product{prepared, y}}, x, n_tokens, pool);
}

void matmul(std::initializer_list<Product> products, const float* x, int64_t n_tokens, ThreadPool& pool) {
  thread_local std::vector<MatmulJob> jobs;
  jobs.clear();
  for (const Product& p : products) jobs.push_back({p, x, n_tokens});
  matmul(std::span<const MatmulJob>(jobs), pool);
}

int64_t leaf_unit(DType type) {
  const interleaved::Format format = interleaved::format_of(type);
  return static_cast<int64_t>(format.block) * format.blocks_per_unit;
}

namespace {

// Throws std::invalid_argument for a leaf program that w's layout cannot run or that reads a
// slot, leaf or output it does not have.
void check_leaves(const PreparedMatrix& w, const LeafProgram& leaves) {
  const Matrix& m = w.source();
  const std::string what = "matmul: a leaf program over a " + std::string(dtype_name(m.type)) + " matrix of " +
                           std::to_string(m.cols) + " columns ";
  const int64_t unit = leaf_unit(m.type);
  const int64_t count = leaves.leaf_cols > 0 ? (m.cols + leaves.leaf_cols - 1) / leaves.leaf_cols : 0;
  // Every leaf but the first starts at a unit of the layout.
  if (count == 0 || (count > 1 && leaves.leaf_cols % unit != 0)) {
    throw std::invalid_argument(what + "needs leaves of whole units of " + std::to_string(unit) + " columns, not " +
                                std::to_string(leaves.leaf_cols));
  }
  for (const LeafStep& step : leaves.steps) {
    const bool fits = step.slot < kLeafSlots &&
                      (step.kind == LeafStep::Kind::Leaf  ? step.arg < count
                       : step.kind == LeafStep::Kind::Add ? step.arg < kLeafSlots && step.arg != step.slot
                                                          : step.arg < leaves.outputs);
    if (!fits) {
      throw std::invalid_argument(what + "names a slot, leaf or output it does not have, or adds a slot to itself");
    }
  }
}

}  // namespace

void matmul(std::span<const MatmulJob> jobs, ThreadPool& pool) {
  for (const MatmulJob& job : jobs) {
    if (job.leaves != nullptr) check_leaves(job.product.w, *job.leaves);
  }
  // Runs of neighbours that can share one loop go together.
  for (size_t begin = 0; begin < jobs.size();) {
    size_t end = begin + 1;
    if (jobs[begin].product.w.interleaved() != nullptr && jobs[begin].n_tokens > 0) {
      while (end < jobs.size() && jobs[end].n_tokens > 0 &&
             interleaved_compatible(jobs[begin].product.w, jobs[end].product.w)) {
        ++end;
      }
      interleaved_matmul(jobs.subspan(begin, end - begin), pool);
    }  // else a matrix without rows or a job without tokens: nothing to do
    begin = end;
  }
}

}  // namespace strata::tensor
