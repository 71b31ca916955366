#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace strata::sampling {
namespace {

bool more_likely(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

bool penalties_active(const SamplingParams& params) {
  return params.penalty_last_n != 0 &&
         (params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
          params.frequency_penalty != 0.0f);
}

void check_logits(std::span<const float> logits) {
  bool any_possible = false;
  for (float logit : logits) {
    if (std::isnan(logit) || logit == INFINITY) {
      throw std::invalid_argument("sampler: logits contain NaN or +inf");
    }
    any_possible = any_possible || logit != -INFINITY;
  }
  if (!any_possible) throw std::invalid_argument("sampler: every logit is -inf");
}

}  // namespace

void apply_penalties(std::span<float> logits, std::span<const int32_t> history,
                     const SamplingParams& params) {
  if (!penalties_active(params)) return;
  const size_t window = params.penalty_last_n < 0
                            ? history.size()
                            : std::min(history.size(), static_cast<size_t>(params.penalty_last_n));
  std::vector<int32_t> recent(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
  for (int32_t token : recent) {
    if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
      throw std::invalid_argument("sampler: history token " + std::to_string(token) +
                                  " is outside the vocabulary");
    }
  }
  // Sorting groups repeats so each token is counted and penalized once.
  std::sort(recent.begin(), recent.end());
  for (size_t begin = 0; begin < recent.size();) {
    size_t end = begin;
    while (end < recent.size() && recent[end] == recent[begin]) ++end;
    const auto count = static_cast<float>(end - begin);
    float& logit = logits[static_cast<size_t>(recent[begin])];
    logit = logit <= 0.0f ? logit * params.repetition_penalty : logit / params.repetition_penalty;
    logit -= count * params.frequency_penalty + params.presence_penalty;
    begin = end;
  }
}

void keep_top_k(std::vector<Candidate>& candidates, int k) {
  if (k <= 0 || static_cast<size_t>(k) >= candidates.size()) return;
  const auto kth = candidates.begin() + k;
  std::nth_element(candidates.begin(), kth - 1, candidates.end(), more_likely);
  candidates.resize(static_cast<size_t>(k));
  std::sort(candidates.begin(), candidates.end(), more_likely);
}

void keep_top_p(std::vector<Candidate>& candidates, float p) {
  if (p >= 1.0f || candidates.size() <= 1) return;
  double max_logit = -INFINITY;
  for (const Candidate& c : candidates) max_logit = std::max(max_logit, double{c.logit});
  double total = 0.0;
  for (const Candidate& c : candidates) total += std::exp(c.logit - max_logit);
  const double target = double{p} * total;
  // The nucleus is usually a small fraction of a large vocabulary: sort a growing prefix
  // instead of everything.
  size_t sorted = std::min<size_t>(candidates.size(), 64);
  for (;;) {
    std::partial_sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(sorted),
                      candidates.end(), more_likely);
    double cumulative = 0.0;
    for (size_t i = 0; i < sorted; ++i) {
      cumulative += std::exp(candidates[i].logit - max_logit);
      if (cumulative >= target) {
        candidates.resize(i + 1);
        return;
      }
    }
    if (sorted == candidates.size()) return;
    sorted = std::min(candidates.size(), sorted * 4);
  }
}

void keep_min_p(std::vector<Candidate>& candidates, float min_p) {
  if (min_p <= 0.0f || candidates.empty()) return;
  float max_logit = -INFINITY;
  for (const Candidate& c : candidates) max_logit = std::max(max_logit, c.logit);
  // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p), whatever the normalizer.
  const double threshold = double{max_logit} + std::log(double{min_p});
  std::erase_if(candidates, [&](const Candidate& c) { return c.logit < threshold; });
}

Sampler::Sampler(const SamplingParams& params, int vocab_size)
    : params_(params), vocab_size_(vocab_size), random_(params.seed) {
  if (vocab_size <= 0) throw std::invalid_argument("sampler: vocabulary size must be positive");
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    throw std::invalid_argument("sampler: expected " + std::to_string(vocab_size_) +
                                " logits, got " + std::to_string(logits.size()));
  }
  check_logits(logits);
  penalized_.assign(logits.begin(), logits.end());
  apply_penalties(penalized_, history, params_);

  if (params_.temperature <= 0.0f) {
    int32_t best = 0;
    for (int32_t token = 1; token < vocab_size_; ++token) {
      if (penalized_[static_cast<size_t>(token)] > penalized_[static_cast<size_t>(best)]) best = token;
    }
    return best;
  }

  candidates_.resize(penalized_.size());
  for (int32_t token = 0; token < vocab_size_; ++token) {
    candidates_[static_cast<size_t>(token)] = {token, penalized_[static_cast<size_t>(token)]};
  }
  keep_top_k(candidates_, params_.top_k);
  keep_top_p(candidates_, params_.top_p);
  keep_min_p(candidates_, params_.min_p);
  return pick_at_random(candidates_);
}

int32_t Sampler::pick_at_random(const std::vector<Candidate>& candidates) {
  double max_logit = -INFINITY;
  for (const Candidate& c : candidates) max_logit = std::max(max_logit, double{c.logit});
  const double inverse_temperature = 1.0 / double{params_.temperature};
  std::vector<double> cumulative(candidates.size());
  double total = 0.0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    total += std::exp((candidates[i].logit - max_logit) * inverse_temperature);
    cumulative[i] = total;
  }
  const double draw = random_.next_unit() * total;
  const auto chosen = std::upper_bound(cumulative.begin(), cumulative.end(), draw);
  // Rounding can leave the draw at the very top of the range: fall back to the last candidate.
  const size_t index = chosen == cumulative.end() ? candidates.size() - 1
                                                  : static_cast<size_t>(chosen - cumulative.begin());
  return candidates[index].token;
}

}  // namespace strata::sampling
