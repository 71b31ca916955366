#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <optional>
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

// The tokens the penalties look at: the last penalty_last_n of the history (-1: all of it), or
// none when they are off.
std::span<const int32_t> penalty_window(std::span<const int32_t> history, const SamplingParams& params) {
  if (!penalties_active(params)) return {};
  const size_t window = params.penalty_last_n < 0 ? history.size()
                                                  : std::min(history.size(), static_cast<size_t>(params.penalty_last_n));
  return history.last(window);
}

// What check_logits finds in raw logits, part by part.
struct LogitsCheck {
  bool invalid = false;   // a NaN or +inf
  bool possible = false;  // a logit other than -inf
};

LogitsCheck checked(std::span<const float> logits) {
  LogitsCheck check;
  for (float logit : logits) {
    check.invalid = check.invalid || std::isnan(logit) || logit == INFINITY;
    check.possible = check.possible || logit != -INFINITY;
  }
  return check;
}

void refuse(LogitsCheck check) {
  if (check.invalid) throw std::invalid_argument("sampler: logits contain NaN or +inf");
  if (!check.possible) throw std::invalid_argument("sampler: every logit is -inf");
}

void check_logits(std::span<const float> logits) { refuse(checked(logits)); }

void check_mask(std::span<const uint8_t> allowed, size_t vocab_size) {
  if (!allowed.empty() && allowed.size() != vocab_size) {
    throw std::invalid_argument("sampler: expected " + std::to_string(vocab_size) + " allowed flags, got " +
                                std::to_string(allowed.size()));
  }
}

void check_row_masks(std::span<const uint8_t> allowed, size_t rows, size_t vocab_size) {
  if (!allowed.empty() && allowed.size() != rows * vocab_size) {
    throw std::invalid_argument("sampler: " + std::to_string(allowed.size()) + " allowed flags are not a mask for each of " +
                                std::to_string(rows) + " rows of " + std::to_string(vocab_size) + " logits");
  }
}

// A thread's vocabulary-sized scratch, kept from one choice to the next: choose() makes a
// Sampler a step, and a vocabulary's row lies above the server's mmap threshold
// (api/server.cpp), so a fresh one would be fresh pages, a page fault every 4 KB, each token.
struct Scratch {
  std::vector<float> penalized;
  std::vector<Candidate> candidates;
  std::vector<double> cumulative;  // of the candidates' probabilities
};

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// The penalties' window, each token once with its count, once every token is checked to be
// of the vocabulary.
std::vector<std::pair<int32_t, int>> counted_window(std::span<const int32_t> history, const SamplingParams& params,
                                                    size_t vocab_size) {
  const std::span<const int32_t> window = penalty_window(history, params);
  std::vector<int32_t> recent(window.begin(), window.end());
  for (int32_t token : recent) {
    if (token < 0 || static_cast<size_t>(token) >= vocab_size) {
      throw std::invalid_argument("sampler: history token " + std::to_string(token) +
                                  " is outside the vocabulary");
    }
  }
  // Sorting groups repeats so each token is counted and penalized once.
  std::sort(recent.begin(), recent.end());
  std::vector<std::pair<int32_t, int>> counted;
  for (size_t begin = 0; begin < recent.size();) {
    size_t end = begin;
    while (end < recent.size() && recent[end] == recent[begin]) ++end;
    counted.emplace_back(recent[begin], static_cast<int>(end - begin));
    begin = end;
  }
  return counted;
}

// The penalties on the logits of tokens first_token .. first_token + logits.size() - 1.
void penalize(std::span<float> logits, int32_t first_token, std::span<const std::pair<int32_t, int>> counted,
              const SamplingParams& params) {
  for (const auto& [token, seen] : counted) {
    if (token < first_token || static_cast<size_t>(token - first_token) >= logits.size()) continue;
    const auto count = static_cast<float>(seen);
    float& logit = logits[static_cast<size_t>(token - first_token)];
    logit = logit <= 0.0f ? logit * params.repetition_penalty : logit / params.repetition_penalty;
    logit -= count * params.frequency_penalty + params.presence_penalty;
  }
}

