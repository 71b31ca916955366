// Runs a whole model on this node with continuous batching: every step is one batched forward
// over all active sequences (prompt chunks and single decode tokens together), and new
// requests join between steps.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/generator.h"
#include "model/model.h"
#include "tensor/thread_pool.h"

namespace strata::engine {

struct EngineOptions {
  int context_size = 0;       // 0: the model's trained context
  int max_parallel = 4;       // sequences decoded together
  int max_queued = 64;        // waiting requests beyond that are refused
  int threads = 0;            // 0: all cores
  int prefill_chunk = 256;    // prompt tokens per step, so long prompts do not stall decoding
};

class Engine final : public Generator {
 public:
  // `is_end_of_generation` tells which sampled tokens end a request (EOS, EOT, ...).
  Engine(std::shared_ptr<model::Model> model, std::function<bool(Token)> is_end_of_generation,
         EngineOptions options);
  ~Engine() override;

  ModelLimits limits() const override;
  bool submit(GenerationRequest request, RequestCallbacks callbacks) override;
  void shutdown() override;

 private:
  struct Sequence;
  void run_loop();
  void step(std::vector<std::unique_ptr<Sequence>>& active);
  void finish(Sequence& seq, FinishReason reason, const std::string& error = {});
  // Takes the queued sequences whose request was cancelled out of the queue (mutex_ held).
  std::vector<std::unique_ptr<Sequence>> take_cancelled();
  void finish_cancelled(std::vector<std::unique_ptr<Sequence>> cancelled);

  std::shared_ptr<model::Model> model_;
  std::function<bool(Token)> is_end_of_generation_;
  EngineOptions options_;
  tensor::ThreadPool pool_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  int running_ = 0;  // sequences the loop holds, finished ones excluded
  bool stopping_ = false;
  std::thread loop_;
};

}  // namespace strata::engine
