#include "engine/engine.h"

#include <algorithm>
#include <stdexcept>

#include "sampling/sampler.h"

namespace strata::engine {

struct Engine::Sequence {
  Sequence(GenerationRequest r, RequestCallbacks c, const model::Model& model, int capacity)
      : request(std::move(r)),
        callbacks(std::move(c)),
        kv(model.new_sequence(capacity)),
        sampler(request.sampling, model.config().vocab_size),
        history(request.prompt) {}

  bool prefilling() const { return prompt_done < request.prompt.size(); }

  GenerationRequest request;
  RequestCallbacks callbacks;
  std::unique_ptr<model::KvState> kv;
  sampling::Sampler sampler;
  std::vector<Token> history;  // prompt, then generated tokens
  size_t prompt_done = 0;
  int generated = 0;
  bool finished = false;
};

Engine::Engine(std::shared_ptr<model::Model> model, std::function<bool(Token)> is_end_of_generation,
               EngineOptions options)
    : model_(std::move(model)),
      is_end_of_generation_(std::move(is_end_of_generation)),
      options_(options),
      pool_(options.threads > 0 ? options.threads
                                : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
  if (options_.context_size <= 0) options_.context_size = model_->config().context_length;
  options_.max_parallel = std::max(1, options_.max_parallel);
  options_.max_queued = std::max(0, options_.max_queued);
  options_.prefill_chunk = std::max(1, options_.prefill_chunk);
  loop_ = std::thread([this] { run_loop(); });
}

Engine::~Engine() { shutdown(); }

ModelLimits Engine::limits() const {
  return {options_.context_size, options_.max_parallel, options_.max_queued};
}

bool Engine::submit(GenerationRequest request, RequestCallbacks callbacks) {
  const int vocab = model_->config().vocab_size;
  if (request.prompt.empty()) throw std::invalid_argument("the prompt has no tokens");
  for (Token t : request.prompt) {
    if (t < 0 || t >= vocab) throw std::invalid_argument("prompt token " + std::to_string(t) + " is outside the vocabulary");
  }
  if (request.max_tokens < 1) throw std::invalid_argument("max_tokens must be at least 1");
  const long long needed = static_cast<long long>(request.prompt.size()) + request.max_tokens;
  if (needed > options_.context_size) {
    throw std::invalid_argument("this model's context is " + std::to_string(options_.context_size) +
                                " tokens, but the request needs " + std::to_string(needed) + " (" +
                                std::to_string(request.prompt.size()) + " in the prompt + " +
                                std::to_string(request.max_tokens) + " to generate)");
  }
  request.top_logprobs = std::clamp(request.top_logprobs, 0, 20);
  std::vector<std::unique_ptr<Sequence>> cancelled;
  bool accepted = false;
  {
    std::lock_guard lock(mutex_);
    cancelled = take_cancelled();
    const int waiting_or_running = static_cast<int>(queue_.size()) + running_;
    accepted = !stopping_ && waiting_or_running < options_.max_queued + options_.max_parallel;
    if (accepted) {
      const int capacity = static_cast<int>(needed);
      queue_.push_back(std::make_unique<Sequence>(std::move(request), std::move(callbacks), *model_, capacity));
    }
  }
  finish_cancelled(std::move(cancelled));
  if (accepted) wake_.notify_one();
  return accepted;
}

std::vector<std::unique_ptr<Engine::Sequence>> Engine::take_cancelled() {
  std::vector<std::unique_ptr<Sequence>> cancelled;
  std::erase_if(queue_, [&](std::unique_ptr<Sequence>& seq) {
    if (!seq->callbacks.cancelled || !seq->callbacks.cancelled()) return false;
    cancelled.push_back(std::move(seq));
    return true;
  });
  return cancelled;
}

void Engine::finish_cancelled(std::vector<std::unique_ptr<Sequence>> cancelled) {
  for (auto& seq : cancelled) finish(*seq, FinishReason::Cancelled);
}

void Engine::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (loop_.joinable()) loop_.join();
}

void Engine::finish(Sequence& seq, FinishReason reason, const std::string& error) {
  seq.finished = true;
  seq.kv.reset();  // the sequence's state goes with it
  if (seq.callbacks.on_finish) seq.callbacks.on_finish(reason, error);
}

