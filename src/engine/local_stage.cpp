#include "engine/local_stage.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace strata::engine {

model::KvBlockCounts kv_pool_blocks(const model::Config& config, model::LayerRange range, model::KvType type,
                                    uint64_t bytes, int context, int sequences, int step_inputs) {
  int window_layers = 0;
  for (int l = range.first; l < range.last; ++l) window_layers += config.is_sliding(l) ? 1 : 0;
  const int full_layers = range.size() - window_layers;
  const auto clamp = [](uint64_t blocks) {
    return static_cast<int>(std::min<uint64_t>(blocks, static_cast<uint64_t>(std::numeric_limits<int>::max())));
  };
  const uint64_t slots = static_cast<uint64_t>(std::max(1, sequences));
  const uint64_t contexts = slots * static_cast<uint64_t>((int64_t{context} + model::kKvBlock - 1) / model::kKvBlock);
  const uint64_t windows =
      window_layers > 0 ? slots * static_cast<uint64_t>(model::window_blocks_needed(config.sliding_window, context, step_inputs)) : 0;
  if (bytes == 0) return {clamp(contexts), clamp(windows)};
  const uint64_t full_block = model::KvLayout(config, full_layers, type).block_bytes;
  const uint64_t window_block = model::KvLayout(config, window_layers, type).block_bytes;
  const uint64_t window_bytes =
      window_layers > 0 ? std::min(windows * window_block, bytes / static_cast<uint64_t>(range.size()) * window_layers) : 0;
  // A range of sliding-window layers alone keeps only the prefix index in its other pool,
  // whose blocks hold no data.
  return {clamp(full_block > 0 ? (bytes - window_bytes) / full_block : contexts),
          clamp(window_block > 0 ? window_bytes / window_block : 0)};
}

namespace {

model::SliceOutput slice_output(SequenceWork::Output output) {
  switch (output) {
    case SequenceWork::Output::Embeddings:
      return model::SliceOutput::AllEmbeddings;
    case SequenceWork::Output::Nothing:
      return model::SliceOutput::Nothing;
    default:
      return model::SliceOutput::LastLogits;
  }
}

metrics::Labels layer_labels(const model::Model& model) {
  return {{"layers", std::to_string(model.range().first) + "-" + std::to_string(model.range().last - 1)}};
}

std::vector<double> batch_size_buckets() { return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}; }

}  // namespace

LocalStage::LocalStage(std::shared_ptr<model::Model> model, tensor::ThreadPool& pool, KvOptions kv)
    : model_(std::move(model)),
      pool_(pool),
      step_seconds_(metrics::process_registry().histogram(
          "strata_stage_step_seconds", "Time this node's stage takes to compute one batch through its layers.",
          metrics::seconds_buckets(), layer_labels(*model_))),
      step_inputs_(metrics::process_registry().histogram(
          "strata_stage_batch_inputs", "Inputs (prompt tokens and decoded tokens) per batch of this node's stage.",
          batch_size_buckets(), layer_labels(*model_))),
      step_sequences_(metrics::process_registry().histogram(
          "strata_stage_batch_sequences", "Sequences per batch of this node's stage.", batch_size_buckets(),
          layer_labels(*model_))),
      kv_blocks_(kv.blocks),
      kv_memory_(model_->new_kv_memory(kv.blocks, kv.type)) {
  publish_stats();
}

