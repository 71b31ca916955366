// The speculative decoding flags of `strata serve`, `run` and `bench`, and the drafter they
// choose for the engine.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/engine.h"
#include "gguf/gguf.h"

namespace strata::cli {

struct SpeculationOptions {
  std::string mode;  // "ngram", "draft" or "off"; empty: "draft" with a draft model, else the default
  int draft_max = 8;
  std::string draft_model;
};

// What `strata serve` and `run` do without --speculative or --draft-model (see docs/PERFORMANCE.md).
inline constexpr const char* kDefaultSpeculation = "ngram";

void add_speculation_options(CLI::App& command, SpeculationOptions& options);

// Sets `engine.drafter` and `engine.draft_max` as the options say, for a model of `target`'s
// vocabulary: prompt lookup, or the draft model's file loaded whole (its forward passes on
// `threads` threads, 0: all cores). Throws std::invalid_argument for a draft model whose
// vocabulary differs from the target's, or --speculative draft without a draft model.
void apply_speculation(const SpeculationOptions& options, const gguf::File& target, int threads,
                       engine::EngineOptions& engine);

// "prompt lookup, up to 8 drafts a step", "off", ...: for a log line.
std::string describe_speculation(const engine::EngineOptions& engine, const SpeculationOptions& options);

}  // namespace strata::cli
