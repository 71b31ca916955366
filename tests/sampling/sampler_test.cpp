#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "counted_allocations.h"
#include "sampling/sampler.h"

namespace strata::sampling {
namespace {

SamplingParams filters_off(float temperature = 1.0f) {
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  return params;
}

std::vector<Candidate> candidates_of(const std::vector<float>& logits) {
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates.push_back({static_cast<int32_t>(i), logits[i]});
  }
  return candidates;
}

// The surviving tokens in increasing order (the filters do not promise an order).
std::vector<int32_t> tokens_of(const std::vector<Candidate>& candidates) {
  std::vector<int32_t> tokens;
  for (const Candidate& c : candidates) tokens.push_back(c.token);
  std::sort(tokens.begin(), tokens.end());
  return tokens;
}

std::vector<float> log_of(const std::vector<float>& probabilities) {
  std::vector<float> logits;
  for (float p : probabilities) logits.push_back(std::log(p));
  return logits;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p;
  for (float l : logits) p.push_back(std::exp((l - max_logit) / temperature));
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= total;
  return p;
}

TEST(Sampler, GreedyPicksTheArgmaxAndTheLowestIdOnTies) {
  Sampler sampler(filters_off(0.0f), 5);
  EXPECT_EQ(sampler.sample(std::vector<float>{0.1f, 2.0f, -1.0f, 1.9f, 0.0f}, {}), 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f, 3.0f}, {}), 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-5.0f, -4.0f, -3.0f, -2.0f, -1.0f}, {}), 4);
}

TEST(Sampler, GreedyStillAppliesPenalties) {
  SamplingParams params = filters_off(0.0f);
  params.repetition_penalty = 2.0f;
  Sampler sampler(params, 3);
  const std::vector<float> logits{1.0f, 3.0f, 2.0f};
  const std::vector<int32_t> history{1};
  EXPECT_EQ(sampler.sample(logits, history), 2);  // 3 / 2 = 1.5 < 2
}