StageOutput LocalStage::forward(const StageBatch& batch) {
  std::lock_guard lock(mutex_);
  std::vector<model::SequenceSlice> slices;
  slices.reserve(batch.sequences.size());
  size_t rows = 0;
  for (const SequenceWork& work : batch.sequences) {
    if (work.token_count <= 0) throw std::invalid_argument("a batch sequence has no inputs");
    rows += static_cast<size_t>(work.token_count);
    const int drafts = work.sampling ? work.sampling->drafts : 0;
    if (drafts < 0 || drafts >= work.token_count || (drafts > 0 && work.output != SequenceWork::Output::Logits)) {
      throw std::invalid_argument("sequence " + std::to_string(work.id) + " has " + std::to_string(drafts) +
                                  " drafts among " + std::to_string(work.token_count) + " inputs");
    }
    auto found = sequences_.find(work.id);
    if (work.rewind && (found == sequences_.end() || !found->second.started)) {
      throw std::invalid_argument("sequence " + std::to_string(work.id) + " has had no batch here to rewind");
    }
    if (found == sequences_.end()) {
      if (work.first_position != 0) {
        throw std::invalid_argument("sequence " + std::to_string(work.id) + " is unknown to this stage");
      }
      if (work.capacity < work.token_count) {
        throw std::invalid_argument("sequence " + std::to_string(work.id) + " asks for a capacity of " +
                                    std::to_string(work.capacity) + " positions");
      }
      found = sequences_.emplace(work.id, Sequence{std::make_unique<model::KvState>(kv_memory_, work.capacity), true}).first;
      sequence_count_ = sequences_.size();
    } else if (!found->second.started) {
      model::KvState& kv = *found->second.kv;
      if (work.first_position % model::kKvBlock != 0 || work.first_position > kv.size()) {
        throw std::invalid_argument("sequence " + std::to_string(work.id) + " holds a prefix of " +
                                    std::to_string(kv.size()) + " positions here, but its first batch starts at " +
                                    std::to_string(work.first_position));
      }
      kv.truncate(work.first_position);
      found->second.started = true;
    } else if (work.rewind ? found->second.kv->size() < work.first_position
                           : found->second.kv->size() != work.first_position) {
      throw std::invalid_argument("sequence " + std::to_string(work.id) + " is at position " +
                                  std::to_string(found->second.kv->size()) + ", but the batch continues at " +
                                  std::to_string(work.first_position));
    } else if (work.rewind) {
      found->second.kv->rewind(work.first_position);  // the drafts the last step rejected go
    }
    // A step with drafts needs the logits of every input, which the last range gives.
    slices.push_back({found->second.kv.get(), work.token_count,
                      drafts > 0 ? model::SliceOutput::AllLogits : slice_output(work.output)});
  }
  if (batch.tokens.size() != rows) throw std::invalid_argument("the batch's token ids do not match its sequences");
  const auto started = std::chrono::steady_clock::now();
  const bool from_bests = chooses_from_bests(batch.sequences);
  StageOutput out;
  if (!model_->range().has_head(model_->config())) {
    out.rows = model_->forward(slices, batch.tokens, batch.hidden, pool_);
  } else {
    model_->forward(slices, batch.tokens, batch.hidden, pool_,
                    from_bests ? model::HeadRows::Share : model::HeadRows::Whole, head_rows_);
    out = from_bests ? choose_from_bests(batch.sequences, batch.tokens, head_rows_)
                     : sample(batch.sequences, batch.tokens, head_rows_);
  }
  step_seconds_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  step_inputs_.observe(static_cast<double>(rows));
  step_sequences_.observe(static_cast<double>(slices.size()));
  size_t first = 0;
  for (const model::SequenceSlice& slice : slices) {
    slice.kv->record(std::span<const Token>(batch.tokens).subspan(first, static_cast<size_t>(slice.token_count)));
    first += static_cast<size_t>(slice.token_count);
  }
  publish_stats();
  return out;
}

StageOutput LocalStage::sample(const std::vector<SequenceWork>& sequences, std::span<const Token> tokens,
                               std::span<const float> rows) {
  const bool samples = std::any_of(sequences.begin(), sequences.end(), [](const SequenceWork& w) {
    return w.output == SequenceWork::Output::Logits && w.sampling;
  });
  if (!samples) return {{rows.begin(), rows.end()}, {}};  // every row goes back as it is
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  StageOutput out;
  struct Step {
    const sampling::SamplingStep* step;
    std::span<const float> logits;  // a row per input with drafts, else the last input's
    std::span<const Token> drafts;
  };
  std::vector<Step> steps;
  size_t at = 0;
  size_t input = 0;  // the sequence's first input in `tokens`
  for (const SequenceWork& work : sequences) {
    input += static_cast<size_t>(work.token_count);
    if (work.output == SequenceWork::Output::Embeddings) {
      const size_t values = static_cast<size_t>(work.token_count) * static_cast<size_t>(model_->config().embedding_dim);
      out.rows.insert(out.rows.end(), rows.begin() + static_cast<std::ptrdiff_t>(at),
                      rows.begin() + static_cast<std::ptrdiff_t>(at + values));
      at += values;
    } else if (work.output == SequenceWork::Output::Logits) {
      const size_t drafts = work.sampling ? static_cast<size_t>(work.sampling->drafts) : 0;
      const size_t values = (drafts + 1) * vocab;
      if (work.sampling) {
        steps.push_back({&*work.sampling, std::span<const float>(rows).subspan(at, values),
                         tokens.subspan(input - drafts, drafts)});
      } else {
        out.rows.insert(out.rows.end(), rows.begin() + static_cast<std::ptrdiff_t>(at),
                        rows.begin() + static_cast<std::ptrdiff_t>(at + vocab));
      }
      at += values;
    }
  }
  // Each sequence chooses from its own row with its own step's generator: in parallel.
  out.sampled.resize(steps.size());
  pool_.parallel_for(static_cast<int64_t>(steps.size()), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const Step& step = steps[static_cast<size_t>(k)];
      Sampled& sampled = out.sampled[static_cast<size_t>(k)];
      try {
        if (step.step->drafts == 0) {
          sampled.choice = sampling::choose(*step.step, step.logits);
        } else {
          std::vector<sampling::Choice> choices = sampling::choose_along(*step.step, step.drafts, step.logits);
          sampled.choice = std::move(choices.front());
          sampled.continued.assign(std::make_move_iterator(choices.begin() + 1), std::make_move_iterator(choices.end()));
        }
      } catch (const std::exception& e) {
        sampled.error = std::string("sampling failed: ") + e.what();
      }
    }
  });
  return out;
}