// The logits with the penalties applied: the raw ones, uncopied, when no token is counted;
// else a copy in the thread's scratch, valid until its next call.
std::span<const float> penalized_logits(std::span<const float> logits, int32_t first_token,
                                        std::span<const std::pair<int32_t, int>> counted, const SamplingParams& params) {
  if (counted.empty()) return logits;
  std::vector<float>& penalized = thread_scratch().penalized;
  penalized.assign(logits.begin(), logits.end());
  penalize(penalized, first_token, counted, params);
  return penalized;
}

// Of the tokens first_token .. first_token + logits.size() - 1 that `allowed` (a whole
// vocabulary's flags, or none) allows, the one of the highest logit, the lowest id among equals.
std::optional<Candidate> first_best(std::span<const float> logits, int32_t first_token, std::span<const uint8_t> allowed) {
  std::optional<Candidate> best;
  for (size_t i = 0; i < logits.size(); ++i) {
    const int32_t token = first_token + static_cast<int32_t>(i);
    if (!allowed.empty() && allowed[static_cast<size_t>(token)] == 0) continue;
    if (!best || logits[i] > best->logit) best = Candidate{token, logits[i]};
  }
  return best;
}

// A greedy choice's token: the best, unless none is allowed or possible.
int32_t greedy_token(const std::optional<Candidate>& best) {
  if (!best || best->logit == -INFINITY) throw std::invalid_argument("sampler: no allowed token is possible");
  return best->token;
}

}  // namespace

void apply_penalties(std::span<float> logits, std::span<const int32_t> history,
                     const SamplingParams& params) {
  penalize(logits, 0, counted_window(history, params, logits.size()), params);
}

void keep_top_k(std::vector<Candidate>& candidates, int k) {
  if (k <= 0 || static_cast<size_t>(k) >= candidates.size()) return;
  std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end(), more_likely);
  candidates.resize(static_cast<size_t>(k));
}

void keep_top_p(std::vector<Candidate>& candidates, float p) {
  if (p >= 1.0f || candidates.size() <= 1) return;
  double max_logit = -INFINITY;
  for (const Candidate& c : candidates) max_logit = std::max(max_logit, double{c.logit});
  const auto mass = [&](size_t begin, size_t end) {
    double sum = 0.0;
    for (size_t i = begin; i < end; ++i) sum += std::exp(candidates[i].logit - max_logit);
    return sum;
  };
  // A flat distribution puts most of a large vocabulary in the nucleus, so rather than sorting,
  // narrow down its last member by halving: [0, settled) is known to be inside the nucleus and
  // more likely than the rest, and the last member lies in [settled, end).
  double needed = double{p} * mass(0, candidates.size());
  size_t settled = 0;
  size_t end = candidates.size();
  while (end - settled > 1) {
    const size_t middle = settled + (end - settled) / 2;
    std::nth_element(candidates.begin() + static_cast<std::ptrdiff_t>(settled),
                     candidates.begin() + static_cast<std::ptrdiff_t>(middle),
                     candidates.begin() + static_cast<std::ptrdiff_t>(end), more_likely);
    const double upper_mass = mass(settled, middle);
    if (upper_mass >= needed) {
      end = middle;
    } else {
      needed -= upper_mass;
      settled = middle;
    }
  }
  candidates.resize(end);
}

void keep_min_p(std::vector<Candidate>& candidates, float min_p) {
  if (min_p <= 0.0f || candidates.empty()) return;
  float max_logit = -INFINITY;
  for (const Candidate& c : candidates) max_logit = std::max(max_logit, c.logit);
  // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p), whatever the normalizer.
  const double threshold = double{max_logit} + std::log(double{min_p});
  std::erase_if(candidates, [&](const Candidate& c) { return c.logit < threshold; });
}

Sampler::Sampler(const SamplingParams& params, int vocab_size) : Sampler(params, vocab_size, Random(params.seed).state()) {}

Sampler::Sampler(const SamplingParams& params, int vocab_size, const Random::State& random)
    : params_(params), vocab_size_(vocab_size), random_(random) {
  if (vocab_size <= 0) throw std::invalid_argument("sampler: vocabulary size must be positive");
}