TEST(Penalties, ChangeExactlyTheLogitsOfSeenTokens) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  params.penalty_last_n = -1;
  std::vector<float> logits{4.0f, -4.0f, 1.0f, 0.0f, 7.0f};
  const std::vector<int32_t> history{0, 1, 0, 3, 0, 1};
  apply_penalties(logits, history, params);
  EXPECT_FLOAT_EQ(logits[0], 4.0f / 2.0f - 3 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(logits[1], -4.0f * 2.0f - 2 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f);
  EXPECT_FLOAT_EQ(logits[3], 0.0f * 2.0f - 1 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(logits[4], 7.0f);
}

TEST(Penalties, PresenceSubtractsOnceAndFrequencyPerOccurrence) {
  SamplingParams presence;
  presence.presence_penalty = 1.5f;
  std::vector<float> logits{1.0f, 1.0f, 1.0f};
  apply_penalties(logits, std::vector<int32_t>{2, 2, 2, 0}, presence);
  EXPECT_EQ(logits, (std::vector<float>{-0.5f, 1.0f, -0.5f}));

  SamplingParams frequency;
  frequency.frequency_penalty = 1.0f;
  logits = {1.0f, 1.0f, 1.0f};
  apply_penalties(logits, std::vector<int32_t>{2, 2, 2, 0}, frequency);
  EXPECT_EQ(logits, (std::vector<float>{0.0f, 1.0f, -2.0f}));
}

TEST(Penalties, LookOnlyAtTheLastNTokens) {
  SamplingParams params;
  params.presence_penalty = 1.0f;
  params.penalty_last_n = 2;
  std::vector<float> logits{0.0f, 0.0f, 0.0f, 0.0f};
  apply_penalties(logits, std::vector<int32_t>{0, 1, 2, 3}, params);
  EXPECT_EQ(logits, (std::vector<float>{0.0f, 0.0f, -1.0f, -1.0f}));

  params.penalty_last_n = 0;
  logits = {0.0f, 0.0f, 0.0f, 0.0f};
  apply_penalties(logits, std::vector<int32_t>{0, 1, 2, 3}, params);
  EXPECT_EQ(logits, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
}

TEST(Penalties, RejectHistoryTokensOutsideTheVocabulary) {
  SamplingParams params;
  params.presence_penalty = 1.0f;
  std::vector<float> logits{0.0f, 0.0f};
  EXPECT_THROW(apply_penalties(logits, std::vector<int32_t>{2}, params), std::invalid_argument);
  EXPECT_THROW(apply_penalties(logits, std::vector<int32_t>{-1}, params), std::invalid_argument);
}

TEST(TopK, KeepsExactlyKWithTiesToLowerIds) {
  auto candidates = candidates_of({0.5f, 2.0f, 1.0f, 2.0f, 1.0f, -3.0f});
  keep_top_k(candidates, 3);
  EXPECT_EQ(tokens_of(candidates), (std::vector<int32_t>{1, 2, 3}));
  candidates = candidates_of({1.0f, 1.0f, 1.0f, 1.0f});
  keep_top_k(candidates, 2);
  EXPECT_EQ(tokens_of(candidates), (std::vector<int32_t>{0, 1}));
  candidates = candidates_of({0.5f, 2.0f, 1.0f});
  keep_top_k(candidates, 0);
  EXPECT_EQ(candidates.size(), 3u);
  keep_top_k(candidates, 10);
  EXPECT_EQ(candidates.size(), 3u);
}

TEST(TopP, KeepsTheSmallestPrefixReachingP) {
  const auto logits = log_of({0.05f, 0.5f, 0.15f, 0.3f});
  const auto nucleus = [&](float p) {
    auto candidates = candidates_of(logits);
    keep_top_p(candidates, p);
    return tokens_of(candidates);
  };
  EXPECT_EQ(nucleus(0.4f), (std::vector<int32_t>{1}));
  EXPECT_EQ(nucleus(0.75f), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(nucleus(0.0f), (std::vector<int32_t>{1}));
  EXPECT_EQ(nucleus(0.85f), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(nucleus(0.99f), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(nucleus(1.0f).size(), 4u);
}

TEST(TopP, OnALargeVocabularyMatchesAFullSort) {
  // Flat logits put the boundary deep in the vocabulary, peaked ones near the top.
  for (double spread : {4.0, 40.0}) {
    std::vector<float> logits(5000);
    Random random(7);
    for (float& l : logits) l = static_cast<float>(random.next_unit() * spread);
    std::vector<Candidate> by_likelihood = candidates_of(logits);
    std::sort(by_likelihood.begin(), by_likelihood.end(), [](const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
    });
    const std::vector<double> p = softmax(logits, 1.0);
    for (float top_p : {0.5f, 0.9f, 0.99f}) {
      SCOPED_TRACE(testing::Message() << "spread " << spread << ", top_p " << top_p);
      auto candidates = candidates_of(logits);
      keep_top_p(candidates, top_p);
      double cumulative = 0.0;
      size_t keep = 0;
      while (cumulative < top_p) cumulative += p[static_cast<size_t>(by_likelihood[keep++].token)];
      EXPECT_EQ(tokens_of(candidates),
                tokens_of({by_likelihood.begin(), by_likelihood.begin() + static_cast<std::ptrdiff_t>(keep)}));
    }
  }
}

TEST(MinP, KeepsProbabilitiesAtLeastMinPTimesTheMaximum) {
  const auto logits = log_of({0.05f, 0.5f, 0.15f, 0.3f});
  auto candidates = candidates_of(logits);
  keep_min_p(candidates, 0.2f);  // threshold 0.1
  EXPECT_EQ(tokens_of(candidates), (std::vector<int32_t>{1, 2, 3}));
  candidates = candidates_of(logits);
  keep_min_p(candidates, 0.5f);  // threshold 0.25
  EXPECT_EQ(tokens_of(candidates), (std::vector<int32_t>{1, 3}));
  candidates = candidates_of(logits);
  keep_min_p(candidates, 0.0f);
  EXPECT_EQ(candidates.size(), 4u);
}

TEST(Sampler, AMaskKeepsOnlyAllowedTokensBeforeTheChain) {
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 2.9f, 0.0f, 2.5f};
  const std::vector<uint8_t> allowed{1, 0, 1, 0, 1, 0};
  Sampler greedy(filters_off(0.0f), 6);
  EXPECT_EQ(greedy.sample(logits, {}, allowed), 2);  // the highest allowed logit
  // top_k = 2 counts among the allowed tokens, as if the others were -inf: {2, 0}.
  SamplingParams params = filters_off();
  params.top_k = 2;
  Sampler sampler(params, 6);
  std::vector<int> seen(6);
  for (int i = 0; i < 2000; ++i) ++seen[static_cast<size_t>(sampler.sample(logits, {}, allowed))];
  EXPECT_EQ(seen[1] + seen[3] + seen[4] + seen[5], 0);
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[2], seen[0]);
  // Everything allowed draws exactly what no mask draws.
  Sampler masked(filters_off(), 6), plain(filters_off(), 6);
  const std::vector<uint8_t> all(6, 1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(masked.sample(logits, {}, all), plain.sample(logits, {}));
  const std::vector<uint8_t> none(6, 0);
  EXPECT_THROW(greedy.sample(logits, {}, none), std::invalid_argument);
  EXPECT_THROW(sampler.sample(logits, {}, none), std::invalid_argument);
  EXPECT_THROW(sampler.sample(logits, {}, std::vector<uint8_t>(5, 1)), std::invalid_argument);
}

TEST(Sampler, NeverPicksFilteredTokens) {
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 2.9f, 0.0f, 2.5f};
  SamplingParams params = filters_off();
  params.top_k = 3;
  Sampler sampler(params, 6);
  std::vector<int> seen(6);
  for (int i = 0; i < 2000; ++i) ++seen[static_cast<size_t>(sampler.sample(logits, {}))];
  EXPECT_EQ(seen[0] + seen[2] + seen[4], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[3], 0);
  EXPECT_GT(seen[5], 0);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(i * 0.37));
  const auto run = [&](uint64_t seed) {
    SamplingParams params = filters_off();
    params.seed = seed;
    Sampler sampler(params, 1000);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 100; ++i) tokens.push_back(sampler.sample(logits, tokens));
    return tokens;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  EXPECT_NE(run(0), run(1));
}

TEST(Random, IsPinnedBitForBit) {
  // Tokens must reproduce on every machine: any change to the generator shows up here.
  Random random(0);
  EXPECT_EQ(random.next_u64(), 0x99EC5F36CB75F2B4ull);
  Random bits(12345);
  Random unit(12345);
  EXPECT_EQ(unit.next_unit(), static_cast<double>(bits.next_u64() >> 11) / 9007199254740992.0);
}

std::vector<int> sample_counts(const std::vector<float>& logits, float temperature, int draws) {
  SamplingParams params = filters_off(temperature);
  params.seed = 2024;
  Sampler sampler(params, static_cast<int>(logits.size()));
  std::vector<int> counts(logits.size());
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.sample(logits, {}))];
  return counts;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& p) {
  const double draws = std::accumulate(counts.begin(), counts.end(), 0.0);
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = p[i] * draws;
    sum += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return sum;
}