bool LocalStage::chooses_from_bests(const std::vector<SequenceWork>& sequences) const {
  const model::Config& config = model_->config();
  if (!model_->range().has_head(config) || model_->vocab_share().size() == config.vocab_size) return false;
  bool any = false;
  for (const SequenceWork& work : sequences) {
    if (work.output == SequenceWork::Output::Nothing) continue;
    if (work.output != SequenceWork::Output::Logits || !work.sampling || !sampling::chooses_from_bests(*work.sampling)) {
      return false;
    }
    any = true;
  }
  return any;
}

namespace {

// A share's best as it crosses to the other members: the token, its logit, the flags.
constexpr size_t kBestBytes = sizeof(int32_t) + sizeof(float) + 1;

void put_best(const sampling::ShareBest& best, std::byte* at) {
  std::memcpy(at, &best.token, sizeof best.token);
  std::memcpy(at + sizeof best.token, &best.logit, sizeof best.logit);
  at[kBestBytes - 1] = static_cast<std::byte>((best.invalid ? 1 : 0) | (best.possible ? 2 : 0));
}

sampling::ShareBest best_at(const std::byte* at) {
  sampling::ShareBest best;
  std::memcpy(&best.token, at, sizeof best.token);
  std::memcpy(&best.logit, at + sizeof best.token, sizeof best.logit);
  const auto flags = static_cast<uint8_t>(at[kBestBytes - 1]);
  best.invalid = (flags & 1) != 0;
  best.possible = (flags & 2) != 0;
  return best;
}

}  // namespace

StageOutput LocalStage::choose_from_bests(const std::vector<SequenceWork>& sequences, std::span<const Token> tokens,
                                          std::span<const float> rows) {
  const model::RowRange share = model_->vocab_share();
  const int vocab = model_->config().vocab_size;
  const auto width = static_cast<size_t>(share.size());
  struct Step {
    const sampling::SamplingStep* step;
    std::span<const Token> drafts;
    size_t first_best;  // of its rows' bests, in the order they cross
  };
  std::vector<Step> steps;
  std::vector<std::byte> sent;  // this member's bests, step after step, row after row
  size_t input = 0;  // the sequence's first input in `tokens`
  size_t at = 0;     // its rows in `rows`
  for (const SequenceWork& work : sequences) {
    input += static_cast<size_t>(work.token_count);
    if (work.output != SequenceWork::Output::Logits) continue;
    const auto drafts = static_cast<size_t>(work.sampling->drafts);
    const std::span<const Token> drafted = tokens.subspan(input - drafts, drafts);
    const size_t values = (drafts + 1) * width;
    steps.push_back({&*work.sampling, drafted, sent.size() / kBestBytes});
    for (const sampling::ShareBest& best :
         sampling::bests_in_share(*work.sampling, drafted, rows.subspan(at, values), share.first, vocab)) {
      sent.resize(sent.size() + kBestBytes);
      put_best(best, sent.data() + sent.size() - kBestBytes);
    }
    at += values;
  }
  const std::vector<std::byte> all = model_->gather_from_members(sent);
  const size_t members = all.size() / std::max<size_t>(sent.size(), 1);
  StageOutput out;
  out.sampled.resize(steps.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    const size_t step_rows = steps[k].drafts.size() + 1;
    std::vector<sampling::ShareBest> bests;  // row by row, each row's members in order
    for (size_t row = 0; row < step_rows; ++row) {
      for (size_t m = 0; m < members; ++m) {
        bests.push_back(best_at(all.data() + m * sent.size() + (steps[k].first_best + row) * kBestBytes));
      }
    }
    Sampled& sampled = out.sampled[k];
    try {
      std::vector<sampling::Choice> choices = sampling::choose_from_bests(*steps[k].step, steps[k].drafts, bests, vocab);
      sampled.choice = std::move(choices.front());
      sampled.continued.assign(std::make_move_iterator(choices.begin() + 1), std::make_move_iterator(choices.end()));
    } catch (const std::exception& e) {
      sampled.error = std::string("sampling failed: ") + e.what();
    }
  }
  return out;
}