void Engine::run_loop() {
  std::vector<std::unique_ptr<Sequence>> active;
  while (true) {
    std::vector<std::unique_ptr<Sequence>> cancelled;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active.empty(); });
      if (stopping_) {
        for (auto& seq : queue_) active.push_back(std::move(seq));
        queue_.clear();
        lock.unlock();
        for (auto& seq : active) finish(*seq, FinishReason::Cancelled, "the server is shutting down");
        return;
      }
      cancelled = take_cancelled();
      while (!queue_.empty() && static_cast<int>(active.size()) < options_.max_parallel) {
        active.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      running_ = static_cast<int>(active.size());
    }
    finish_cancelled(std::move(cancelled));
    step(active);
    std::erase_if(active, [](const std::unique_ptr<Sequence>& s) { return s->finished; });
    std::lock_guard lock(mutex_);
    running_ = static_cast<int>(active.size());
  }
}

void Engine::step(std::vector<std::unique_ptr<Sequence>>& active) {
  std::vector<model::SequenceSlice> slices;
  std::vector<Sequence*> owners;
  std::vector<Token> tokens;
  int prefill_budget = options_.prefill_chunk;
  for (auto& seq : active) {
    int count = 1;
    if (seq->prefilling()) {
      const size_t left = seq->request.prompt.size() - seq->prompt_done;
      count = static_cast<int>(std::min<size_t>(left, static_cast<size_t>(prefill_budget)));
      if (count == 0) continue;
      prefill_budget -= count;
      const auto from = seq->request.prompt.begin() + static_cast<long>(seq->prompt_done);
      tokens.insert(tokens.end(), from, from + count);
    } else {
      tokens.push_back(seq->history.back());
    }
    slices.push_back({seq->kv.get(), count, false});
    owners.push_back(seq.get());
  }
  if (slices.empty()) return;

  std::vector<float> logits;
  try {
    logits = model_->forward(slices, tokens, {}, pool_);
  } catch (const std::exception& e) {
    for (Sequence* seq : owners) finish(*seq, FinishReason::Error, e.what());
    return;
  }

  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  std::vector<size_t> sampled;  // owners whose logits row yields a token this step
  for (size_t i = 0; i < owners.size(); ++i) {
    Sequence& seq = *owners[i];
    if (seq.prefilling()) {
      seq.prompt_done += static_cast<size_t>(slices[i].token_count);
      if (seq.prefilling()) continue;
    }
    sampled.push_back(i);
  }
  // Each sequence samples from its own logits with its own generator, so the sequences can
  // sample in parallel; the callbacks then run in order on this thread.
  std::vector<GeneratedToken> tokens_out(sampled.size());
  std::vector<std::string> errors(sampled.size());  // e.g. logits that are NaN
  pool_.parallel_for(static_cast<int64_t>(sampled.size()), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const size_t i = sampled[static_cast<size_t>(k)];
      Sequence& seq = *owners[i];
      const std::span<const float> row(logits.data() + i * vocab, vocab);
      GeneratedToken& out = tokens_out[static_cast<size_t>(k)];
      try {
        out.token = seq.sampler.sample(row, seq.history);
        if (seq.request.logprobs) {
          const sampling::Logprobs lp = sampling::logprobs(row, out.token, seq.request.top_logprobs);
          out.logprob = lp.chosen;
          for (const auto& [id, logprob] : lp.top) out.top.push_back({id, logprob});
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(k)] = std::string("sampling failed: ") + e.what();
      }
    }
  });
  for (size_t k = 0; k < sampled.size(); ++k) {
    Sequence& seq = *owners[sampled[k]];
    if (!errors[k].empty()) {
      finish(seq, FinishReason::Error, errors[k]);
      continue;
    }
    GeneratedToken& out = tokens_out[k];
    out.end_of_generation = is_end_of_generation_(out.token);
    seq.history.push_back(out.token);
    ++seq.generated;
    bool keep_going = true;
    try {
      if (seq.callbacks.on_token) keep_going = seq.callbacks.on_token(out);
    } catch (const std::exception& e) {
      // A failing consumer ends its own request, never the loop that serves the others.
      finish(seq, FinishReason::Error, std::string("token callback failed: ") + e.what());
      continue;
    }
    if (out.end_of_generation) {
      finish(seq, FinishReason::Stop);
    } else if (!keep_going) {
      finish(seq, FinishReason::Cancelled);
    } else if (seq.generated >= seq.request.max_tokens) {
      finish(seq, FinishReason::Length);
    }
  }
}

}  // namespace strata::engine