TEST(Sampler, EmpiricalDistributionMatchesSoftmax) {
  const std::vector<float> logits{0.0f, 1.0f, -0.5f, 2.0f, 0.3f, -1.0f, 1.5f, 0.7f};
  const int draws = 200000;
  // 7 degrees of freedom: 24.32 is the 0.999 quantile (the seed is fixed, so this never flakes).
  EXPECT_LT(chi_square(sample_counts(logits, 1.0f, draws), softmax(logits, 1.0)), 24.32);
  EXPECT_LT(chi_square(sample_counts(logits, 0.5f, draws), softmax(logits, 0.5)), 24.32);
  // The test has the power to see a wrong temperature.
  EXPECT_GT(chi_square(sample_counts(logits, 1.0f, draws), softmax(logits, 0.5)), 1000.0);
}

TEST(Sampler, HandlesALargeVocabularyWithDefaultParams) {
  std::vector<float> logits(128256);
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = static_cast<float>(std::sin(static_cast<double>(i) * 12.9898) * 10.0);
  }
  auto top = candidates_of(logits);
  keep_top_k(top, 40);
  Sampler sampler(SamplingParams{}, static_cast<int>(logits.size()));
  std::vector<int32_t> history;
  for (int i = 0; i < 50; ++i) {
    const int32_t token = sampler.sample(logits, history);
    EXPECT_NE(std::find_if(top.begin(), top.end(), [&](const Candidate& c) { return c.token == token; }),
              top.end());
    history.push_back(token);
  }
}

