// How the next token is chosen from the logits.
#pragma once

#include <cstdint>

namespace strata::sampling {

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
