#include "engine/drafter.h"

#include <algorithm>

namespace strata::engine {

std::vector<Token> PromptLookupDrafter::draft(State* /*state*/, std::span<const Token> history, int max) const {
  std::vector<Token> out;
  const size_t size = history.size();
  if (max <= 0 || size < 2) return out;
  // The tokens from `from` on, read on into the drafts themselves where they reach the end (a
  // repeating pattern goes on repeating).
  const auto follow = [&](size_t from) {
    for (size_t i = from; out.size() < static_cast<size_t>(max); ++i) out.push_back(i < size ? history[i] : out[i - size]);
    return out;
  };
  // Where the n tokens that end `end` stood last before: the earlier occurrence's end, or 0.
  const auto seen_before = [&](size_t n, size_t end) -> size_t {
    const auto tokens = history.subspan(end - n, n);
    for (size_t p = end - n; p-- > 0;) {
      if (std::equal(tokens.begin(), tokens.end(), history.begin() + static_cast<std::ptrdiff_t>(p))) return p + n;
    }
    return 0;
  };
  const int longest = std::min(longest_, static_cast<int>(size) - 1);
  for (int n = longest; n >= std::max(2, shortest_); --n) {
    if (const size_t end = seen_before(static_cast<size_t>(n), size)) return follow(end);
  }
  // Before a lone token: the tokens before the last one, as if the last had replaced another
  // (an edited word of a copy), and what followed the one they preceded.
  for (int n = std::min(longest, static_cast<int>(size) - 2); n >= std::max(2, shortest_); --n) {
    if (const size_t end = seen_before(static_cast<size_t>(n), size - 1)) return follow(end + 1);
  }
  if (shortest_ <= 1) {
    if (const size_t end = seen_before(1, size)) return follow(end);
  }
  return out;
}

namespace {

struct DraftModelState final : Drafter::State {
  std::unique_ptr<model::KvState> kv;
};

// Prompt tokens per forward of the draft model, as the engine chunks prefill.
constexpr size_t kDraftChunk = 256;

}  // namespace

ModelDrafter::ModelDrafter(std::shared_ptr<model::Model> model, int threads, int context)
    : model_(std::move(model)),
      context_(context > 0 ? context : model_->config().context_length),
      pool_(std::make_unique<tensor::ThreadPool>(std::max(1, threads))) {}

std::unique_ptr<Drafter::State> ModelDrafter::start() const {
  auto state = std::make_unique<DraftModelState>();
  state->kv = model_->new_sequence(context_, model::KvType::F16);
  return state;
}

std::vector<Token> ModelDrafter::draft(State* state, std::span<const Token> history, int max) const {
  auto* own = dynamic_cast<DraftModelState*>(state);
  if (!own || history.empty() || max <= 0) return {};
  // Its last draft is never fed: it holds at most the history and all drafts but one.
  max = std::min<int>(max, context_ - static_cast<int>(history.size()) + 1);
  if (max <= 0) return {};
  model::KvState& kv = *own->kv;
  const int vocab = model_->config().vocab_size;
  // A token it cannot embed (a draft model of a smaller vocabulary): nothing to propose.
  if (std::any_of(history.begin(), history.end(), [&](Token t) { return t < 0 || t >= vocab; })) return {};
  std::lock_guard lock(mutex_);
  // What it holds of the history stays; the history's last token is always fed again, for
  // its logits.
  const std::span<const Token> held = kv.ids();
  const size_t limit = std::min({held.size(), static_cast<size_t>(kv.size()), history.size() - 1});
  size_t same = 0;
  while (same < limit && held[same] == history[same]) ++same;
  kv.rewind(static_cast<int>(same));
  std::vector<float> logits;  // each step's, in the memory of the first
  const auto feed = [&](std::span<const Token> inputs, bool wants_logits) {
    const model::SequenceSlice slice{&kv, static_cast<int>(inputs.size()),
                                     wants_logits ? model::SliceOutput::LastLogits : model::SliceOutput::Nothing};
    model_->forward({&slice, 1}, inputs, {}, *pool_, model::HeadRows::Whole, logits);
    kv.record(inputs);
  };
  for (size_t at = same; at < history.size(); at += kDraftChunk) {
    const size_t count = std::min(kDraftChunk, history.size() - at);
    feed(history.subspan(at, count), at + count == history.size());
  }
  std::vector<Token> out;
  while (true) {
    // Greedy, ties to the lowest id, as the sampler's greedy choice.
    Token best = 0;
    for (Token t = 1; t < vocab; ++t) {
      if (logits[static_cast<size_t>(t)] > logits[static_cast<size_t>(best)]) best = t;
    }
    out.push_back(best);
    if (static_cast<int>(out.size()) >= max) return out;
    feed({&out.back(), 1}, true);
  }
}

}  // namespace strata::engine