TEST(Sampler, RejectsBadLogits) {
  Sampler sampler(SamplingParams{}, 3);
  EXPECT_THROW(sampler.sample(std::vector<float>{1.0f, 2.0f}, {}), std::invalid_argument);
  EXPECT_THROW(sampler.sample(std::vector<float>{1.0f, NAN, 0.0f}, {}), std::invalid_argument);
  EXPECT_THROW(sampler.sample(std::vector<float>{-INFINITY, -INFINITY, -INFINITY}, {}),
               std::invalid_argument);
  EXPECT_EQ(sampler.sample(std::vector<float>{-INFINITY, 0.0f, -INFINITY}, {}), 1);
  EXPECT_THROW(Sampler(SamplingParams{}, 0), std::invalid_argument);
}

// choose() is what lets the stage that holds the head sample in the request's place.
TEST(SamplingStep, ChoosesWhatTheRequestsSamplerWouldHaveSampled) {
  std::vector<float> logits(300);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(i * 0.71) * 3);
  std::vector<uint8_t> allowed(logits.size(), 1);
  for (size_t i = 0; i < allowed.size(); i += 3) allowed[i] = 0;
  for (const float temperature : {0.0f, 0.7f}) {
    for (const bool masked : {false, true}) {
      SamplingParams params = filters_off(temperature);
      params.top_k = 50;
      params.repetition_penalty = 1.3f;
      params.frequency_penalty = 0.4f;
      params.penalty_last_n = 5;
      params.seed = 9;
      Sampler local(params, 300), remote(params, 300);
      std::vector<int32_t> history{1, 2, 2, 7};
      for (int i = 0; i < 60; ++i) {
        const std::span<const uint8_t> mask = masked ? std::span<const uint8_t>(allowed) : std::span<const uint8_t>();
        const SamplingStep step = remote.step(history, mask, 2);
        EXPECT_LE(step.recent.size(), 5u) << "only the penalties' window travels";
        const Choice choice = choose(step, logits);
        remote.skip(1);
        const int32_t expected = local.sample(logits, history, mask);
        ASSERT_EQ(choice.token, expected) << "temperature " << temperature << ", token " << i;
        const Logprobs lp = logprobs(logits, expected, 2);
        EXPECT_EQ(choice.logprob, lp.chosen);
        EXPECT_EQ(choice.top, lp.top);
        history.push_back(expected);
      }
    }
  }
  SamplingParams plain = filters_off();
  EXPECT_TRUE(Sampler(plain, 300).step(std::vector<int32_t>{1, 2, 3}, {}, -1).recent.empty()) << "no penalties, no history";
  EXPECT_TRUE(choose(Sampler(plain, 300).step({}, {}, -1), logits).top.empty());
}

// `count` logits in [-3, 3), drawn from `seed`.
std::vector<float> random_logits(size_t count, uint64_t seed) {
  Random random(seed);
  std::vector<float> logits(count);
  for (float& logit : logits) logit = static_cast<float>(random.next_unit() * 6.0 - 3.0);
  return logits;
}

