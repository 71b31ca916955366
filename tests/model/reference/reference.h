// A deliberately plain forward pass in double precision for GGUF `llama` (Mixtral too: a llama
// with experts), `qwen2`, `qwen3`, `qwen3moe`, `gpt-oss`, `gemma3`, `phi3`, `glm4moe` and
// `deepseek2` models, written from the model definitions only, so that tests can check the
// optimized engine against it. Slow by design: it recomputes everything from scratch, decodes
// every weight row as it uses it, runs every expert on every position, and decompresses
// DeepSeek's latent into every head's full keys and values.
//
// Weight types: F32, F16 and BF16 are decoded here; the block-quantized types the engine can
// compute (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4) are
// expanded to float with tensor::dequantize_row and then used in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "gguf/gguf.h"

namespace strata::reference {

// Of a model with experts, one position's routing in one layer: the experts it chose, in its
// order of choices (the highest first), and every expert's score the choice ranks: its
// router score, or for glm4moe and deepseek2 its probability plus its selection bias, and
// -infinity outside the groups chosen (where the scores are
// close, a forward pass whose hidden states are off a little may choose otherwise). A router
// score off by d moves a ranked score by at most `slope` d: 1, or a sigmoid's 1/4.
// With groups of experts, group_margin is how far the choice of groups is from another: the
// last chosen group's score less the best other group's, which a router score off by d moves
// by at most 4 slope d (a group scores two ranked scores).
struct ExpertChoice {
  std::vector<int> experts;
  std::vector<double> scores;
  double slope = 1.0;
  double group_margin = INFINITY;
};
using ExpertChoices = std::vector<std::vector<ExpertChoice>>;  // [layer][position]

// The logits over the vocabulary after each position of `tokens` (causal: row i depends only
// on tokens[0..i]); of a model with experts, their choices into `expert_choices` when given.
// Throws gguf::Error for a model it cannot run (unknown architecture, missing or misshapen
// tensor, unsupported weight type or RoPE scaling) and std::invalid_argument for tokens
// outside the vocabulary or beyond the context length.
std::vector<std::vector<double>> forward_all(const gguf::File& model, std::span<const int32_t> tokens,
                                             ExpertChoices* expert_choices = nullptr);

}  // namespace strata::reference
