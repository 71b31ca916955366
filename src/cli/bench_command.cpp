#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <latch>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/option_checks.h"
#include "cli/speculation.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

struct BenchOptions {
  std::string model;
  int prompt_tokens = 128;
  int generated_tokens = 64;
  int depth = 0;  // tokens already in the context when each prefill and decode run starts
  int threads = 2;
  int repetitions = 3;
  bool bandwidth = true;
  std::vector<int> streams;  // concurrent request counts to measure through the engine
  int ttft_prompt = 0;       // prompt length for a time-to-first-token measurement
  int ttft_cached = 0;       // leading tokens of that prompt found in the prefix cache
  std::string kv_type = "f16";
  std::string speculative_prompt;  // measure one stream with and without speculative decoding on it
  SpeculationOptions speculation;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string fixed(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

// The type most of the model's bytes are stored in, for the report.
std::string dominant_type(const gguf::File& file) {
  std::vector<std::pair<uint64_t, uint32_t>> bytes_by_type;
  for (const gguf::TensorInfo& t : file.tensors()) {
    auto it = std::find_if(bytes_by_type.begin(), bytes_by_type.end(), [&](auto& p) { return p.second == t.type; });
    if (it == bytes_by_type.end()) bytes_by_type.push_back({t.size_bytes, t.type});
    else it->first += t.size_bytes;
  }
  const auto top = std::max_element(bytes_by_type.begin(), bytes_by_type.end());
  return top == bytes_by_type.end() ? "?" : tensor::dtype_info(top->second)->name;
}

// Runs `count` requests at once through the engine (the serving path, continuous batching) and
// returns the aggregate generated tokens per second, and the first token's latency.
struct EngineRun {
  double tokens_per_second = 0;
  double first_token_seconds = 0;
};

// `count` concurrent requests of `prompt_tokens` each; with `cached` > 0 one request first
// puts that many of their leading tokens in the prefix cache, and is not measured.
// `speculation`: its drafter and draft_max (none: plain decoding).
EngineRun run_engine(const std::shared_ptr<model::Model>& model, int count, int prompt_tokens,
                     int generated_tokens, int threads, model::KvType kv_type, int cached = 0,
                     const engine::EngineOptions& speculation = {}) {
  engine::EngineOptions options;
  options.drafter = speculation.drafter;
  options.draft_max = speculation.draft_max;
  options.max_parallel = count;
  options.threads = threads;
  options.kv_type = kv_type;
  options.prefill_chunk = std::max(256, prompt_tokens);
  // Random weights may produce the end-of-text token at any time; a benchmark must not stop.
  engine::Engine engine(model, [](engine::Token) { return false; }, options);
  const int vocab = model->config().vocab_size;
  if (cached > 0) {
    engine::GenerationRequest warm;
    // The measured prompts' first `cached` tokens, then others.
    for (int i = 0; i < prompt_tokens; ++i) {
      warm.prompt.push_back(static_cast<engine::Token>(((i < cached ? i : i + 1) * 7919 + 3) % vocab));
    }
    warm.max_tokens = 1;
    std::latch warmed(1);
    engine::RequestCallbacks callbacks;
    callbacks.on_finish = [&](engine::FinishReason, const std::string&) { warmed.count_down(); };
    engine.submit(std::move(warm), std::move(callbacks));
    warmed.wait();
  }
  std::latch done(count);
  std::vector<std::chrono::steady_clock::time_point> first_token(static_cast<size_t>(count));
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < count; ++r) {
    engine::GenerationRequest request;
    for (int i = 0; i < prompt_tokens; ++i) request.prompt.push_back(static_cast<engine::Token>((i * 7919 + r * 31 + 3) % vocab));
    request.max_tokens = generated_tokens;
    request.sampling.temperature = 0;
    engine::RequestCallbacks callbacks;
    bool seen = false;
    callbacks.on_token = [&, r, seen](const engine::GeneratedToken&) mutable {
      if (!seen) first_token[static_cast<size_t>(r)] = std::chrono::steady_clock::now();
      seen = true;
      return true;
    };
    callbacks.on_finish = [&](engine::FinishReason, const std::string&) { done.count_down(); };
    engine.submit(std::move(request), std::move(callbacks));
  }
  done.wait();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {count * generated_tokens / seconds, std::chrono::duration<double>(first_token[0] - start).count()};
}

// One greedy stream of `prompt` through the engine: its decode speed (tokens after the first
// over the time after the first) and what its drafts came to.
struct StreamRun {
  double decode_tokens_per_second = 0;
  int generated = 0;
  int accepted = 0;
  int drafted = 0;
};

StreamRun run_stream(const std::shared_ptr<model::Model>& model, const std::vector<engine::Token>& prompt,
                     int generated_tokens, int threads, model::KvType kv_type, engine::EngineOptions speculation) {
  engine::EngineOptions options = std::move(speculation);
  options.max_parallel = 1;
  options.threads = threads;
  options.kv_type = kv_type;
  options.context_size = static_cast<int>(prompt.size()) + generated_tokens;
  // As run_engine: the measured stream must not stop early.
  engine::Engine engine(model, [](engine::Token) { return false; }, options);
  engine::GenerationRequest request;
  request.prompt = prompt;
  request.max_tokens = generated_tokens;
  request.sampling.temperature = 0;
  std::latch done(1);
  StreamRun run;
  std::chrono::steady_clock::time_point first, last;
  engine::RequestCallbacks callbacks;
  callbacks.on_token = [&](const engine::GeneratedToken& t) {
    last = std::chrono::steady_clock::now();
    if (run.generated++ == 0) first = last;
    run.accepted = t.drafts_accepted;
    run.drafted = t.drafts_accepted + t.drafts_rejected;
    return true;
  };
  callbacks.on_finish = [&](engine::FinishReason, const std::string&) { done.count_down(); };
  engine.submit(std::move(request), std::move(callbacks));
  done.wait();
  const double seconds = std::chrono::duration<double>(last - first).count();
  if (run.generated > 1 && seconds > 0) run.decode_tokens_per_second = (run.generated - 1) / seconds;
  return run;
}

// Speculative decoding against plain decoding of one greedy stream, in turns (which goes first
// alternates), so that a shared machine's drift falls on both alike.
int bench_speculation(const BenchOptions& o, const std::string& path, const std::shared_ptr<const gguf::File>& file,
                      const std::shared_ptr<model::Model>& model) {
  const auto tokenizer = tokenizer::Tokenizer::from_gguf(*file);
  const std::vector<engine::Token> prompt =
      tokenizer->encode(o.speculative_prompt, tokenizer->add_bos_by_default(), /*parse_special=*/true);
  if (static_cast<int>(prompt.size()) + o.generated_tokens > model->config().context_length) {
    throw std::invalid_argument("the prompt's " + std::to_string(prompt.size()) + " tokens and -n " +
                                std::to_string(o.generated_tokens) + " exceed the model's context of " +
                                std::to_string(model->config().context_length));
  }
  engine::EngineOptions speculating;
  SpeculationOptions wanted = o.speculation;
  if (wanted.mode.empty() || wanted.mode == "off") wanted.mode = wanted.draft_model.empty() ? "ngram" : "draft";
  apply_speculation(wanted, *file, o.threads, speculating);
  const model::KvType kv_type = *model::parse_kv_type(o.kv_type);
  std::vector<double> plain_rates, speculative_rates, ratios;
  StreamRun last;
  std::printf("model: %s\n", path.c_str());
  std::printf("one greedy stream, %zu prompt tokens, %d generated, %d threads; %s\n", prompt.size(), o.generated_tokens,
              o.threads, describe_speculation(speculating, wanted).c_str());
  for (int rep = 0; rep < o.repetitions + 1; ++rep) {  // the first pair only warms up
    StreamRun plain, speculative;
    if (rep % 2 == 0) {
      plain = run_stream(model, prompt, o.generated_tokens, o.threads, kv_type, {});
      speculative = run_stream(model, prompt, o.generated_tokens, o.threads, kv_type, speculating);
    } else {
      speculative = run_stream(model, prompt, o.generated_tokens, o.threads, kv_type, speculating);
      plain = run_stream(model, prompt, o.generated_tokens, o.threads, kv_type, {});
    }
    if (rep == 0) continue;
    plain_rates.push_back(plain.decode_tokens_per_second);
    speculative_rates.push_back(speculative.decode_tokens_per_second);
    ratios.push_back(speculative.decode_tokens_per_second / plain.decode_tokens_per_second);
    last = speculative;
    std::printf("  run %d: plain %.1f tokens/s, speculative %.1f tokens/s (x%.2f)\n", rep,
                plain.decode_tokens_per_second, speculative.decode_tokens_per_second, ratios.back());
  }
  const auto range = [](const std::vector<double>& v) {
    return fixed(*std::min_element(v.begin(), v.end())) + "-" + fixed(*std::max_element(v.begin(), v.end()));
  };
  std::printf("decode, plain: %.1f tokens/s (median of %d; %s)\n", median(plain_rates), o.repetitions,
              range(plain_rates).c_str());
  std::printf("decode, speculative: %.1f tokens/s (median of %d; %s)\n", median(speculative_rates), o.repetitions,
              range(speculative_rates).c_str());
  std::printf("speed-up: x%.2f (median; x%.2f-x%.2f)\n", median(ratios), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
  const int steps = last.generated - last.accepted;
  std::printf("drafts: %d of %d accepted (%.0f%%); %.2f tokens a step\n", last.accepted, last.drafted,
              last.drafted > 0 ? 100.0 * last.accepted / last.drafted : 0.0,
              steps > 0 ? static_cast<double>(last.generated) / steps : 0.0);
  return 0;
}

int bench(const BenchOptions& o) {
  const std::string path = model_path_or_demo(o.model);
  std::shared_ptr<const gguf::File> file = gguf::File::open(path);
  std::shared_ptr<model::Model> model = model::Model::load(file);
  if (!o.speculative_prompt.empty()) return bench_speculation(o, path, file, model);
  const model::Config& c = model->config();
  if (o.depth + std::max(o.prompt_tokens, o.generated_tokens) > c.context_length) {
    throw std::invalid_argument("--depth plus -p or -n exceeds the model's context of " +
                                std::to_string(c.context_length));
  }
  tensor::ThreadPool pool(o.threads);
  const model::KvType kv_type = *model::parse_kv_type(o.kv_type);
  auto tokens = [&](int count) {
    std::vector<model::Token> t(static_cast<size_t>(count));
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<model::Token>((i * 7919 + 3) % c.vocab_size);
    return t;
  };
  const std::vector<model::Token> prompt = tokens(o.prompt_tokens);
  const std::vector<model::Token> context = tokens(o.depth);
  // A fresh sequence holding --depth tokens, as the prefill and the decode run each start
  // from (llama-bench's pp and tg tests, and its -d).
  auto sequence_at_depth = [&](int more_tokens) {
    auto kv = model->new_sequence(o.depth + more_tokens, kv_type);
    if (o.depth > 0) {
      model::SequenceSlice slice{kv.get(), o.depth};
      model->forward({&slice, 1}, context, {}, pool);
    }
    return kv;
  };

  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const double weight_gb = static_cast<double>(model->weight_bytes()) / 1e9;
  // The bandwidth is measured between every kSegmentTokens decode tokens: on a shared VM it
  // can change by half within a second, and a probe further away would misstate the share.
  std::optional<BandwidthProbe> probe;
  if (o.bandwidth) probe.emplace(o.threads);
  constexpr int kProbePasses = 3;
  constexpr int kSegmentTokens = 16;
  std::vector<double> prefill_rates, decode_rates, shares;
  std::vector<std::string> run_reports;
  for (int rep = 0; rep < o.repetitions + 1; ++rep) {  // the first run only warms up
    const bool measured = rep > 0;
    auto kv = sequence_at_depth(o.prompt_tokens);
    model::SequenceSlice slice{kv.get(), o.prompt_tokens};
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> logits = model->forward({&slice, 1}, prompt, {}, pool);
    const double prefill_s = seconds_since(start);

    kv = sequence_at_depth(o.generated_tokens);
    model::Token next = prompt.front();
    const bool probing = probe && measured;
    double bandwidth_before = probing ? probe->median_of(kProbePasses) : 0;
    double decode_s = 0;
    std::string segments;
    for (int done = 0; done < o.generated_tokens;) {
      const int count = std::min(kSegmentTokens, o.generated_tokens - done);
      const auto segment_start = std::chrono::steady_clock::now();
      for (int i = 0; i < count; ++i) {
        model::SequenceSlice step{kv.get(), 1};
        logits = model->forward({&step, 1}, {&next, 1}, {}, pool);
        next = static_cast<model::Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      const double segment_s = seconds_since(segment_start);
      decode_s += segment_s;
      done += count;
      if (!probing) continue;
      const double bandwidth_after = probe->median_of(kProbePasses);
      const double low = std::min(bandwidth_before, bandwidth_after);
      const double high = std::max(bandwidth_before, bandwidth_after);
      // A segment whose bandwidth moved by more than 15% from before to after cannot be compared with it.
      if (high < 1.15 * low) {
        const double share = weight_gb * 1e9 * count / segment_s / ((low + high) / 2);
        shares.push_back(share);
        segments += ", " + fixed(100 * share) + "% at " + fixed((low + high) / 2e9);
      } else {
        segments += ", moved " + fixed(bandwidth_before / 1e9) + "->" + fixed(bandwidth_after / 1e9);
      }
      bandwidth_before = bandwidth_after;
    }
    if (!measured) continue;
    prefill_rates.push_back(o.prompt_tokens / prefill_s);
    decode_rates.push_back(o.generated_tokens / decode_s);
    if (probing) run_reports.push_back(std::to_string(rep) + ": decode " + fixed(decode_rates.back()) + " tokens/s" + segments);
  }
  const double prefill = median(prefill_rates);
  const double decode = median(decode_rates);
  std::printf("model: %s\n", path.c_str());
  std::printf("shape: %s, %d layers, dim %d, vocab %d; weights %s, %.3f GB read per token\n",
              c.arch_name.c_str(), c.layer_count, c.embedding_dim, c.vocab_size, dominant_type(*file).c_str(), weight_gb);
  std::printf("kernels: %s, %d threads, median of %d runs; KV cache %s\n", tensor::isa_name(tensor::detected_isa()),
              o.threads, o.repetitions, o.kv_type.c_str());
  const std::string at_depth = o.depth > 0 ? " @ d" + std::to_string(o.depth) : "";
  std::printf("prefill pp%d%s: %.1f tokens/s\n", o.prompt_tokens, at_depth.c_str(), prefill);
  std::printf("decode  tg%d%s: %.1f tokens/s\n", o.generated_tokens, at_depth.c_str(), decode);
  if (!o.streams.empty() || o.ttft_prompt > 0) {
    // Through the engine, with speculative decoding only when a flag asks for it.
    engine::EngineOptions speculation;
    if (!o.speculation.mode.empty() || !o.speculation.draft_model.empty()) {
      apply_speculation(o.speculation, *file, o.threads, speculation);
    }
    for (int count : o.streams) {
      const EngineRun run = run_engine(model, count, 16, o.generated_tokens, o.threads, kv_type, 0, speculation);
      std::printf("engine, %d concurrent requests (16-token prompts, %d tokens each): %.1f tokens/s aggregate%s\n",
                  count, o.generated_tokens, run.tokens_per_second,
                  speculation.drafter ? (", " + describe_speculation(speculation, o.speculation)).c_str() : "");
    }
    if (o.ttft_prompt > 0) {
      const EngineRun run = run_engine(model, 1, o.ttft_prompt, 1, o.threads, kv_type);
      std::printf("engine, time to first token for a %d-token prompt: %.3f s\n", o.ttft_prompt, run.first_token_seconds);
    }
    if (o.ttft_prompt > 0 && o.ttft_cached > 0) {
      const EngineRun run = run_engine(model, 1, o.ttft_prompt, 1, o.threads, kv_type, o.ttft_cached);
      std::printf("engine, time to first token for a %d-token prompt whose first %d are cached: %.3f s\n",
                  o.ttft_prompt, o.ttft_cached, run.first_token_seconds);
    }
  }
  if (probe) {
    std::printf("share of the memory read bandwidth (GB/s; %d threads, median of %d passes) measured before and\n"
                "after each %d decode tokens:\n",
                o.threads, kProbePasses, kSegmentTokens);
    for (const std::string& report : run_reports) std::printf("  run %s\n", report.c_str());
    if (shares.empty()) {
      std::printf("decode reads %.1f GB/s; the bandwidth moved during every segment, so no share\n", weight_gb * decode);
    } else {
      std::printf("decode reads %.1f GB/s = %.0f%% of the bandwidth around it (median of %zu steady segments' shares)\n",
                  weight_gb * decode, 100.0 * median(shares), shares.size());
    }
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, Action& action) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed (tokens/s)");
  cmd->add_option("-m,--model", options->model,
                  "GGUF model file, or OWNER/REPO[:FILE] on Hugging Face "
                  "(default: the generated demo model)");
  cmd->add_option("-p,--prompt-tokens", options->prompt_tokens, "Prompt length for prefill")->check(positive_number());
  cmd->add_option("-n,--gen-tokens", options->generated_tokens, "Tokens to decode")->check(positive_number());
  cmd->add_option("-d,--depth", options->depth,
                  "Tokens already in the context when each prefill and decode run starts (as llama-bench's -d)")
      ->check(non_negative_number());
  cmd->add_option("-t,--threads", options->threads, "Threads")->check(positive_number());
  cmd->add_option("-r,--repetitions", options->repetitions, "Measured runs (the median is reported)")->check(positive_number());
  cmd->add_flag("!--no-bandwidth", options->bandwidth, "Skip the memory bandwidth probe");
  cmd->add_option("--streams", options->streams,
                  "Also measure aggregate decode through the engine with this many concurrent requests (e.g. 1,4,8)")
      ->delimiter(',')->check(positive_number());
  CLI::Option* ttft =
      cmd->add_option("--ttft", options->ttft_prompt, "Also measure time to first token for a prompt of this length")
          ->check(positive_number());
  cmd->add_option("--ttft-cached", options->ttft_cached,
                  "With --ttft, also measure it when this many leading prompt tokens are in the prefix cache")
      ->check(non_negative_number())
      ->needs(ttft);
  cmd->add_option("--kv-type", options->kv_type, "How keys and values are stored: f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))->capture_default_str();
  cmd->add_option("--speculative-prompt", options->speculative_prompt,
                  "Instead: decode of one greedy stream of -n tokens after this prompt, with and without "
                  "speculative decoding in turns, -r times, and the drafts' acceptance");
  add_speculation_options(*cmd, options->speculation);
  cmd->callback([&action, options] { action = [options] { return bench(*options); }; });
}

}  // namespace strata::cli