// Speculative decoding's check of drafts chooses at each row what one-at-a-time decoding would
// have chosen there: the same generator draws and the same penalties' window, however many
// drafts hold.
TEST(ChooseAlong, GivesTheTokensOfOneAtATimeUpToTheFirstDraftThatDiffers) {
  constexpr int kVocab = 40;
  constexpr size_t kRows = 9;
  const std::vector<float> rows = random_logits(kRows * kVocab, 11);
  const auto row = [&](size_t r) { return std::span<const float>(rows).subspan(r * kVocab, kVocab); };
  for (const float temperature : {0.0f, 0.9f}) {
    SamplingParams params = filters_off(temperature);
    params.seed = 5;
    params.repetition_penalty = 1.3f;
    params.presence_penalty = 0.4f;
    params.frequency_penalty = 0.2f;
    params.penalty_last_n = 5;  // a window shorter than the history, which the drafts move
    const std::vector<int32_t> start{3, 7, 7, 12, 3, 7};
    // One at a time: the tokens, and what each choice reports.
    Sampler one(params, kVocab);
    std::vector<int32_t> history = start;
    std::vector<Choice> want;
    for (size_t r = 0; r < kRows; ++r) {
      Choice c = choose(one.step(history, {}, 3), row(r));
      one.skip(1);
      history.push_back(c.token);
      want.push_back(std::move(c));
    }
    const auto check = [&](std::vector<int32_t> drafts, size_t expected_choices, const std::string& what) {
      SamplingStep step = Sampler(params, kVocab).step(start, {}, 3);
      step.drafts = static_cast<int>(drafts.size());
      const std::vector<Choice> got =
          choose_along(step, drafts, std::span<const float>(rows).first((drafts.size() + 1) * kVocab));
      ASSERT_EQ(got.size(), expected_choices) << what << ", temperature " << temperature;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].token, want[i].token) << what << ", choice " << i << ", temperature " << temperature;
        EXPECT_EQ(got[i].logprob, want[i].logprob) << what << ", choice " << i;
        EXPECT_EQ(got[i].top, want[i].top) << what << ", choice " << i;
      }
    };
    std::vector<int32_t> right;
    for (size_t i = 0; i + 1 < kRows; ++i) right.push_back(want[i].token);
    check(right, kRows, "every draft right: one more token after them");
    std::vector<int32_t> third_wrong = right;
    third_wrong[2] = (third_wrong[2] + 1) % kVocab;
    check(third_wrong, 3, "the third draft wrong: the right token in its place, and none after");
    std::vector<int32_t> first_wrong = right;
    first_wrong[0] = (first_wrong[0] + 1) % kVocab;
    check(first_wrong, 1, "the first draft wrong");
    check({}, 1, "no drafts");
  }
  SamplingStep step = Sampler(filters_off(), kVocab).step(std::vector<int32_t>{1}, {}, -1);
  const std::vector<int32_t> drafts{4, 5};
  EXPECT_THROW(choose_along(step, drafts, std::span<const float>(rows).first(3 * kVocab)), std::invalid_argument)
      << "a step that says no drafts";
  step.drafts = 2;
  EXPECT_THROW(choose_along(step, drafts, std::span<const float>(rows).first(2 * kVocab)), std::invalid_argument)
      << "a row short";
  step.allowed.assign(kVocab, 1);
  EXPECT_THROW(choose_along(step, drafts, std::span<const float>(rows).first(3 * kVocab)), std::invalid_argument)
      << "one row's mask for a step of three rows";
}

// With a grammar, each row chooses under its own mask, as one-at-a-time decoding would at that
// position; a row's mask that refuses the draft's token makes the choice there differ from it.
TEST(ChooseAlong, ChoosesUnderEachRowsOwnMask) {
  constexpr int kVocab = 30;
  constexpr size_t kRows = 5;
  const std::vector<float> rows = random_logits(kRows * kVocab, 4);
  std::vector<uint8_t> masks(kRows * kVocab);
  for (size_t i = 0; i < masks.size(); ++i) masks[i] = static_cast<uint8_t>((i * 7 + i / kVocab) % 3 != 0);
  const auto row = [&](auto& all, size_t r) { return std::span(all).subspan(r * kVocab, kVocab); };
  for (const float temperature : {0.0f, 0.9f}) {
    SamplingParams params = filters_off(temperature);
    params.seed = 9;
    Sampler one(params, kVocab);
    std::vector<int32_t> history{1, 2};
    std::vector<int32_t> want;
    for (size_t r = 0; r < kRows; ++r) {
      const std::span<const uint8_t> mask = row(masks, r);
      want.push_back(choose(one.step(history, mask, -1), row(rows, r)).token);
      one.skip(1);
      history.push_back(want.back());
    }
    SamplingStep step = Sampler(params, kVocab).step(std::vector<int32_t>{1, 2}, {}, -1);
    step.allowed = masks;
    step.drafts = static_cast<int>(kRows - 1);
    const std::vector<int32_t> drafts(want.begin(), want.end() - 1);
    std::vector<int32_t> got;
    for (const Choice& c : choose_along(step, drafts, rows)) got.push_back(c.token);
    EXPECT_EQ(got, want) << "temperature " << temperature;
    // The first row's mask alone for every row would choose otherwise somewhere.
    step.allowed.clear();
    for (size_t r = 0; r < kRows; ++r) step.allowed.insert(step.allowed.end(), masks.begin(), masks.begin() + kVocab);
    std::vector<int32_t> first_mask_only;
    for (const Choice& c : choose_along(step, drafts, rows)) first_mask_only.push_back(c.token);
    EXPECT_NE(first_mask_only, want) << "temperature " << temperature;
  }
}

