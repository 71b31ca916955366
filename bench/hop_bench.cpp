// The transport's cost per pipeline hop: a RemoteStage call over loopback gRPC to a stage that
// computes nothing and returns its input, with the activations of TinyLlama (2048 floats per
// row), signed with a cluster key as in a cluster. Rows: 1 (one decode stream) to 256 (a
// prompt chunk).
//   hop_bench [benchmark flags]
#include <benchmark/benchmark.h>

#include "rpc/channel.h"
#include "rpc/node_service.h"
#include "rpc/remote_stage.h"

namespace strata::rpc {
namespace {

constexpr int kHidden = 2048;

class EchoStage final : public engine::Stage {
 public:
  engine::StageOutput forward(const engine::StageBatch& batch) override { return {batch.hidden, {}}; }
  void release(std::span<const engine::SequenceId>) override {}
  int hold_prefix(engine::SequenceId, int, std::span<const engine::Token>) override { return 0; }
  model::KvBlockCounts kv_blocks() override { return {}; }
};

class EchoNode final : public NodeHandler {
 public:
  std::string hello(const cluster_types::Hello&, const std::string&, cluster_types::Hello&) override { return {}; }
  std::shared_ptr<engine::Stage> stage(uint64_t, std::string&) override { return stage_; }
  std::shared_ptr<engine::Generator> scheduler(std::string& why) override {
    why = "no scheduler";
    return nullptr;
  }
  std::optional<cluster_types::ModelManifest> manifest(const std::string&, std::string& why) override {
    why = "no model";
    return std::nullopt;
  }
  std::optional<TensorBytes> tensor(const cluster_types::TensorRequest&, std::string& why) override {
    why = "no model";
    return std::nullopt;
  }

 private:
  std::shared_ptr<EchoStage> stage_ = std::make_shared<EchoStage>();
};

void BM_Hop(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0));
  auto key = std::make_shared<ClusterKey>("bench");
  EchoNode node;
  NodeServer server(node, "echo", key, "127.0.0.1", 0, {});
  RemoteStage stage("echo", make_channel("127.0.0.1:" + std::to_string(server.port()), *key), Caller{"bench", 1, key});
  engine::StageBatch batch;
  for (int s = 0; s < rows; ++s) batch.sequences.push_back({static_cast<engine::SequenceId>(s + 1), 5, 1, 64});
  batch.tokens.assign(static_cast<size_t>(rows), 1);
  batch.hidden.assign(static_cast<size_t>(rows) * kHidden, 0.5f);
  stage.forward(batch);  // connect
  for (auto _ : state) benchmark::DoNotOptimize(stage.forward(batch));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * rows * kHidden * 4 * 2);
}
BENCHMARK(BM_Hop)->Arg(1)->Arg(8)->Arg(256)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace strata::rpc

BENCHMARK_MAIN();