SamplingStep Sampler::step(std::span<const int32_t> history, std::span<const uint8_t> allowed, int top_logprobs) const {
  const std::span<const int32_t> recent = penalty_window(history, params_);
  return {params_, random_.state(), {recent.begin(), recent.end()}, {allowed.begin(), allowed.end()}, top_logprobs};
}

Choice choose(const SamplingStep& step, std::span<const float> logits) {
  Sampler sampler(step.params, static_cast<int>(logits.size()), step.random);
  Choice out;
  out.token = sampler.sample(logits, step.recent, step.allowed);
  if (step.top_logprobs >= 0) {
    Logprobs lp = logprobs(logits, out.token, step.top_logprobs);
    out.logprob = lp.chosen;
    out.top = std::move(lp.top);
  }
  return out;
}

std::vector<Choice> choose_along(const SamplingStep& step, std::span<const int32_t> drafts,
                                 std::span<const float> logits) {
  const size_t rows = drafts.size() + 1;
  if (step.drafts != static_cast<int>(drafts.size()) || logits.empty() || logits.size() % rows != 0) {
    throw std::invalid_argument("sampler: " + std::to_string(drafts.size()) + " drafts and " +
                                std::to_string(logits.size()) + " logits do not match a step of " +
                                std::to_string(step.drafts) + " drafts");
  }
  const size_t vocab = logits.size() / rows;
  check_row_masks(step.allowed, rows, vocab);
  Sampler sampler(step.params, static_cast<int>(vocab), step.random);
  std::vector<int32_t> history = step.recent;  // the penalties' window, as it grows
  std::vector<Choice> out;
  for (size_t row = 0; row < rows; ++row) {
    const std::span<const float> row_logits = logits.subspan(row * vocab, vocab);
    Choice& choice = out.emplace_back();
    // One draw per sample unless greedy: the generator moves on as Sampler::skip(1) moves it.
    const std::span<const uint8_t> row_allowed =
        step.allowed.empty() ? std::span<const uint8_t>() : std::span<const uint8_t>(step.allowed).subspan(row * vocab, vocab);
    choice.token = sampler.sample(row_logits, history, row_allowed);
    if (step.top_logprobs >= 0) {
      Logprobs lp = logprobs(row_logits, choice.token, step.top_logprobs);
      choice.logprob = lp.chosen;
      choice.top = std::move(lp.top);
    }
    if (row == drafts.size() || choice.token != drafts[row]) break;
    history.push_back(choice.token);
  }
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history,
                        std::span<const uint8_t> allowed) {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    throw std::invalid_argument("sampler: expected " + std::to_string(vocab_size_) +
                                " logits, got " + std::to_string(logits.size()));
  }
  check_mask(allowed, logits.size());
  check_logits(logits);
  const std::span<const float> penalized =
      penalized_logits(logits, 0, counted_window(history, params_, logits.size()), params_);
  const auto is_allowed = [&](int32_t token) { return allowed.empty() || allowed[static_cast<size_t>(token)] != 0; };

  if (params_.temperature <= 0.0f) return greedy_token(first_best(penalized, 0, allowed));

  std::vector<Candidate>& candidates = thread_scratch().candidates;
  candidates.clear();
  for (int32_t token = 0; token < vocab_size_; ++token) {
    const float logit = penalized[static_cast<size_t>(token)];
    if (is_allowed(token) && (allowed.empty() || logit != -INFINITY)) candidates.push_back({token, logit});
  }
  if (candidates.empty()) throw std::invalid_argument("sampler: no allowed token is possible");
  keep_top_k(candidates, params_.top_k);
  keep_top_p(candidates, params_.top_p);
  keep_min_p(candidates, params_.min_p);
  return pick_at_random(candidates);
}

void Sampler::skip(int count) {
  if (params_.temperature <= 0.0f) return;
  for (int i = 0; i < count; ++i) random_.next_unit();
}

