#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "engine/local_stage.h"
#include "sampling/sampler.h"

namespace strata::engine {

namespace {

// Layers of one sequence whose state moves at the same time.
constexpr size_t kConcurrentLayerMoves = 8;

// Blocks that `positions` positions take in a stage's pool.
int blocks_for(int positions) { return (positions + model::kKvBlock - 1) / model::kKvBlock; }

int default_threads(int threads) {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// A grammar's masks for a step's drafts, after the first row's in `allowed`: the drafts kept up
// to the first the grammar refuses, each followed by the mask of the row after it, as the
// grammar stands there. The matcher is left where it stood. A draft whose mask cannot be
// computed ends the drafts; the request meets that error at its next step, not here.
void mask_drafts(constrain::Matcher& matcher, std::vector<Token>& drafts, std::vector<uint8_t>& allowed) {
  const constrain::Matcher::Position start = matcher.position();
  size_t kept = 0;
  try {
    for (; kept < drafts.size() && matcher.accept_token(drafts[kept]); ++kept) {
      const std::vector<uint8_t>& next = matcher.allowed_tokens();
      allowed.insert(allowed.end(), next.begin(), next.end());
    }
  } catch (const std::exception&) {
  }
  drafts.resize(kept);
  matcher.go_back(start);
}

// The request's grammar, past the tokens it had generated before it resumed here.
std::unique_ptr<constrain::Matcher> start_matcher(const GenerationRequest& request,
                                                  const std::shared_ptr<const constrain::Vocabulary>& vocabulary,
                                                  int vocab_size) {
  if (request.grammar.empty()) return nullptr;
  if (!vocabulary || vocabulary->size() != vocab_size) {
    throw std::invalid_argument("this scheduler cannot constrain output: it has no vocabulary for the model");
  }
  auto matcher = std::make_unique<constrain::Matcher>(constrain::parse_gbnf(request.grammar), vocabulary);
  for (auto t = request.prompt.end() - request.resumed_after; t != request.prompt.end(); ++t) {
    if (!matcher->accept_token(*t)) throw std::invalid_argument("the tokens a resumed request generated do not follow its grammar");
  }
  return matcher;
}

EngineOptions with_model_context(EngineOptions options, const model::Model& model) {
  if (options.context_size <= 0) options.context_size = model.config().context_length;
  options.embedding_dim = model.config().embedding_dim;
  options.sliding_window = model.config().sliding_window;
  return options;
}

}  // namespace

struct Engine::Sequence {
  Sequence(SequenceId id, GenerationRequest r, RequestCallbacks c, int vocab_size, int capacity,
           std::unique_ptr<constrain::Matcher> matcher)
      : id(id),
        request(std::move(r)),
        callbacks(std::move(c)),
        sampler(request.sampling, vocab_size),
        matcher(std::move(matcher)),
        history(request.prompt),
        capacity(capacity) {
    sampler.skip(request.resumed_after);
  }

  // Inputs not yet through the pipeline: the prompt's rest, or the last sampled token.
  int pending() const { return static_cast<int>(history.size()) - fed; }
  // Its stages hold nothing for it (released, or on a pipeline replaced): its next batch
  // computes it again from its prompt and the tokens it has generated, with the same sampler,
  // so that what follows is the same.
  void compute_again() {
    fed = 0;
    held_to = 0;
    drafts_past_fed = 0;
    launched = false;
    pooled.clear();
  }
  bool embeds() const { return request.embedding != model::Pooling::None; }
  // An embedding takes the rows of this step's `count` inputs, the first at position `first`:
  // a mean adds each (in position order, however the prompt was cut into steps), cls keeps
  // position 0's and last the prompt's last.
  void pool_rows(const float* rows, int count, int first, size_t dim) {
    pooled.resize(dim, 0.0);
    const auto keep = [&](int r) { std::copy_n(rows + static_cast<size_t>(r) * dim, dim, pooled.begin()); };
    switch (request.embedding) {
      case model::Pooling::Mean:
        for (int r = 0; r < count; ++r) {
          for (size_t i = 0; i < dim; ++i) pooled[i] += rows[static_cast<size_t>(r) * dim + i];
        }
        break;
      case model::Pooling::Cls:
        if (first == 0) keep(0);
        break;
      case model::Pooling::Last:
        if (first + count == static_cast<int>(history.size())) keep(count - 1);
        break;
      default:
        break;
    }
  }
  std::vector<float> embedding() const {
    const double scale = request.embedding == model::Pooling::Mean ? 1.0 / static_cast<double>(history.size()) : 1.0;
    std::vector<float> out(pooled.size());
    for (size_t i = 0; i < pooled.size(); ++i) out[i] = static_cast<float>(pooled[i] * scale);
    return out;
  }

