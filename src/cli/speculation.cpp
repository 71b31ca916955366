#include "cli/speculation.h"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "cli/model_source.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

constexpr int kMostDrafts = 64;

std::string mode_of(const SpeculationOptions& o) {
  if (!o.mode.empty()) return o.mode;
  return o.draft_model.empty() ? kDefaultSpeculation : "draft";
}

// The first difference between the two files' vocabularies, or empty when they are the same.
std::string vocabulary_difference(const gguf::File& target, const gguf::File& draft) {
  const auto a = tokenizer::Tokenizer::from_gguf(target);
  const auto b = tokenizer::Tokenizer::from_gguf(draft);
  if (a->vocab_size() != b->vocab_size()) {
    return "it has " + std::to_string(b->vocab_size()) + " tokens, the model " + std::to_string(a->vocab_size());
  }
  for (int t = 0; t < a->vocab_size(); ++t) {
    if (a->token_text(t) != b->token_text(t)) {
      return "its token " + std::to_string(t) + " is '" + b->token_text(t) + "', the model's '" + a->token_text(t) + "'";
    }
  }
  return {};
}

}  // namespace

void add_speculation_options(CLI::App& command, SpeculationOptions& o) {
  command
      .add_option("--speculative", o.mode,
                  std::string("Speculative decoding: ngram (drafts by prompt lookup), draft (by --draft-model) or off "
                              "(default: draft with a draft model, else ") +
                      kDefaultSpeculation + ")")
      ->check(CLI::IsMember({"ngram", "draft", "off"}));
  command.add_option("--draft-max", o.draft_max, "Draft tokens a step checks at most")
      ->check(CLI::Range(1, kMostDrafts))
      ->capture_default_str();
  command.add_option("--draft-model", o.draft_model,
                     "A small GGUF model of the same vocabulary that drafts tokens (greedy), run where requests are "
                     "scheduled");
}

void apply_speculation(const SpeculationOptions& o, const gguf::File& target, int threads,
                       engine::EngineOptions& engine) {
  const std::string mode = mode_of(o);
  engine.draft_max = std::clamp(o.draft_max, 1, kMostDrafts);
  engine.drafter.reset();
  if (mode == "off") return;
  if (mode == "ngram") {
    engine.drafter = std::make_shared<engine::PromptLookupDrafter>();
    return;
  }
  if (o.draft_model.empty()) throw std::invalid_argument("--speculative draft needs a --draft-model FILE");
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path(o.draft_model));
  if (const std::string why = vocabulary_difference(target, *file); !why.empty()) {
    throw std::invalid_argument("the draft model " + o.draft_model + " has another vocabulary than the model: " + why);
  }
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  engine.drafter = std::make_shared<engine::ModelDrafter>(model::Model::load(file), threads);
}

std::string describe_speculation(const engine::EngineOptions& engine, const SpeculationOptions& o) {
  if (!engine.drafter) return "speculative decoding off";
  const std::string source = mode_of(o) == "draft" ? "draft model " + o.draft_model : "prompt lookup";
  return "speculative decoding by " + source + ", up to " + std::to_string(engine.draft_max) + " drafts a step";
}

}  // namespace strata::cli