TEST(Logprobs, MatchAHandComputedLogSoftmax) {
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 3.0f};
  const double log_normalizer = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  const Logprobs result = logprobs(logits, 2, 3);
  EXPECT_NEAR(result.chosen, 2.0 - log_normalizer, 1e-6);
  ASSERT_EQ(result.top.size(), 3u);
  EXPECT_EQ(result.top[0].first, 1);
  EXPECT_EQ(result.top[1].first, 3);
  EXPECT_EQ(result.top[2].first, 2);
  EXPECT_NEAR(result.top[0].second, 3.0 - log_normalizer, 1e-6);
  EXPECT_NEAR(result.top[1].second, 3.0 - log_normalizer, 1e-6);
  EXPECT_NEAR(result.top[2].second, 2.0 - log_normalizer, 1e-6);
  EXPECT_EQ(logprobs(logits, 0, 10).top.size(), 4u);
  EXPECT_TRUE(logprobs(logits, 0, 0).top.empty());
  EXPECT_THROW(logprobs(logits, 4, 1), std::invalid_argument);
}

TEST(Logprobs, StayFiniteForExtremeLogits) {
  const std::vector<float> logits{1000.0f, -1000.0f, 999.0f};
  const Logprobs result = logprobs(logits, 2, 1);
  EXPECT_NEAR(result.chosen, -1.0 - std::log1p(std::exp(-1.0)), 1e-5);
  EXPECT_NEAR(result.top[0].second, -std::log1p(std::exp(-1.0)), 1e-5);
}

