// What metrics cost per generated token, in nanoseconds, to be set against a token's decode time
// (docs/PERFORMANCE.md#metrics-and-logging). Per token, the node the request entered at runs
// its observed on_token (api/request_observer.h: a clock read, a histogram, a counter, the
// timeline's lock); per batch, each local stage times its step and observes three histograms
// (engine/local_stage.cpp); per batch sent to a remote stage, the caller observes its round
// trip and each end of the link counts the message and its reply (rpc/link_metrics.cpp). No
// log line is written per token or per batch, only one per generation.
//   metrics_bench [benchmark flags]
#include <benchmark/benchmark.h>

#include <chrono>
#include <mutex>

#include "api/request_observer.h"
#include "metrics/metrics.h"

namespace strata {
namespace {

void BM_EntryNodeToken(benchmark::State& state) {
  engine::RequestCallbacks inner;
  inner.on_token = [](const engine::GeneratedToken&) { return true; };
  inner.on_finish = [](engine::FinishReason, const std::string&) {};
  const engine::RequestCallbacks observed = api::observed(inner, 16, "bench", nullptr);
  const engine::GeneratedToken token;
  for (auto _ : state) benchmark::DoNotOptimize(observed.on_token(token));
  observed.on_finish(engine::FinishReason::Length, {});
}
BENCHMARK(BM_EntryNodeToken);

// As LocalStage::forward around its model's forward pass: two clock reads, three observations.
void BM_StageStep(benchmark::State& state) {
  metrics::Registry& r = metrics::process_registry();
  const std::vector<double> sizes{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  metrics::Histogram& seconds = r.histogram("bench_step_seconds", "", metrics::seconds_buckets());
  metrics::Histogram& inputs = r.histogram("bench_step_inputs", "", sizes);
  metrics::Histogram& sequences = r.histogram("bench_step_sequences", "", sizes);
  for (auto _ : state) {
    const auto started = std::chrono::steady_clock::now();
    seconds.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    inputs.observe(1);
    sequences.observe(1);
  }
}
BENCHMARK(BM_StageStep);

// One batch to a remote stage and its reply, as counted at one end of the link: the caller's
// round trip (a clock pair and a histogram), and per message a lock and two counters.
void BM_RemoteBatch(benchmark::State& state) {
  metrics::Registry& r = metrics::process_registry();
  metrics::Histogram& round_trips = r.histogram("bench_round_trip_seconds", "", metrics::seconds_buckets());
  metrics::Counter& sent_bytes = r.counter("bench_sent_bytes_total", "");
  metrics::Counter& sent_messages = r.counter("bench_sent_messages_total", "");
  metrics::Counter& received_bytes = r.counter("bench_received_bytes_total", "");
  metrics::Counter& received_messages = r.counter("bench_received_messages_total", "");
  std::mutex call;
  for (auto _ : state) {
    const auto sent = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(call);
      sent_bytes.add(4120);
      sent_messages.add();
    }
    {
      std::lock_guard lock(call);
      received_bytes.add(4104);
      received_messages.add();
    }
    round_trips.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count());
  }
}
BENCHMARK(BM_RemoteBatch);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
