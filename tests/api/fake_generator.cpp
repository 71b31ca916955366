#include "fake_generator.h"

#include <algorithm>
#include <stdexcept>

namespace strata::api::testing {

FakeGenerator::FakeGenerator(Options options) : options_(std::move(options)) {}

FakeGenerator::~FakeGenerator() { shutdown(); }

bool FakeGenerator::submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
  if (options_.queue_full || shutting_down_) return false;
  if (request.prompt.size() + size_t(request.max_tokens) > size_t(options_.limits.context_size)) {
    throw std::invalid_argument("the request does not fit the context");
  }
  {
    std::lock_guard lock(mutex_);
    if (in_flight_ >= options_.limits.max_parallel + options_.limits.max_queued) return false;
    ++in_flight_;
    last_request_ = request;
    workers_.emplace_back(&FakeGenerator::generate, this, std::move(request), std::move(callbacks));
    ++submissions_;
  }
  submitted_.notify_all();
  return true;
}

void FakeGenerator::shutdown() {
  shutting_down_ = true;
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(mutex_);
    workers.swap(workers_);
  }
  for (auto& worker : workers) worker.join();
}

std::vector<engine::Token> FakeGenerator::tokens_for(std::span<const engine::Token> prompt,
                                                     int count) const {
  if (options_.script) {
    const auto script = options_.script(prompt);
    return {script.begin(), script.begin() + std::min<size_t>(size_t(std::max(count, 0)), script.size())};
  }
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the prompt
  for (engine::Token token : prompt) hash = (hash ^ uint32_t(token)) * 1099511628211ull;
  std::vector<engine::Token> tokens;
  for (int i = 0; i < count; ++i) {
    hash = hash * 6364136223846793005ull + 1442695040888963407ull;
    tokens.push_back(options_.vocabulary[(hash >> 33) % options_.vocabulary.size()]);
  }
  return tokens;
}

bool FakeGenerator::wait_for_submissions(int count, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return submitted_.wait_for(lock, timeout, [&] { return submissions_ >= count; });
}

bool FakeGenerator::wait_for_running(int count, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return submitted_.wait_for(lock, timeout, [&] { return running_ >= count; });
}

bool FakeGenerator::wait_for_refusal(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return refused_.wait_for(lock, timeout, [&] { return refusals_ > 0; });
}

bool FakeGenerator::wait_for_queue_drop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return refused_.wait_for(lock, timeout, [&] { return queue_drops_ > 0; });
}

bool FakeGenerator::wait_for_slot(const engine::RequestCallbacks& callbacks) {
  std::unique_lock lock(mutex_);
  while (running_ >= options_.limits.max_parallel) {
    if (shutting_down_ || (callbacks.cancelled && callbacks.cancelled())) {
      ++queue_drops_;
      --in_flight_;
      refused_.notify_all();
      return false;
    }
    slot_freed_.wait_for(lock, std::chrono::milliseconds(5));
  }
  ++running_;
  submitted_.notify_all();
  return true;
}

engine::GenerationRequest FakeGenerator::last_request() const {
  std::lock_guard lock(mutex_);
  return last_request_;
}

void FakeGenerator::generate(engine::GenerationRequest request,
                             engine::RequestCallbacks callbacks) {
  if (!wait_for_slot(callbacks)) {
    callbacks.on_finish(engine::FinishReason::Cancelled, {});
    return;
  }
  struct SlotRelease {
    FakeGenerator& fake;
    ~SlotRelease() {
      {
        std::lock_guard lock(fake.mutex_);
        --fake.running_;
        --fake.in_flight_;
      }
      fake.slot_freed_.notify_all();
    }
  } release{*this};
  const auto tokens = tokens_for(request.prompt, request.max_tokens);
  for (int i = 0; i < request.max_tokens; ++i) {
    if (options_.token_delay.count() > 0) std::this_thread::sleep_for(options_.token_delay);
    if (shutting_down_) {
      callbacks.on_finish(engine::FinishReason::Cancelled, {});
      return;
    }
    const bool script_done = options_.script && size_t(i) >= tokens.size();
    engine::GeneratedToken generated{script_done ? 0 : tokens[i], logprob_at(i), {}, false};
    if (options_.end_of_generation_at == i || script_done) {
      generated.token = options_.end_of_generation_token;
      generated.end_of_generation = true;
    }
    for (int k = 0; k < request.top_logprobs; ++k) {
      generated.top.push_back(
          {k == 0 ? generated.token : options_.vocabulary[k % options_.vocabulary.size()],
           logprob_at(i) - float(k)});
    }
    if (!callbacks.on_token(generated)) {
      {
        std::lock_guard lock(mutex_);
        ++refusals_;
      }
      refused_.notify_all();
      callbacks.on_finish(engine::FinishReason::Cancelled, {});
      return;
    }
    if (generated.end_of_generation) {
      callbacks.on_finish(engine::FinishReason::Stop, {});
      return;
    }
  }
  callbacks.on_finish(engine::FinishReason::Length, {});
}

}  // namespace strata::api::testing