// The tokens choose() or choose_along() gives, or their refusal's words.
std::string chosen_or_refused(const std::function<std::vector<Choice>()>& choose) {
  try {
    std::string tokens;
    for (const Choice& c : choose()) tokens += std::to_string(c.token) + " ";
    return tokens;
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

TEST(ChooseFromBests, ChoosesWhatChooseAndChooseAlongDoFromWholeRowsForAnySharesOfThem) {
  constexpr int kVocab = 40;
  std::mt19937 random(7);
  const auto pick = [&](int n) { return static_cast<int>(random() % static_cast<unsigned>(n)); };
  int refused = 0;
  int continued = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    SamplingStep step;
    step.params = filters_off(0.0f);
    step.drafts = pick(3) == 0 ? 1 + pick(3) : 0;
    const size_t rows = static_cast<size_t>(step.drafts) + 1;
    // Few distinct values, so that most rows have ties for the best, across shares too.
    std::vector<float> logits(rows * kVocab);
    for (float& logit : logits) logit = static_cast<float>(pick(5)) - 2.0f;
    const auto any = [&] { return static_cast<size_t>(pick(static_cast<int>(logits.size()))); };
    switch (pick(8)) {
      case 0: logits[any()] = NAN; break;
      case 1: logits[any()] = INFINITY; break;
      case 2: std::fill(logits.begin(), logits.begin() + kVocab * pick(static_cast<int>(rows) + 1), -INFINITY); break;
      case 3: for (int i = 0; i < kVocab / 2; ++i) logits[any()] = -INFINITY; break;
      default: break;
    }
    if (pick(2) == 0) {
      step.params.repetition_penalty = 1.3f;
      step.params.presence_penalty = 0.5f;
      step.params.frequency_penalty = 0.25f;
      step.params.penalty_last_n = 10;  // the window moves as the drafts join the history
      for (int i = 0; i < 10; ++i) step.recent.push_back(pick(kVocab));
      if (pick(20) == 0) step.recent.push_back(kVocab + 3);  // outside the vocabulary
    }
    switch (pick(4)) {
      case 0:  // masks that leave a few tokens, or none
        step.allowed.assign(rows * kVocab, 0);
        for (int i = pick(4 * static_cast<int>(rows)); i > 0; --i) step.allowed[any()] = 1;
        break;
      case 1:
        if (pick(10) == 0) step.allowed.assign(kVocab - 1, 1);  // of the wrong size
        break;
      default: break;
    }
    // Drafts that are mostly each row's best, so that the steps go on past them.
    std::vector<int32_t> drafts;
    for (size_t r = 0; r + 1 < rows; ++r) {
      const auto row = std::span<const float>(logits).subspan(r * kVocab, kVocab);
      drafts.push_back(pick(4) == 0 ? pick(kVocab) : static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
    }
    // 1 to 4 shares of uneven sizes, in vocabulary order.
    std::vector<int> bounds{0, kVocab};
    for (int cuts = pick(4); cuts > 0; --cuts) bounds.push_back(1 + pick(kVocab - 1));
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    const size_t shares = bounds.size() - 1;
    std::vector<ShareBest> bests(rows * shares);
    for (size_t b = 0; b < shares; ++b) {
      const auto width = static_cast<size_t>(bounds[b + 1] - bounds[b]);
      std::vector<float> share;
      for (size_t r = 0; r < rows; ++r) {
        const auto row = logits.begin() + static_cast<std::ptrdiff_t>(r * kVocab) + bounds[b];
        share.insert(share.end(), row, row + static_cast<std::ptrdiff_t>(width));
      }
      const std::vector<ShareBest> mine = bests_in_share(step, drafts, share, bounds[b], kVocab);
      ASSERT_EQ(mine.size(), rows);
      for (size_t r = 0; r < rows; ++r) bests[r * shares + b] = mine[r];
    }
    const std::string whole = chosen_or_refused([&] {
      return step.drafts == 0 ? std::vector<Choice>{choose(step, logits)} : choose_along(step, drafts, logits);
    });
    EXPECT_EQ(chosen_or_refused([&] { return choose_from_bests(step, drafts, bests, kVocab); }), whole)
        << "trial " << trial << ", " << step.drafts << " drafts, " << shares << " shares";
    refused += whole.starts_with("sampler:") ? 1 : 0;
    continued += std::count(whole.begin(), whole.end(), ' ') > 1 ? 1 : 0;
  }
  // choose()'s refusals were met, and steps that went on past a draft.
  EXPECT_GT(refused, 400);
  EXPECT_GT(continued, 200);
}

TEST(ChooseFromBests, RefuseABestOutsideTheVocabulary) {
  SamplingStep step;
  step.params = filters_off(0.0f);
  for (const int32_t token : {-2, 40, 1 << 30}) {
    const std::vector<ShareBest> bests{{.token = 3, .logit = 1.0f, .possible = true},
                                       {.token = token, .logit = 2.0f, .possible = true}};
    EXPECT_THROW(choose_from_bests(step, {}, bests, 40), std::invalid_argument) << token;
  }
  const std::vector<ShareBest> none{{.token = -1, .possible = true}, {.token = 39, .logit = 2.0f, .possible = true}};
  EXPECT_EQ(choose_from_bests(step, {}, none, 40).front().token, 39);
}

TEST(ChooseFromBests, AreForGreedyStepsWithoutLogprobs) {
  SamplingStep step;
  step.params.temperature = 0.0f;
  step.drafts = 2;
  EXPECT_TRUE(chooses_from_bests(step));
  step.top_logprobs = 0;
  EXPECT_FALSE(chooses_from_bests(step));
  step.top_logprobs = -1;
  step.params.temperature = 0.7f;
  EXPECT_FALSE(chooses_from_bests(step));
}

// choose() makes a Sampler a step. Above the server's mmap threshold a fresh buffer of a
// vocabulary's size would be fresh pages each token; after a thread's first choice, none is
// allocated: greedy or sampled, with penalties and logprobs.
TEST(SamplingStep, ChoosingAgainAllocatesNothingOfTheVocabularysSize) {
  const std::vector<float> logits = random_logits(151936, 5);
  const int vocab = static_cast<int>(logits.size());
  SamplingParams sampled;
  sampled.repetition_penalty = 1.1f;
  sampled.seed = 3;
  const std::vector<int32_t> history{5, 9, 9};
  const std::vector<SamplingStep> steps{Sampler(sampled, vocab).step(history, {}, 3),
                                        Sampler(filters_off(0.0f), vocab).step(history, {}, -1),
                                        Sampler(filters_off(0.8f), vocab).step({}, {}, -1)};
  for (const SamplingStep& step : steps) choose(step, logits);
  const tests::CountedAllocations counted(logits.size() * sizeof(float) / 2);
  for (int i = 0; i < 3; ++i) {
    for (const SamplingStep& step : steps) choose(step, logits);
  }
  EXPECT_EQ(counted.count(), 0u);
}

}  // namespace
}  // namespace strata::sampling