  SequenceId id;
  GenerationRequest request;
  RequestCallbacks callbacks;
  sampling::Sampler sampler;
  std::unique_ptr<constrain::Matcher> matcher;  // the request's grammar, if it has one
  std::vector<Token> history;  // prompt, then generated tokens
  int capacity;
  int fed = 0;  // inputs whose keys and values the stages hold
  // Positions the stages hold, or will once its batch in flight is through: `fed`, or more
  // while they hold drafts.
  int held_to = 0;
  // Positions past `fed` that the stages hold: the drafts that the last step did not confirm,
  // which its next batch drops (SequenceWork::rewind).
  int drafts_past_fed = 0;
  std::unique_ptr<Drafter::State> drafting;  // the drafter's, once it has drafted for it
  // How many drafts its next step may take, as its drafts have fared (4 to begin with; see
  // complete), and steps to go without drafts after a step that confirmed none.
  int draft_limit = 4;
  int draft_pause = 0;
  int draft_misses = 0;
  int drafts_accepted = 0;
  int drafts_rejected = 0;
  int generated = 0;
  std::optional<int> cached_tokens;  // of the prompt, taken from the stages' caches at its first start
  bool resumed = request.resumed_after > 0 || request.held.has_value();  // until its first start
  bool launched = false;  // the stages may hold state for it
  bool left_queue = false;  // its on_started has run
  bool in_flight = false;
  bool finished = false;
  std::vector<double> pooled;  // an embedding's rows so far: their sum (Mean) or the one taken
};

Engine::Engine(std::shared_ptr<model::Model> model, std::function<bool(Token)> is_end_of_generation,
               EngineOptions options)
    : own_pool_(std::make_unique<tensor::ThreadPool>(default_threads(options.threads))),
      vocab_size_(model->config().vocab_size),
      is_end_of_generation_(std::move(is_end_of_generation)),
      options_(with_model_context(options, *model)) {
  const model::Config& config = model->config();
  const KvOptions kv{options_.kv_type,
                     kv_pool_blocks(config, {0, config.layer_count}, options_.kv_type, options_.kv_memory,
                                    options_.context_size, options_.max_parallel, options_.step_inputs())};
  start({std::make_shared<LocalStage>(std::move(model), *own_pool_, kv)});
}

Engine::Engine(std::vector<std::shared_ptr<Stage>> stages, int vocab_size,
               std::function<bool(Token)> is_end_of_generation, EngineOptions options)
    : vocab_size_(vocab_size), is_end_of_generation_(std::move(is_end_of_generation)), options_(options) {
  if (options_.context_size <= 0) throw std::invalid_argument("a pipeline engine needs a context size");
  start(std::move(stages));
}

void Engine::start(std::vector<std::shared_ptr<Stage>> stages) {
  if (stages.empty()) throw std::invalid_argument("a pipeline needs at least one stage");
  pipeline_ = make_pipeline(std::move(stages));
  next_sequence_id_ = std::max<SequenceId>(1, options_.first_sequence_id);
  options_.max_parallel = std::max(1, options_.max_parallel);
  options_.max_queued = std::max(0, options_.max_queued);
  options_.prefill_chunk = std::max(1, options_.prefill_chunk);
  loop_ = std::thread([this] { run_loop(); });
}

std::unique_ptr<Pipeline> Engine::make_pipeline(std::vector<std::shared_ptr<Stage>> stages) {
  return std::make_unique<Pipeline>(std::move(stages), [this](Pipeline::Result r) {
    {
      std::lock_guard lock(mutex_);
      results_.push_back(std::move(r));
    }
    wake_.notify_one();
  });
}

Engine::~Engine() { shutdown(); }

void Engine::replace_pipeline(std::vector<std::shared_ptr<Stage>> stages, bool hand_over) {
  if (stages.empty()) throw std::invalid_argument("a pipeline needs at least one stage");
  {
    std::lock_guard lock(mutex_);
    next_pipeline_ = NextPipeline{std::move(stages), hand_over};
  }
  wake_.notify_one();
}

Engine::SwitchCounts Engine::switch_counts() const { return {handed_over_.load(), recomputed_.load()}; }

uint64_t Engine::preemptions() const { return preemptions_.load(); }

Engine::SpeculationCounts Engine::speculation() const {
  return {speculative_steps_.load(), drafted_.load(), accepted_.load()};
}

Engine::Load Engine::load() {
  std::lock_guard lock(mutex_);
  return {static_cast<int>(queue_.size()), running_};
}

bool Engine::move_state(const std::vector<std::shared_ptr<Stage>>& from, SequenceId from_id, int positions,
                        const std::vector<std::shared_ptr<Stage>>& to, const Sequence& seq) {
  struct Move {
    Stage* from;
    Stage* to;
    int layer;
  };
  std::vector<Move> moves;
  for (const auto& stage : to) {
    const StageLayers layers = stage->layers();
    if (layers.first >= layers.last) return false;
    for (int layer = layers.first; layer < layers.last; ++layer) {
      const auto holder =
          std::find_if(from.begin(), from.end(), [&](const auto& old) { return old->layers().contains(layer); });
      if (holder == from.end()) return false;
      moves.push_back({holder->get(), stage.get(), layer});
    }
  }
  // Layers move concurrently: each is a call to the stage that holds it and one to the stage
  // that takes it, mostly waiting on the network.
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const auto mover = [&] {
    for (size_t i = next++; i < moves.size() && !failed; i = next++) {
      try {
        LayerKv kv = moves[i].from->read_kv(from_id, moves[i].layer);
        if (kv.positions < positions) {
          failed = true;
          return;
        }
        if (kv.positions > positions) {  // drafts not confirmed: rows of positions, in order
          kv.keys.bytes.resize(kv.keys.bytes.size() / static_cast<size_t>(kv.positions) * static_cast<size_t>(positions));
          kv.values.bytes.resize(kv.values.bytes.size() / static_cast<size_t>(kv.positions) *
                                 static_cast<size_t>(positions));
          if (!kv.tokens.empty()) kv.tokens.resize(static_cast<size_t>(positions));
          kv.positions = positions;
        }
        kv.id = seq.id;
        kv.capacity = seq.capacity;
        moves[i].to->write_kv(kv);
      } catch (const std::exception&) {
        failed = true;  // a stage gone, or state it does not hold: the sequence is computed again
      }
    }
  };
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < std::min(moves.size(), kConcurrentLayerMoves); ++i) helpers.emplace_back(mover);
  mover();
  for (std::thread& helper : helpers) helper.join();
  return !failed;
}

bool Engine::take_over_held(Sequence& seq) {
  if (!seq.request.held) return false;
  const HeldState held = *seq.request.held;
  seq.request.held.reset();
  std::vector<std::shared_ptr<Stage>> from;
  try {
    if (options_.held_stages) from = options_.held_stages(held.pipeline);
  } catch (const std::exception&) {
  }
  // The last input is always computed here, for the logits that sample the next token.
  const bool usable = held.positions > 0 && static_cast<size_t>(held.positions) < seq.history.size();
  const bool moved = !from.empty() && usable && move_state(from, held.sequence, held.positions, pipeline_->stages(), seq);
  // Moved or not, the old stages' copy is of no more use.
  const SequenceId old_id[] = {held.sequence};
  for (const auto& stage : from) {
    try {
      stage->release(old_id);
    } catch (const std::exception&) {
    }
  }
  if (moved) {
    seq.fed = seq.held_to = held.positions;
    return true;
  }
  const SequenceId id[] = {seq.id};
  for (const auto& stage : pipeline_->stages()) {
    try {
      stage->release(id);  // what the failed move left there
    } catch (const std::exception&) {
    }
  }
  return false;
}

void Engine::switch_pipeline(std::vector<std::unique_ptr<Sequence>>& active, NextPipeline next) {
  // Only between steps: with nothing in flight every stage holds each sequence's `fed` inputs.
  const bool handing_over = next.hand_over && !broken_ && in_flight_.empty();
  std::vector<SequenceId> held_there;  // what the old stages hold and no longer need
  for (auto& seq : active) {
    if (!seq->launched) continue;
    held_there.push_back(seq->id);
    if (seq->fed == 0) continue;
    if (handing_over) {
      if (move_state(pipeline_->stages(), seq->id, seq->fed, next.stages, *seq)) {
        seq->held_to = seq->fed;  // without the drafts the old stages held past it
        seq->drafts_past_fed = 0;
        ++handed_over_;
        continue;
      }
      const SequenceId id[] = {seq->id};
      for (const auto& stage : next.stages) {
        try {
          stage->release(id);  // what the failed hand-over left there
        } catch (const std::exception&) {
        }
      }
    }
    seq->compute_again();
    ++recomputed_;
  }
  // Moved or to be computed again, the old stages' copies are of no more use. The old pipeline
  // releases them as it ends, after the batches it is computing, which it waits for; their
  // results are dropped below.
  pipeline_->end(std::move(held_there));
  pipeline_.reset();
  in_flight_.clear();
  {
    std::lock_guard lock(mutex_);
    results_.clear();
  }
  for (auto& seq : active) seq->in_flight = false;
  broken_ = false;
  pipeline_ = make_pipeline(std::move(next.stages));
  probe_pool_blocks();
}

void Engine::probe_pool_blocks() {
  model::KvBlockCounts smallest;
  const auto least = [](int pool, int stage) { return pool == 0 ? stage : stage == 0 ? pool : std::min(pool, stage); };
  for (const auto& stage : pipeline_->stages()) {
    try {
      const model::KvBlockCounts blocks = stage->kv_blocks();
      smallest = {least(smallest.full, blocks.full), least(smallest.window, blocks.window)};
    } catch (const std::exception&) {
      // Its batches will say what is wrong with it; admission goes without until it answers.
      pool_blocks_.reset();
      next_pool_probe_ = std::chrono::steady_clock::now() + kPoolProbeRetry;
      return;
    }
  }
  pool_blocks_ = smallest;
}

void Engine::start_sequence(Sequence& seq) {
  seq.launched = true;
  if (!seq.left_queue) {
    seq.left_queue = true;
    if (seq.callbacks.on_started) seq.callbacks.on_started();
  }
  if (seq.resumed) {
    // Another scheduler ran it part-way: a switch of pipelines like any other.
    seq.resumed = false;
    if (take_over_held(seq)) {
      ++handed_over_;
      return;
    }
    ++recomputed_;
  }
  // The last prompt token is always computed, for its logits: so is the block it ends. An
  // embedding pooled over more than the last row computes every row.
  const bool every_row = seq.embeds() && seq.request.embedding != model::Pooling::Last;
  const size_t lookup =
      options_.prefix_cache && !every_row ? (seq.history.size() - 1) / model::kKvBlock * model::kKvBlock : 0;
  int held = 0;
  if (lookup > 0) {
    held = static_cast<int>(lookup);
    const std::span<const Token> prefix(seq.history.data(), lookup);
    // Each stage is asked only for what the ones before it hold; once one holds nothing, the
    // rest start the sequence at position 0 with its first batch. A stage that holds more
    // than the least is asked again for that: its sliding-window layers may lack the window
    // of a shorter prefix, and then it holds less still, which the others are asked for.
    const auto& stages = pipeline_->stages();
    std::vector<int> holds(stages.size(), -1);
    while (held > 0) {
      for (size_t i = 0; i < stages.size() && held > 0; ++i) {
        if (holds[i] == held) continue;
        try {
          holds[i] = stages[i]->hold_prefix(seq.id, seq.capacity, prefix.first(static_cast<size_t>(held)));
        } catch (const std::exception&) {
          holds[i] = 0;  // its batch will meet the same trouble and report it
        }
        held = std::min(held, holds[i]);
      }
      if (std::all_of(holds.begin(), holds.end(), [&](int h) { return h == held; })) break;
    }
  }
  seq.fed = seq.held_to = held;
  if (!seq.cached_tokens) seq.cached_tokens = held;
}

ModelLimits Engine::limits() const {
  return {options_.context_size, options_.max_parallel, options_.max_queued};
}

bool Engine::submit(GenerationRequest request, RequestCallbacks callbacks) {
  if (request.prompt.empty()) throw std::invalid_argument("the prompt has no tokens");
  for (Token t : request.prompt) {
    if (t < 0 || t >= vocab_size_) throw std::invalid_argument("prompt token " + std::to_string(t) + " is outside the vocabulary");
  }
  const bool embeds = request.embedding != model::Pooling::None;
  if (embeds) {
    if (options_.embedding_dim <= 0) throw std::invalid_argument("this engine makes no embeddings");
    if (request.embedding == model::Pooling::Rank) {
      throw std::invalid_argument("rank pooling scores documents; it makes no embedding");
    }
    if (!request.grammar.empty() || request.resumed_after > 0) {
      throw std::invalid_argument("an embedding request generates nothing: no grammar, nothing to resume");
    }
    // Of the prompt's rows only those computed here are pooled: a held state would skip some.
    if (request.embedding != model::Pooling::Last) request.held.reset();
  } else if (request.max_tokens < 1) {
    throw std::invalid_argument("max_tokens must be at least 1");
  }
  if (request.resumed_after < 0 || static_cast<size_t>(request.resumed_after) >= request.prompt.size()) {
    throw std::invalid_argument("a resumed request must keep some of its prompt");
  }
  const long long needed = static_cast<long long>(request.prompt.size()) + (embeds ? 0 : request.max_tokens);
  if (needed > options_.context_size) {
    throw std::invalid_argument("this model's context is " + std::to_string(options_.context_size) +
                                " tokens, but the request needs " + std::to_string(needed) + " (" +
                                std::to_string(request.prompt.size()) + " in the prompt" +
                                (embeds ? std::string(")") : " + " + std::to_string(request.max_tokens) + " to generate)"));
  }
  request.top_logprobs = std::clamp(request.top_logprobs, 0, kMaxTopLogprobs);
  std::unique_ptr<constrain::Matcher> matcher = start_matcher(request, options_.vocabulary, vocab_size_);
  std::vector<std::unique_ptr<Sequence>> cancelled;
  bool accepted = false;
  {
    std::lock_guard lock(mutex_);
    cancelled = take_cancelled();
    const int waiting_or_running = static_cast<int>(queue_.size()) + running_;
    accepted = !stopping_ && waiting_or_running < options_.max_queued + options_.max_parallel;
    if (accepted) {
      queue_.push_back(std::make_unique<Sequence>(0, std::move(request), std::move(callbacks), vocab_size_,
                                                  static_cast<int>(needed), std::move(matcher)));
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

void Engine::shutdown() { stop(FinishReason::Cancelled, {}, std::nullopt); }

void Engine::abort(FinishReason reason, const std::string& why) { stop(reason, why, std::nullopt); }

void Engine::pass_on(uint64_t pipeline, const std::string& why) { stop(FinishReason::Lost, why, pipeline); }

void Engine::stop(FinishReason reason, const std::string& why, std::optional<uint64_t> passing_on) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      abort_reason_ = why;
      abort_finish_ = reason;
      passing_on_ = passing_on;
    }
  }
  wake_.notify_all();
  if (loop_.joinable()) loop_.join();
  pipeline_.reset();
}

void Engine::finish(Sequence& seq, FinishReason reason, const std::string& error) {
  seq.finished = true;
  release_state(seq);
  if (seq.callbacks.on_finish) seq.callbacks.on_finish(reason, error);
}

void Engine::release_state(Sequence& seq) {
  if (!seq.launched) return;
  pipeline_->release({seq.id});
  if (!in_flight_.empty()) releasing_.push_back({next_ticket_, blocks_needed(seq)});
  seq.compute_again();
}

model::KvBlockCounts Engine::blocks_needed(const Sequence& seq) const {
  // Its stages hold these once it has fed all it has (a batch in flight included): the
  // positions its next step reaches, or, while it prefills, the whole prompt's; or more while
  // they hold drafts past them.
  return blocks_for_positions(std::max(static_cast<int>(seq.history.size()), seq.held_to));
}

model::KvBlockCounts Engine::blocks_for_positions(int positions) const {
  return {blocks_for(positions),
          options_.sliding_window > 0 ? model::window_blocks_needed(options_.sliding_window, positions, options_.step_inputs()) : 0};
}

model::KvBlockCounts Engine::blocks_needed(const std::vector<std::unique_ptr<Sequence>>& active) const {
  model::KvBlockCounts blocks;
  for (const auto& seq : active) blocks += blocks_needed(*seq);
  return blocks;
}

bool Engine::released_everywhere(const Releasing& r) const {
  const uint64_t oldest_in_flight = in_flight_.empty() ? next_ticket_ : in_flight_.begin()->first;
  return r.next_ticket <= oldest_in_flight;
}

model::KvBlockCounts Engine::blocks_releasing() const {
  model::KvBlockCounts blocks;
  for (const Releasing& r : releasing_) blocks += r.blocks;  // pruned as the batches before them return
  return blocks;
}

bool Engine::room_for(const std::vector<std::unique_ptr<Sequence>>& active, model::KvBlockCounts more) const {
  if (!pool_blocks_) return true;
  more += blocks_needed(active);
  more += blocks_releasing();
  return more.fit_in(*pool_blocks_);
}

void Engine::make_room(std::vector<std::unique_ptr<Sequence>>& active) {
  if (!pool_blocks_) return;
  const model::KvBlockCounts pool = *pool_blocks_;
  // Pre-empted, such a sequence would come back to the same want of room.
  for (auto& seq : active) {
    if (seq->in_flight || blocks_needed(*seq).fit_in(pool)) continue;
    const std::string after =
        seq->generated > 0 ? " after " + std::to_string(seq->generated) + " generated tokens" : std::string();
    const bool window_short = model::KvBlockCounts{blocks_needed(*seq).full, 0}.fit_in(pool);
    finish(*seq, FinishReason::Error,
           "the request needs " + std::to_string(seq->history.size()) + " positions of KV memory" + after +
               (window_short ? ", but a stage's pool of sliding-window layers holds " +
                                   std::to_string(pool.window * model::kKvBlock) + " positions, less than a window and a step"
                             : ", but a stage's pool holds " + std::to_string(pool.full * model::kKvBlock)));
  }
  std::erase_if(active, [](const std::unique_ptr<Sequence>& s) { return s->finished; });
  // The sequences in flight fit: they did when launched, and grow only once back.
  std::vector<std::unique_ptr<Sequence>> preempted;  // newest first
  model::KvBlockCounts needed = blocks_needed(active);
  for (size_t i = active.size(); !needed.fit_in(pool) && i-- > 0;) {
    if (active[i]->in_flight) continue;
    const model::KvBlockCounts own = blocks_needed(*active[i]);
    needed = {needed.full - own.full, needed.window - own.window};
    if (active[i]->launched) ++preemptions_;  // not one admitted in this round, before others grew
    release_state(*active[i]);
    preempted.push_back(std::move(active[i]));
  }
  if (preempted.empty()) return;
  std::erase(active, nullptr);
  std::lock_guard lock(mutex_);
  // Oldest first, ahead of every request that waits: the room that returns goes to them.
  for (auto& seq : preempted) queue_.push_front(std::move(seq));
  running_ = static_cast<int>(active.size());
}

void Engine::run_loop() {
  std::vector<std::unique_ptr<Sequence>> active;
  while (true) {
    // Not while a stage is lost: a probe of a silent node would hold the loop for its deadline.
    if (!pool_blocks_ && !broken_ && std::chrono::steady_clock::now() >= next_pool_probe_) probe_pool_blocks();
    // The queue's head fits in the pools beside the admitted sequences (or never will:
    // then it is admitted to fail).
    const auto head_fits = [&] {
      const model::KvBlockCounts need = blocks_needed(*queue_.front());
      return room_for(active, need) || !need.fit_in(pool_blocks_.value_or(model::KvBlockCounts{}));
    };
    std::deque<Pipeline::Result> results;
    std::vector<std::unique_ptr<Sequence>> cancelled;
    std::optional<NextPipeline> next;
    bool waited_too_long = false;
    bool switch_pending = false;  // a hand-over or a pass-on waits for the batches in flight: launch none
    {
      std::unique_lock lock(mutex_);
      // A hand-over waits for the old pipeline's batches, unless they are lost anyway.
      const auto switch_ready = [&] {
        return !stopping_ && next_pipeline_ && (!next_pipeline_->hand_over || in_flight_.empty() || broken_);
      };
      // A pass-on lets the batches in flight finish first, unless they are lost anyway.
      const auto ending = [&] { return stopping_ && (!passing_on_ || in_flight_.empty() || broken_); };
      const auto can_launch = [&] {
        if (stopping_ || broken_ || next_pipeline_ || static_cast<int>(in_flight_.size()) >= pipeline_->depth()) {
          return false;
        }
        if (!queue_.empty() && static_cast<int>(active.size()) < options_.max_parallel && head_fits()) return true;
        const bool may_start = room_for(active, {});
        return std::any_of(active.begin(), active.end(),
                           [&](const auto& s) { return !s->in_flight && (s->launched || may_start); });
      };
      const auto woken = [&] { return ending() || switch_ready() || !results_.empty() || can_launch(); };
      if (broken_) {
        // No step ends while the pipeline is broken: the loop looks for requests cancelled
        // meanwhile every kCancelCheck, so that they end now rather than after the pause.
        const auto give_up_at = broken_since_ + options_.replay_wait;
        const bool woke = wake_.wait_until(lock, std::min(give_up_at, std::chrono::steady_clock::now() + kCancelCheck), woken);
        waited_too_long = !woke && std::chrono::steady_clock::now() >= give_up_at;
      } else {
        wake_.wait(lock, woken);
      }
      if (ending()) {
        for (auto& seq : queue_) active.push_back(std::move(seq));
        queue_.clear();
        lock.unlock();
        end_all(active);
        return;
      }
      if (switch_ready()) next.swap(next_pipeline_);
      switch_pending = stopping_ || next_pipeline_.has_value();
      cancelled = take_cancelled();
      while (!stopping_ && !queue_.empty() && static_cast<int>(active.size()) < options_.max_parallel && head_fits()) {
        active.push_back(std::move(queue_.front()));
        active.back()->id = next_sequence_id_++;
        queue_.pop_front();
      }
      results.swap(results_);
      running_ = static_cast<int>(active.size());
    }
    finish_cancelled(std::move(cancelled));
    // Running requests cancelled meanwhile end between their steps: before a switch (so that
    // they are not computed again) and before the next launch.
    const auto finish_cancelled_running = [&] {
      for (auto& seq : active) {
        if (!seq->finished && !seq->in_flight && seq->callbacks.cancelled && seq->callbacks.cancelled()) {
          finish(*seq, FinishReason::Cancelled);
        }
      }
      std::erase_if(active, [](const std::unique_ptr<Sequence>& s) { return s->finished; });
    };
    if (next) {
      finish_cancelled_running();
      results.clear();
      switch_pipeline(active, std::move(*next));
    }
    for (Pipeline::Result& result : results) {
      auto batch = in_flight_.extract(result.ticket);
      if (batch.empty()) continue;  // of a pipeline that was replaced
      if (result.lost && options_.replay_wait.count() > 0) {
        // Kept for the next pipeline, which computes them again from their tokens.
        for (Sequence* seq : batch.mapped().owners) seq->in_flight = false;
        if (!broken_) {
          broken_ = true;
          broken_since_ = std::chrono::steady_clock::now();
          broken_error_ = result.error;
        }
        continue;
      }
      complete(batch.mapped(), result);
    }
    std::erase_if(releasing_, [&](const Releasing& r) { return released_everywhere(r); });
    if (waited_too_long) {
      for (auto& seq : active) {
        if (!seq->finished && !seq->in_flight) {
          finish(*seq, FinishReason::Error, broken_error_ + " (no new pipeline within the wait)");
        }
      }
      broken_since_ = std::chrono::steady_clock::now();
    }
    finish_cancelled_running();
    if (!broken_ && !switch_pending && static_cast<int>(in_flight_.size()) < pipeline_->depth()) {
      make_room(active);
      while (static_cast<int>(in_flight_.size()) < pipeline_->depth() && launch_batch(active)) {
      }
    }
    std::lock_guard lock(mutex_);
    running_ = static_cast<int>(active.size());
  }
}

void Engine::end_all(std::vector<std::unique_ptr<Sequence>>& active) {
  for (auto& seq : active) {
    if (seq->finished) continue;
    // With nothing in flight every stage holds the sequence's `fed` inputs.
    if (passing_on_ && !broken_ && !seq->in_flight && seq->launched && seq->fed > 0 && seq->callbacks.on_passed_on) {
      seq->finished = true;
      seq->callbacks.on_passed_on({*passing_on_, seq->id, seq->fed});
    } else if (abort_reason_.empty()) {
      finish(*seq, FinishReason::Cancelled, "the server is shutting down");
    } else {
      finish(*seq, abort_finish_, abort_reason_);
    }
  }
}

bool Engine::launch_batch(const std::vector<std::unique_ptr<Sequence>>& active) {
  const bool may_start = room_for(active, {});
  // Up to an even share of the sequences per batch, so that every stage gets a group.
  const int depth = pipeline_->depth();
  const size_t share = (active.size() + static_cast<size_t>(depth) - 1) / static_cast<size_t>(depth);
  StageBatch batch;
  InFlight flight;
  int prefill_budget = options_.prefill_chunk;
  // Drafts go to a batch of at most options_.drafting_sequences decoding sequences, within
  // draft_max + 1 decoding rows: a step of a few rows costs little more than one, but one of
  // many sequences is bound by compute already (on a CPU 4 rows cost 1.4 of one, 8 cost 2.5),
  // where a draft costs about what it may save.
  const size_t decoding = std::min<size_t>(share, static_cast<size_t>(std::count_if(
                                                      active.begin(), active.end(), [](const auto& s) {
                                                        return !s->in_flight && !s->finished && s->launched &&
                                                               s->pending() == 1;
                                                      })));
  int draft_budget =
      decoding > static_cast<size_t>(options_.drafting_sequences)
          ? 0
          : std::max(0, options_.draft_max + 1 - static_cast<int>(decoding));
  for (const auto& seq : active) {
    if (seq->in_flight || seq->finished || flight.owners.size() >= share) continue;
    if (!seq->launched) {
      if (!may_start) continue;
      start_sequence(*seq);
    }
    int count = seq->pending();
    if (count > 1) {
      count = std::min(count, prefill_budget);
      if (count == 0) continue;
      prefill_budget -= count;
    }
    const auto from = seq->history.begin() + seq->fed;
    batch.tokens.insert(batch.tokens.end(), from, from + count);
    SequenceWork work{seq->id, seq->fed, count, seq->capacity};
    if (seq->drafts_past_fed > 0) {
      work.rewind = true;  // the stages drop the drafts the last step did not confirm
      seq->drafts_past_fed = 0;
    }
    std::vector<Token> drafts;
    if (seq->embeds()) {
      work.output = SequenceWork::Output::Embeddings;
    } else if (count < seq->pending()) {
      work.output = SequenceWork::Output::Nothing;
    } else {
      // The step's inputs as they are now: the sampler moves on only once its token is back,
      // so a batch lost on the way is sent again with the same step.
      const std::span<const uint8_t> allowed =
          seq->matcher ? std::span<const uint8_t>(seq->matcher->allowed_tokens()) : std::span<const uint8_t>();
      work.sampling = seq->sampler.step(seq->history, allowed, seq->request.logprobs ? seq->request.top_logprobs : -1);
      if (count == 1 && draft_budget > 0) drafts = drafts_for(*seq, active, draft_budget);
      if (!drafts.empty() && seq->matcher) mask_drafts(*seq->matcher, drafts, work.sampling->allowed);
      if (!drafts.empty()) {
        draft_budget -= static_cast<int>(drafts.size());
        batch.tokens.insert(batch.tokens.end(), drafts.begin(), drafts.end());
        count += static_cast<int>(drafts.size());
        work.token_count = count;
        work.sampling->drafts = static_cast<int>(drafts.size());
      }
    }
    batch.sequences.push_back(std::move(work));
    flight.owners.push_back(seq.get());
    flight.counts.push_back(count);
    flight.drafts.push_back(std::move(drafts));
    seq->held_to = seq->fed + count;
    seq->in_flight = true;
  }
  if (flight.owners.empty()) return false;
  const uint64_t ticket = next_ticket_++;
  in_flight_.emplace(ticket, std::move(flight));
  pipeline_->submit(ticket, std::move(batch));
  return true;
}

std::vector<Token> Engine::drafts_for(Sequence& seq, const std::vector<std::unique_ptr<Sequence>>& active, int budget) {
  if (!options_.drafter) return {};
  if (seq.draft_pause > 0) {
    --seq.draft_pause;
    return {};
  }
  // Every token chosen can be used: at most max_tokens in all, one more than the drafts.
  int most = std::min({budget, seq.draft_limit, seq.request.max_tokens - seq.generated - 1});
  if (most <= 0) return {};
  std::vector<Token> drafts;
  try {
    if (!seq.drafting) seq.drafting = options_.drafter->start();
    drafts = options_.drafter->draft(seq.drafting.get(), seq.history, most);
  } catch (const std::exception&) {
    // A drafter that fails (a draft model's pool without room) costs the sequence its drafts
    // this step, never its request: its state goes, to start afresh.
    seq.drafting.reset();
    return {};
  }
  if (drafts.size() > static_cast<size_t>(most)) drafts.resize(static_cast<size_t>(most));
  const auto outside = std::find_if(drafts.begin(), drafts.end(), [&](Token t) { return t < 0 || t >= vocab_size_; });
  drafts.erase(outside, drafts.end());  // none, from a sound drafter
  // Only into room the pools have beside the running sequences: drafts never pre-empt.
  const model::KvBlockCounts now = blocks_needed(seq);
  while (!drafts.empty()) {
    const model::KvBlockCounts with = blocks_for_positions(static_cast<int>(seq.history.size() + drafts.size()));
    if (room_for(active, {with.full - now.full, with.window - now.window})) break;
    drafts.pop_back();
  }
  return drafts;
}

void Engine::complete(const InFlight& batch, const Pipeline::Result& result) {
  const std::vector<Sequence*>& owners = batch.owners;
  for (Sequence* seq : owners) seq->in_flight = false;
  if (!result.error.empty()) {
    for (Sequence* seq : owners) finish(*seq, FinishReason::Error, result.error);
    return;
  }
  const size_t dim = static_cast<size_t>(options_.embedding_dim);
  // Where each embedding's rows start; the owners whose step sampled (it fed their last
  // pending input, and its drafts) get a token each, and one more for each draft confirmed,
  // in batch order.
  std::vector<size_t> row_start(owners.size());
  size_t expected_rows = 0;
  std::vector<size_t> sampled;
  for (size_t i = 0; i < owners.size(); ++i) {
    row_start[i] = expected_rows;
    if (owners[i]->embeds()) {
      expected_rows += static_cast<size_t>(batch.counts[i]) * dim;
    } else if (batch.counts[i] - static_cast<int>(batch.drafts[i].size()) == owners[i]->pending()) {
      sampled.push_back(i);
    }
  }
  const StageOutput& output = result.output;
  const auto token_fits = [&](const sampling::Choice& c) { return c.token >= 0 && c.token < vocab_size_; };
  // Each choice but the last confirmed the draft after it: it equals that draft.
  const auto step_fits = [&](const Sampled& s, const std::vector<Token>& drafts) {
    if (!s.error.empty()) return true;
    if (!token_fits(s.choice) || s.continued.size() > drafts.size()) return false;
    for (size_t c = 0; c < s.continued.size(); ++c) {
      const sampling::Choice& before = c == 0 ? s.choice : s.continued[c - 1];
      if (before.token != drafts[c] || !token_fits(s.continued[c])) return false;
    }
    return true;
  };
  bool steps_fit = output.sampled.size() == sampled.size();
  for (size_t k = 0; steps_fit && k < sampled.size(); ++k) steps_fit = step_fits(output.sampled[k], batch.drafts[sampled[k]]);
  if (output.rows.size() != expected_rows || !steps_fit) {
    for (Sequence* seq : owners) finish(*seq, FinishReason::Error, "the pipeline returned a malformed step");
    return;
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    Sequence& seq = *owners[i];
    if (seq.embeds()) {
      seq.pool_rows(output.rows.data() + row_start[i], batch.counts[i], seq.fed, dim);
      seq.fed += batch.counts[i];
      if (seq.pending() == 0) {
        try {
          if (seq.callbacks.on_embedding) seq.callbacks.on_embedding(seq.embedding());
        } catch (const std::exception& e) {
          finish(seq, FinishReason::Error, std::string("embedding callback failed: ") + e.what());
          continue;
        }
        finish(seq, FinishReason::Stop);
      }
      continue;
    }
    seq.fed += batch.counts[i] - static_cast<int>(batch.drafts[i].size());
  }
  // One chosen token, as decoding one at a time takes it; false when the request ends there.
  const auto take = [&](Sequence& seq, const sampling::Choice& choice) {
    if (seq.matcher && !seq.matcher->accept_token(choice.token)) {
      finish(seq, FinishReason::Error, "the pipeline chose a token that the request's grammar does not allow");
      return false;
    }
    seq.sampler.skip(1);
    GeneratedToken out;
    out.token = choice.token;
    if (seq.request.logprobs) {
      out.logprob = choice.logprob;
      for (const auto& [id, logprob] : choice.top) out.top.push_back({id, logprob});
    }
    out.end_of_generation = is_end_of_generation_(out.token);
    out.cached_tokens = seq.cached_tokens.value_or(0);
    out.drafts_accepted = seq.drafts_accepted;
    out.drafts_rejected = seq.drafts_rejected;
    seq.history.push_back(out.token);
    ++seq.generated;
    bool keep_going = true;
    try {
      if (seq.callbacks.on_token) keep_going = seq.callbacks.on_token(out);
    } catch (const std::exception& e) {
      // A failing consumer ends its own request, never the loop that serves the others.
      finish(seq, FinishReason::Error, std::string("token callback failed: ") + e.what());
      return false;
    }
    if (out.end_of_generation) {
      finish(seq, FinishReason::Stop);
    } else if (!keep_going) {
      finish(seq, FinishReason::Cancelled);
    } else if (seq.matcher && seq.matcher->finished()) {
      finish(seq, FinishReason::Stop);
    } else if (seq.generated >= seq.request.max_tokens) {
      finish(seq, FinishReason::Length);
    }
    return !seq.finished;
  };
  for (size_t k = 0; k < sampled.size(); ++k) {
    Sequence& seq = *owners[sampled[k]];
    const Sampled& step = output.sampled[k];
    if (!step.error.empty()) {
      finish(seq, FinishReason::Error, step.error);
      continue;
    }
    // The stages hold the last token and every draft: those confirmed are the sequence's
    // inputs now, the rest go with its next batch.
    const std::vector<Token>& drafts = batch.drafts[sampled[k]];
    const size_t accepted = step.continued.size();
    seq.fed += static_cast<int>(accepted);
    seq.drafts_past_fed = static_cast<int>(drafts.size() - accepted);
    if (!drafts.empty()) {
      ++speculative_steps_;
      drafted_ += drafts.size();
      accepted_ += accepted;
      seq.drafts_accepted += static_cast<int>(accepted);
      seq.drafts_rejected += static_cast<int>(drafts.size() - accepted);
      // Each draft adds a row to the step, which costs (a step of 9 rows about 2.5 of one
      // on a CPU): a sequence takes up to twice the drafts after a step that confirmed them all, one
      // more than it confirmed after one that confirmed some, and after one that confirmed
      // none goes 1, 2, 4, ... up to 16 steps without (text that does not repeat itself then
      // costs a draft every 16 steps). A sequence whose drafts have mostly been right (a copy,
      // where a miss is an edit) keeps half its drafts after a miss and pauses none.
      const bool copying = seq.drafts_accepted > seq.drafts_rejected;
      if (accepted == drafts.size()) {
        seq.draft_limit = std::min(options_.draft_max, std::max(seq.draft_limit, 2 * static_cast<int>(drafts.size())));
        seq.draft_misses = 0;
      } else if (copying) {
        seq.draft_limit = std::max(static_cast<int>(accepted) + 1, seq.draft_limit / 2);
        seq.draft_misses = 0;
      } else if (accepted > 0) {
        seq.draft_limit = static_cast<int>(accepted) + 1;
        seq.draft_misses = 0;
      } else {
        seq.draft_limit = 1;
        seq.draft_pause = std::min(16, 1 << std::min(seq.draft_misses, 4));
        ++seq.draft_misses;
      }
    }
    // In order, as one step each would have given them; a request that ends on one (its end
    // of generation, max_tokens, a stop string) takes none after it.
    for (size_t c = 0; c <= accepted && take(seq, c == 0 ? step.choice : step.continued[c - 1]); ++c) {
    }
  }
}

}  // namespace strata::engine