LayerKv LocalStage::read_kv(SequenceId id, int layer) {
  std::lock_guard lock(mutex_);
  const auto found = sequences_.find(id);
  if (found == sequences_.end()) throw std::invalid_argument("sequence " + std::to_string(id) + " is unknown to this stage");
  if (!layers().contains(layer)) throw std::invalid_argument("layer " + std::to_string(layer) + " is not held here");
  const model::KvState& state = *found->second.kv;
  const int layer_here = layer - model_->range().first;
  LayerKv kv{id, layer, state.size(), state.capacity(), state.first_held(layer_here), {}, {}, {}};
  state.read(layer_here, kv.keys, kv.values);
  if (state.ids().size() >= static_cast<size_t>(state.size())) {
    kv.tokens.assign(state.ids().begin(), state.ids().begin() + state.size());
  }
  return kv;
}

void LocalStage::write_kv(const LayerKv& kv) {
  std::lock_guard lock(mutex_);
  if (!layers().contains(kv.layer)) throw std::invalid_argument("layer " + std::to_string(kv.layer) + " is not held here");
  auto found = sequences_.find(kv.id);
  const bool created = found == sequences_.end();
  if (created) {
    if (kv.capacity < kv.positions || kv.capacity <= 0) {
      throw std::invalid_argument("sequence " + std::to_string(kv.id) + " asks for a capacity of " +
                                  std::to_string(kv.capacity) + " positions");
    }
    // Started: its next batch continues where the handed-over state ends.
    found = sequences_.emplace(kv.id, Sequence{std::make_unique<model::KvState>(kv_memory_, kv.capacity), true}).first;
  }
  try {
    found->second.kv->write(kv.layer - model_->range().first, kv.first_position, kv.positions, kv.keys, kv.values,
                            kv.tokens);
  } catch (...) {
    if (created) sequences_.erase(found);  // a refused first write leaves no sequence behind
    throw;
  }
  sequence_count_ = sequences_.size();
  publish_stats();
}

void LocalStage::release(std::span<const SequenceId> ids) {
  std::lock_guard lock(mutex_);
  for (SequenceId id : ids) sequences_.erase(id);
  sequence_count_ = sequences_.size();
  publish_stats();
}

int LocalStage::hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) {
  std::lock_guard lock(mutex_);
  if (const auto held = sequences_.find(id); held != sequences_.end()) {
    if (held->second.started) throw std::invalid_argument("sequence " + std::to_string(id) + " is started twice");
    sequences_.erase(held);  // asked again before its first batch: this hold replaces that one
  }
  if (capacity <= 0 || tokens.size() >= static_cast<size_t>(capacity)) {
    throw std::invalid_argument("sequence " + std::to_string(id) + " asks for a capacity of " +
                                std::to_string(capacity) + " positions");
  }
  auto kv = std::make_unique<model::KvState>(kv_memory_, capacity);
  const int held = kv->hold_prefix(tokens);
  sequences_.emplace(id, Sequence{std::move(kv), false});
  sequence_count_ = sequences_.size();
  publish_stats();
  return held;
}

model::KvPoolStats LocalStage::kv_stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

std::optional<model::KvPoolStats> LocalStage::window_kv_stats() const {
  std::lock_guard lock(stats_mutex_);
  return window_stats_;
}

void LocalStage::publish_stats() {
  const model::KvPoolStats stats = kv_memory_->full().stats();
  std::optional<model::KvPoolStats> window_stats;
  if (const model::KvPool* window = kv_memory_->window()) window_stats = window->stats();
  std::lock_guard lock(stats_mutex_);
  stats_ = stats;
  window_stats_ = window_stats;
}

}  // namespace strata::engine
