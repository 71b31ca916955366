// How the next token is chosen from the logits.
#pragma once

#include <cstdint>
#include <limits>

namespace strata::sampling {

// The values a request may give a parameter, both ends included; NaN is in no range. The API
// and the node service refuse any other, so the sampler never sees one.
struct Range {
  double min;
  double max;
  bool contains(double value) const { return value >= min && value <= max; }
};
inline constexpr Range kTemperatureRange{0, 2};
inline constexpr Range kTopKRange{0, std::numeric_limits<int32_t>::max()};
inline constexpr Range kProbabilityRange{0, 1};  // top_p, min_p
inline constexpr Range kRepetitionPenaltyRange{0.01, 10};
inline constexpr Range kPresencePenaltyRange{-2, 2};  // presence and frequency penalties
inline constexpr Range kPenaltyLastNRange{-1, std::numeric_limits<int32_t>::max()};

struct SamplingParams {
  float temperature = 0.8f;         // 0 = greedy (argmax; ties -> lowest token id)
  int top_k = 40;                   // <= 0: off
  float top_p = 0.95f;              // >= 1: off
  float min_p = 0.05f;              // <= 0: off
  float repetition_penalty = 1.0f;  // 1: off (llama.cpp's divide-positive/multiply-negative rule)
  float presence_penalty = 0.0f;    // OpenAI semantics
  float frequency_penalty = 0.0f;   // OpenAI semantics
  int penalty_last_n = 64;          // how many recent tokens the penalties look at; -1 = all
  uint64_t seed = 0;                // same seed + same logits sequence -> same tokens
};

}  // namespace strata::sampling
