#include <chrono>
#include <cstdio>
#include <future>
#include <random>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/option_checks.h"
#include "cli/speculation.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

struct RunOptions {
  std::string model;
  std::string prompt;
  int max_tokens = 128;
  int threads = 0;
  int context = 0;
  int64_t seed = -1;
  sampling::SamplingParams sampling;
  SpeculationOptions speculation;
};

int run(const RunOptions& o) {
  engine::EngineOptions engine_options;
  engine_options.context_size = o.context;
  engine_options.max_parallel = 1;
  engine_options.threads = o.threads;
  const LoadedModel loaded = load_for_generation(o.model, engine_options, &o.speculation);
  const tokenizer::Tokenizer& tokenizer = *loaded.tokenizer;
  engine::Engine& engine = *loaded.engine;
  const std::vector<tokenizer::Token> prompt =
      tokenizer.encode(o.prompt, tokenizer.add_bos_by_default(), /*parse_special=*/true);

  engine::GenerationRequest request;
  request.prompt = prompt;
  request.sampling = o.sampling;
  request.sampling.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
  const int context = engine.limits().context_size;
  request.max_tokens = std::min<int>(o.max_tokens, context - static_cast<int>(prompt.size()));
  if (request.max_tokens < 1) {
    throw std::invalid_argument("the prompt has " + std::to_string(prompt.size()) +
                                " tokens, which leaves no room in the context of " +
                                std::to_string(context));
  }

  tokenizer::StreamDecoder decoder(tokenizer);
  std::fputs(o.prompt.c_str(), stdout);
  std::fflush(stdout);
  std::promise<std::string> done;
  int generated = 0;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first_token;
  engine::RequestCallbacks callbacks;
  int accepted = 0;
  int drafted = 0;
  callbacks.on_token = [&](const engine::GeneratedToken& t) {
    if (generated++ == 0) first_token = std::chrono::steady_clock::now();
    accepted = t.drafts_accepted;
    drafted = t.drafts_accepted + t.drafts_rejected;
    if (!t.end_of_generation) {
      std::fputs(decoder.push(t.token).c_str(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  callbacks.on_finish = [&](engine::FinishReason reason, const std::string& error) {
    done.set_value(reason == engine::FinishReason::Error ? error : std::string());
  };
  engine.submit(std::move(request), std::move(callbacks));
  const std::string error = done.get_future().get();
  std::fputs(decoder.finish().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (!error.empty()) throw std::runtime_error(error);

  const auto end = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(first_token - start).count();
  const double decode_s = std::chrono::duration<double>(end - first_token).count();
  std::fprintf(stderr, "strata: prompt %zu tokens in %.2f s; generated %d tokens", prompt.size(),
               prefill_s, generated);
  if (generated > 1 && decode_s > 0) std::fprintf(stderr, " at %.1f tokens/s", (generated - 1) / decode_s);
  if (drafted > 0) std::fprintf(stderr, "; %d of %d drafts accepted", accepted, drafted);
  std::fprintf(stderr, " (seed %llu)\n", static_cast<unsigned long long>(request.sampling.seed));
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, Action& action) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate a continuation of a prompt, streamed to stdout");
  cmd->add_option("-m,--model", options->model,
                  "GGUF model file, or OWNER/REPO[:FILE] on Hugging Face "
                  "(default: a generated random-weight demo model)");
  cmd->add_option("-p,--prompt", options->prompt, "Prompt text")->required();
  cmd->add_option("-n,--max-tokens", options->max_tokens, "Tokens to generate")->check(positive_number());
  cmd->add_option("--temp", options->sampling.temperature, "Temperature (0 = greedy)")->check(non_negative_number());
  cmd->add_option("--top-k", options->sampling.top_k, "Top-k (0 = off)");
  cmd->add_option("--top-p", options->sampling.top_p, "Top-p (1 = off)");
  cmd->add_option("--min-p", options->sampling.min_p, "Min-p (0 = off)");
  cmd->add_option("--repeat-penalty", options->sampling.repetition_penalty, "Repetition penalty (1 = off)");
  cmd->add_option("--presence-penalty", options->sampling.presence_penalty, "Presence penalty");
  cmd->add_option("--frequency-penalty", options->sampling.frequency_penalty, "Frequency penalty");
  cmd->add_option("--seed", options->seed, "Random seed (default: random, printed at the end)");
  cmd->add_option("-t,--threads", options->threads, "Threads (default: all cores)")->check(non_negative_number());
  cmd->add_option("-c,--ctx-size", options->context, "Context size (default: the model's)")->check(non_negative_number());
  add_speculation_options(*cmd, options->speculation);
  cmd->callback([&action, options] { action = [options] { return run(*options); }; });
}

}  // namespace strata::cli