int32_t Sampler::pick_at_random(const std::vector<Candidate>& candidates) {
  double max_logit = -INFINITY;
  for (const Candidate& c : candidates) max_logit = std::max(max_logit, double{c.logit});
  const double inverse_temperature = 1.0 / double{params_.temperature};
  std::vector<double>& cumulative = thread_scratch().cumulative;
  cumulative.resize(candidates.size());
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

bool chooses_from_bests(const SamplingStep& step) {
  return step.params.temperature <= 0.0f && step.top_logprobs < 0;
}

namespace {

// A row's mask, or none: the step's one mask without drafts, else its row's.
std::span<const uint8_t> row_mask(const SamplingStep& step, size_t row, size_t vocab_size) {
  if (step.allowed.empty()) return {};
  if (step.drafts == 0) return step.allowed;
  return std::span<const uint8_t>(step.allowed).subspan(row * vocab_size, vocab_size);
}

// `masks_fit`: the step's masks are of the vocabulary's size; else only the raw logits' checks.
ShareBest best_of_row(const SamplingStep& step, std::span<const int32_t> history, bool masks_fit,
                      std::span<const uint8_t> allowed, std::span<const float> logits, int32_t first_token,
                      size_t vocab_size) {
  const LogitsCheck check = checked(logits);
  ShareBest best{.invalid = check.invalid, .possible = check.possible};
  if (check.invalid || !masks_fit) return best;
  std::vector<std::pair<int32_t, int>> counted;
  try {
    counted = counted_window(history, step.params, vocab_size);
  } catch (const std::invalid_argument&) {
    return best;  // a history token outside the vocabulary, which choose_from_bests refuses
  }
  logits = penalized_logits(logits, first_token, counted, step.params);
  if (const std::optional<Candidate> found = first_best(logits, first_token, allowed)) {
    best.token = found->token;
    best.logit = found->logit;
  }
  return best;
}

}  // namespace

std::vector<ShareBest> bests_in_share(const SamplingStep& step, std::span<const int32_t> drafts,
                                      std::span<const float> logits, int32_t first_token, int vocab_size) {
  const size_t rows = drafts.size() + 1;
  const size_t share = logits.size() / rows;
  const auto vocab = static_cast<size_t>(vocab_size);
  const bool masks_fit = step.allowed.empty() || step.allowed.size() == (step.drafts == 0 ? vocab : rows * vocab);
  std::vector<int32_t> history = step.recent;  // as choose_along's grows, a draft a row
  std::vector<ShareBest> bests;
  for (size_t row = 0; row < rows; ++row) {
    bests.push_back(best_of_row(step, history, masks_fit, masks_fit ? row_mask(step, row, vocab) : std::span<const uint8_t>(),
                                logits.subspan(row * share, share), first_token, vocab));
    if (row < drafts.size()) history.push_back(drafts[row]);
  }
  return bests;
}

std::vector<Choice> choose_from_bests(const SamplingStep& step, std::span<const int32_t> drafts,
                                      std::span<const ShareBest> bests, int vocab_size) {
  const size_t rows = drafts.size() + 1;
  const size_t shares = bests.size() / rows;
  const auto vocab = static_cast<size_t>(vocab_size);
  if (step.drafts > 0) check_row_masks(step.allowed, rows, vocab);
  std::vector<int32_t> history = step.recent;
  std::vector<Choice> out;
  // In the order choose() checks a row: its mask, its raw logits, the history, then the choice.
  for (size_t row = 0; row < rows; ++row) {
    check_mask(row_mask(step, row, vocab), vocab);
    LogitsCheck check;
    std::optional<Candidate> best;
    for (const ShareBest& share : bests.subspan(row * shares, shares)) {
      if (share.token < -1 || share.token >= vocab_size) {
        throw std::invalid_argument("sampler: a share's best token " + std::to_string(share.token) +
                                    " is outside the vocabulary");
      }
      check.invalid = check.invalid || share.invalid;
      check.possible = check.possible || share.possible;
      if (share.token >= 0 && (!best || share.logit > best->logit)) best = Candidate{share.token, share.logit};
    }
    refuse(check);
    counted_window(history, step.params, vocab);
    const int32_t token = greedy_token(best);
    out.push_back({.token = token});
    if (row == drafts.size() || token != drafts[row]) break;
    history.push_back(token);
  }
  return out;
}

}  // namespace strata::sampling
