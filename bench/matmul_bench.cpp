// matmul throughput on a 2048x5632 matrix (TinyLlama's FFN size) for every weight type, and a MoE
// decode step's expert products (experts/).
//   matmul_bench [--isa=scalar|avx2|avx512|neon|neon-dotprod] [--threads=N] [--hot] [benchmark flags]
// Reports weight bytes streamed per second (bytes_per_second) and tokens per second.
// Several copies of the matrix are cycled through so that decode reads from DRAM, not L3;
// --hot uses one copy, to see the kernels' speed apart from memory.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tensor/matmul.h"
#include "tensor/quant.h"

namespace strata::tensor {
namespace {

constexpr int64_t kRows = 2048;
constexpr int64_t kCols = 5632;
constexpr size_t kColdBytes = size_t{160} << 20;  // well beyond a 32 MiB L3

int g_threads = 2;
bool g_hot = false;

struct Weights {
  std::vector<std::vector<uint8_t>> copies;
  std::vector<PreparedMatrix> prepared;  // one per copy, as a model load prepares them
  size_t bytes = 0;                      // of one copy
};

// How many copies to cycle through so that every read comes from DRAM (--hot: `least`).
size_t copies_for(size_t bytes, size_t least) { return g_hot ? least : std::max(least, kColdBytes / bytes + 1); }

// `least` or more copies (copies_for) of one random rows x cols matrix of `type`.
std::unique_ptr<Weights> random_weights(DType type, int64_t rows, int64_t cols, size_t least) {
  auto w = std::make_unique<Weights>();
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t bytes_per_row = *row_bytes(type, cols);
  w->bytes = bytes_per_row * static_cast<size_t>(rows);
  std::vector<uint8_t> first(w->bytes);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = dist(rng);
    quantize_row(type, row.data(), first.data() + static_cast<size_t>(r) * bytes_per_row, cols);
  }
  w->copies.assign(copies_for(w->bytes, least), first);
  for (const auto& copy : w->copies) w->prepared.emplace_back(Matrix{type, rows, cols, copy.data()});
  return w;
}

const Weights& weights_for(DType type) {
  static std::vector<std::unique_ptr<Weights>> cache(64);
  auto& slot = cache[static_cast<size_t>(type)];
  if (!slot) slot = random_weights(type, kRows, kCols, 1);
  return *slot;
}

std::string label() { return std::string(isa_name(active_isa())) + ", " + std::to_string(g_threads) + " threads"; }

void BM_matmul(benchmark::State& state, DType type) {
  const int64_t n_tokens = state.range(0);
  const Weights& w = weights_for(type);
  ThreadPool pool(g_threads);
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tokens * kCols));
  for (float& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * kRows));
  size_t copy = 0;
  for (auto _ : state) {
    matmul(w.prepared[copy], x.data(), n_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    copy = (copy + 1) % w.prepared.size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * w.bytes));
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations() * n_tokens),
                                               benchmark::Counter::kIsRate);
  state.SetLabel(label());
}

// One token's chosen experts in a decode step, as Model::experts_ffn runs them: the gate and
// up products of `chosen` experts of rows x cols in one job list, each step's experts other
// than the last step's (a pool of them beyond the L3, unless --hot), so that every byte comes
// from DRAM, as a MoE decode step's do. Arguments: chosen, rows, cols.
void BM_expert_step(benchmark::State& state, DType type) {
  const auto chosen = static_cast<size_t>(state.range(0));
  const int64_t rows = state.range(1);
  const int64_t cols = state.range(2);
  const std::unique_ptr<Weights> experts = random_weights(type, rows, cols, 2 * chosen);
  ThreadPool pool(g_threads);
  std::vector<float> x(static_cast<size_t>(cols), 0.5f);
  std::vector<float> y(2 * chosen * static_cast<size_t>(rows));
  std::vector<MatmulJob> jobs;
  size_t next = 0;
  for (auto _ : state) {
    jobs.clear();
    for (size_t e = 0; e < 2 * chosen; ++e) {
      jobs.push_back({{experts->prepared[next], y.data() + e * static_cast<size_t>(rows)}, x.data(), 1});
      next = (next + 1) % experts->prepared.size();
    }
    matmul(jobs, pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * chosen * experts->bytes));
  state.SetLabel(label());
}

void register_all() {
  // gpt-oss-20b's 4 of 32 experts of 2880 x 2880, and Qwen3-30B-A3B's 8 of 128 of 768 x 2048
  // (whose sizes need 256-element blocks).
  struct Experts {
    DType type;
    std::vector<int64_t> chosen_rows_cols;
  };
  for (const Experts& e : {Experts{DType::Q4_0, {4, 2880, 2880}}, Experts{DType::Q8_0, {4, 2880, 2880}},
                           Experts{DType::IQ4_NL, {4, 2880, 2880}}, Experts{DType::MXFP4, {4, 2880, 2880}},
                           Experts{DType::Q4_K, {8, 768, 2048}}, Experts{DType::Q6_K, {8, 768, 2048}},
                           Experts{DType::IQ4_XS, {8, 768, 2048}}}) {
    benchmark::RegisterBenchmark(("experts/" + std::string(dtype_name(e.type))).c_str(), BM_expert_step, e.type)
        ->Args(e.chosen_rows_cols)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4, DType::F16,
                     DType::BF16, DType::F32}) {
    benchmark::RegisterBenchmark(("matmul/" + std::string(dtype_name(type))).c_str(), BM_matmul, type)
        ->Arg(1)
        ->Arg(2)
        ->Arg(8)  // a decode step of 8 concurrent requests
        ->Arg(128)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace
}  // namespace strata::tensor

int main(int argc, char** argv) {
  using namespace strata::tensor;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--isa=", 0) == 0) {
      const std::string name = arg.substr(6);
      for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::NeonDotprod}) {
        if (name == isa_name(isa)) force_isa(isa);
      }
    } else if (arg.rfind("--threads=", 0) == 0) {
      g_threads = std::stoi(arg.substr(10));
    } else if (arg == "--hot") {
      g_hot = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
