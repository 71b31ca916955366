// A deterministic stand-in for the engine: the tokens it emits depend only on the prompt, so tests
// know the expected output without a model. Like the engine it runs limits.max_parallel requests
// at once, queues limits.max_queued more and refuses the rest.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/generator.h"

namespace strata::api::testing {

class FakeGenerator : public engine::Generator {
 public:
  struct Options {
    std::vector<engine::Token> vocabulary;  // what it draws tokens from
    engine::ModelLimits limits{128, 4, 16};
    std::chrono::milliseconds token_delay{0};
    bool queue_full = false;
    std::optional<int> end_of_generation_at;  // emit an end-of-generation token at this index
    engine::Token end_of_generation_token = 2;
    // When set, the model's whole answer to a prompt: these tokens, then the end-of-generation
    // token.
    std::function<std::vector<engine::Token>(std::span<const engine::Token> prompt)> script;
  };

  explicit FakeGenerator(Options options);
  ~FakeGenerator() override;

  engine::ModelLimits limits() const override { return options_.limits; }
  bool submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) override;
  void shutdown() override;
  std::string waiting_for() const override {
    std::lock_guard lock(mutex_);
    return waiting_for_;
  }
  // What it says it waits for (a cluster forming): empty, the default, when it can run requests.
  void set_waiting_for(std::string why) {
    std::lock_guard lock(mutex_);
    waiting_for_ = std::move(why);
  }

  // The first `count` tokens it generates for `prompt` (before any end-of-generation token), or
  // of the script.
  std::vector<engine::Token> tokens_for(std::span<const engine::Token> prompt, int count) const;
  static float logprob_at(int index) { return -0.25f * float(1 + index % 4); }

  // Waits until `count` requests have been submitted in all.
  bool wait_for_submissions(int count, std::chrono::milliseconds timeout);
  // Waits until `count` requests hold a running slot.
  bool wait_for_running(int count, std::chrono::milliseconds timeout);

  // How many times on_token returned false.
  int refusals() const { return refusals_; }
  bool wait_for_refusal(std::chrono::milliseconds timeout);
  // Waits until a queued request has been dropped because it was cancelled.
  bool wait_for_queue_drop(std::chrono::milliseconds timeout);
  engine::GenerationRequest last_request() const;

 private:
  void generate(engine::GenerationRequest request, engine::RequestCallbacks callbacks);
  // Waits for a running slot; false when the request was cancelled or shut down meanwhile.
  bool wait_for_slot(const engine::RequestCallbacks& callbacks);

  const Options options_;
  mutable std::mutex mutex_;
  std::condition_variable refused_;
  std::condition_variable submitted_;
  std::condition_variable slot_freed_;
  int submissions_ = 0;
  int in_flight_ = 0;  // running or queued
  int running_ = 0;
  int queue_drops_ = 0;
  std::atomic<int> refusals_{0};
  std::atomic<bool> shutting_down_{false};
  engine::GenerationRequest last_request_;
  std::string waiting_for_;
  std::vector<std::thread> workers_;
};

}  // namespace strata::api::testing
