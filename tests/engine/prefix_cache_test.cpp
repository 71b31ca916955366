// The prefix cache changes how much of a prompt is computed, never what comes out: every
// request gives the same tokens and log-probabilities with the cache on and off, on one stage
// and on three, whatever its stages still hold.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <future>

#include "engine/engine.h"
#include "engine/local_stage.h"
#include "model/synthetic.h"
#include "outcome.h"

namespace strata::engine {
namespace {

constexpr int kContext = 128;

// The shared model's layers over stages cut at `cuts`, each with its own thread and pool.
struct Cluster {
  Cluster(const std::vector<int>& cuts, bool prefix_cache, const std::vector<int>& pool_blocks = {},
          int max_parallel = 8) {
    auto file = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      pools.push_back(std::make_unique<tensor::ThreadPool>(1));
      const int blocks = i < pool_blocks.size() ? pool_blocks[i] : 256;
      local.push_back(std::make_shared<LocalStage>(model::Model::load(file, model::LayerRange{cuts[i], cuts[i + 1]}),
                                                   *pools.back(), KvOptions{model::KvType::F32, {blocks}}));
    }
    engine = std::make_unique<Engine>(std::vector<std::shared_ptr<Stage>>(local.begin(), local.end()), 512,
                                      [](Token t) { return t == 2; },
                                      EngineOptions{.context_size = kContext,
                                                    .max_parallel = max_parallel,
                                                    .max_queued = 64,
                                                    .prefix_cache = prefix_cache});
  }
  Outcome run(const GenerationRequest& r) { return submit_for_outcome(*engine, r).get(); }

  std::vector<std::unique_ptr<tensor::ThreadPool>> pools;
  std::vector<std::shared_ptr<LocalStage>> local;
  std::unique_ptr<Engine> engine;
};

GenerationRequest request(std::vector<Token> prompt, int max_tokens, float temperature = 0.0f, uint64_t seed = 7) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.logprobs = true;
  return r;
}

// BOS, then `length - 1` ordinary tokens that depend on `salt`.
std::vector<Token> tokens(int length, int salt) {
  std::vector<Token> out{1};
  for (int i = 1; i < length; ++i) out.push_back(static_cast<Token>(259 + (i * 29 + salt * 71) % 250));
  return out;
}

std::vector<Token> concat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int cached(const Outcome& o) { return o.generated.empty() ? -1 : o.generated.front().cached_tokens; }

void expect_same(const Outcome& got, const Outcome& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.logprobs(), want.logprobs()) << what;
  EXPECT_EQ(got.reason, want.reason) << what;
}

const std::vector<std::vector<int>> kSplits{{0, 4}, {0, 1, 3, 4}};

std::string name(const std::vector<int>& cuts) { return std::to_string(cuts.size() - 1) + " stage(s)"; }

TEST(PrefixCache, ARepeatedRequestReusesItsWholeBlocksAndGivesTheSameOutput) {
  for (const auto& cuts : kSplits) {
    Cluster off(cuts, false), on(cuts, true);
    for (float temperature : {0.0f, 0.8f}) {
      const GenerationRequest r = request(tokens(50, 1), 40, temperature);
      const Outcome want = off.run(r);
      const Outcome first = on.run(r);
      const Outcome again = on.run(r);
      expect_same(first, want, name(cuts) + ", first");
      expect_same(again, want, name(cuts) + ", repeated");
      EXPECT_EQ(cached(off.run(r)), 0);
      EXPECT_EQ(cached(again), 48) << name(cuts);  // three whole blocks of the 50
    }
  }
}

TEST(PrefixCache, ASecondTurnReusesTheFirstTurnsPromptAndAnswer) {
  for (const auto& cuts : kSplits) {
    Cluster off(cuts, false), on(cuts, true);
    const std::vector<Token> turn1 = tokens(30, 2);
    const Outcome answer = on.run(request(turn1, 30));
    expect_same(answer, off.run(request(turn1, 30)), name(cuts) + ", turn 1");
    const std::vector<Token> turn2 = concat(concat(turn1, answer.tokens), tokens(12, 3));
    const Outcome got = on.run(request(turn2, 20));
    expect_same(got, off.run(request(turn2, 20)), name(cuts) + ", turn 2");
    // The first turn's prompt and the answer's tokens that went through the stages.
    EXPECT_GE(cached(got), 48) << name(cuts);
  }
}

TEST(PrefixCache, ConcurrentRequestsShareALongSystemPrompt) {
  for (const auto& cuts : kSplits) {
    Cluster off(cuts, false), on(cuts, true);
    const std::vector<Token> system = tokens(70, 4);
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < 8; ++i) {
      requests.push_back(request(concat(system, tokens(5 + i, 10 + i)), 24, i % 2 ? 0.7f : 0.0f, 100 + i));
    }
    on.run(requests[0]);  // the system prompt's blocks enter the cache
    std::vector<std::future<Outcome>> futures;
    for (const auto& r : requests) futures.push_back(submit_for_outcome(*on.engine, r));
    for (size_t i = 0; i < requests.size(); ++i) {
      const Outcome got = futures[i].get();
      expect_same(got, off.run(requests[i]), name(cuts) + ", request " + std::to_string(i));
      EXPECT_GE(cached(got), 64) << name(cuts) << ", request " << i;
    }
  }
}

TEST(PrefixCache, APrefixEvictedOnOneStageOnlyIsComputedAgainEverywhere) {
  // The middle stage's pool holds two sequences: two other requests evict the first's blocks
  // there, while the other stages keep them.
  Cluster off({0, 1, 3, 4}, false), on({0, 1, 3, 4}, true, {256, 16, 256}, 2);
  const GenerationRequest a = request(tokens(60, 5), 20);
  const Outcome want = off.run(a);
  expect_same(on.run(a), want, "first");
  for (int salt : {6, 7}) on.run(request(tokens(60, salt), 68));
  EXPECT_GT(on.local[1]->kv_stats().evictions, 0u);
  EXPECT_EQ(on.local[0]->kv_stats().evictions, 0u);
  const Outcome again = on.run(a);
  expect_same(again, want, "after the middle stage evicted its prefix");
  EXPECT_LT(cached(again), 48);
}

TEST(PrefixCache, APromptOfWholeBlocksRecomputesItsLastBlock) {
  for (const auto& cuts : kSplits) {
    Cluster off(cuts, false), on(cuts, true);
    const GenerationRequest r = request(tokens(32, 8), 30);
    const Outcome want = off.run(r);
    expect_same(on.run(r), want, name(cuts) + ", first");
    const Outcome again = on.run(r);
    expect_same(again, want, name(cuts) + ", repeated");
    EXPECT_EQ(cached(again), 16) << name(cuts);
  }
}

TEST(PrefixCache, ManyLongRequestsOnASmallPoolWaitAndNoneFails) {
  // 32 requests at once, each up to a whole context (8 blocks); the pools hold three of them.
  for (const auto& cuts : kSplits) {
    Cluster off(cuts, false), on(cuts, true, std::vector<int>(cuts.size() - 1, 24), 32);
    std::vector<GenerationRequest> requests;
    const std::vector<Token> shared = tokens(40, 11);
    for (int i = 0; i < 32; ++i) {
      std::vector<Token> prompt = i % 2 ? concat(shared, tokens(20 + i, 20 + i)) : tokens(60 + i, 20 + i);
      const int max_tokens = kContext - static_cast<int>(prompt.size());
      requests.push_back(request(std::move(prompt), max_tokens, i % 3 ? 0.8f : 0.0f, 300 + i));
    }
    std::vector<std::future<Outcome>> futures;
    for (const auto& r : requests) futures.push_back(submit_for_outcome(*on.engine, r));
    for (size_t i = 0; i < requests.size(); ++i) {
      const Outcome got = futures[i].get();
      EXPECT_NE(got.reason, FinishReason::Error) << got.error;
      expect_same(got, off.run(requests[i]), name(cuts) + ", request " + std::to_string(i));
    }
    for (const auto& stage : on.local) EXPECT_LE(stage->kv_stats().used_blocks, 24);
  }
}

// A sequence's state handed over to another stage brings its token ids: once every layer is
// written its full blocks enter that stage's prefix index, and a later sequence that starts
// from them computes the same logits as one that computed everything itself.
TEST(PrefixCache, StateHandedOverEntersTheNewStagesIndexOnceEveryLayerIsWritten) {
  auto file = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
  tensor::ThreadPool pool(1);
  const auto whole_stage = [&] {
    return std::make_shared<LocalStage>(model::Model::load(file), pool, KvOptions{model::KvType::F16, {64}});
  };
  const std::vector<Token> prompt = tokens(40, 5);
  const auto batch = [&](SequenceId id, int first, int count) {
    return StageBatch{{{id, first, count, kContext}},
                      std::vector<Token>(prompt.begin() + first, prompt.begin() + first + count), {}};
  };
  const std::vector<Token> two_blocks(prompt.begin(), prompt.begin() + 2 * model::kKvBlock);

  auto computed = whole_stage();
  computed->forward(batch(1, 0, 40));
  const std::vector<float> expected = whole_stage()->forward(batch(1, 0, 40)).rows;

  for (const bool with_tokens : {true, false}) {
    SCOPED_TRACE(with_tokens ? "with token ids" : "without token ids");
    auto taking_over = whole_stage();
    const StageLayers layers = taking_over->layers();
    for (int layer = layers.first; layer < layers.last; ++layer) {
      LayerKv kv = computed->read_kv(1, layer);
      EXPECT_EQ(kv.tokens, prompt);
      if (!with_tokens) kv.tokens.clear();
      kv.id = 2;
      taking_over->write_kv(kv);
      if (layer + 1 < layers.last) {
        EXPECT_EQ(taking_over->hold_prefix(9, kContext, two_blocks), 0) << "nothing is shared before every layer is written";
        const SequenceId probe[] = {9};
        taking_over->release(probe);
      }
    }
    const int held = taking_over->hold_prefix(3, kContext, two_blocks);
    EXPECT_EQ(held, with_tokens ? 2 * model::kKvBlock : 0);
    EXPECT_EQ(taking_over->forward(batch(3, held, 40 - held)).rows, expected) << "the same bits as computing it all";
  }
}

// A local stage that can hold only some prefix lengths (as a stage whose sliding-window layers
// lack the window of others), and remembers what it was asked for.
class SomeHoldsStage final : public Stage {
 public:
  SomeHoldsStage(std::shared_ptr<LocalStage> inner, std::vector<int> holdable)
      : inner_(std::move(inner)), holdable_(std::move(holdable)) {}
  StageOutput forward(const StageBatch& batch) override { return inner_->forward(batch); }
  void release(std::span<const SequenceId> ids) override { inner_->release(ids); }
  int hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) override {
    asked.push_back(static_cast<int>(tokens.size()));
    int most = 0;
    for (int length : holdable_) {
      if (length <= static_cast<int>(tokens.size())) most = std::max(most, length);
    }
    return inner_->hold_prefix(id, capacity, tokens.first(static_cast<size_t>(most)));
  }
  model::KvBlockCounts kv_blocks() override { return inner_->kv_blocks(); }
  std::vector<int> asked;  // by the engine's loop thread, read once it is idle

 private:
  std::shared_ptr<LocalStage> inner_;
  std::vector<int> holdable_;
};

// Stages that each hold some prefixes only are asked again for the least one held, until every
// stage holds the same: the first batch starts there on all of them, with the same output.
TEST(PrefixCache, StagesAreAskedAgainUntilTheyHoldTheSamePrefix) {
  auto file = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
  std::vector<std::unique_ptr<tensor::ThreadPool>> pools;
  std::vector<std::shared_ptr<SomeHoldsStage>> stages;
  const std::vector<std::vector<int>> holdable{{0, 16, 48}, {0, 16, 32, 64}};
  for (int i = 0; i < 2; ++i) {
    pools.push_back(std::make_unique<tensor::ThreadPool>(1));
    stages.push_back(std::make_shared<SomeHoldsStage>(
        std::make_shared<LocalStage>(model::Model::load(file, model::LayerRange{2 * i, 2 * i + 2}), *pools.back(),
                                     KvOptions{model::KvType::F32, {64}}),
        holdable[static_cast<size_t>(i)]));
  }
  Engine engine(std::vector<std::shared_ptr<Stage>>(stages.begin(), stages.end()), 512, [](Token t) { return t == 2; },
                EngineOptions{.context_size = kContext, .max_parallel = 2, .prefix_cache = true});
  Cluster off({0, 4}, false);
  const GenerationRequest first = request(tokens(75, 3), 8);
  submit_for_outcome(engine, first).get();
  for (auto& stage : stages) stage->asked.clear();
  const GenerationRequest again = request(concat(tokens(75, 3), tokens(5, 4)), 12);
  const Outcome got = submit_for_outcome(engine, again).get();
  expect_same(got, off.run(again), "from the prefix the stages agreed on");
  EXPECT_EQ(cached(got), 16);
  // 64: the whole blocks before the prompt's last token. Stage 0 holds 48 of them, stage 1 32
  // of those; stage 0, asked again, 16, which stage 1 holds too.
  EXPECT_EQ(stages[0]->asked, (std::vector<int>{64, 32}));
  EXPECT_EQ(stages[1]->asked, (std::vector<int>{48, 16}));
}

// gpt-oss-tiny's layers over three stages, the first of window layers alone (its full pool
// keeps only the prefix index): every answer is the same with the cache and without, also
// after one stage's small window pool has let a prefix's window go.
TEST(PrefixCache, SlidingWindowStagesReuseAPrefixOnlyWhereEveryLayerHoldsItsWindow) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("strata_prefix_cache_test_" + std::to_string(::getpid()) + ".gguf");
  model::write_synthetic_model(*model::find_synthetic_shape("gpt-oss-tiny"), model::parse_weight_types("F32"),
                               path.string(), 5);
  auto file = std::shared_ptr<const gguf::File>(gguf::File::open(path.string()));
  std::filesystem::remove(path);
  const model::Config config = model::Config::from_gguf(*file);
  ASSERT_TRUE(config.is_sliding(0) && !config.is_sliding(1));
  const auto run_all = [&](bool prefix_cache, const std::vector<GenerationRequest>& requests) {
    std::vector<std::unique_ptr<tensor::ThreadPool>> pools;
    std::vector<std::shared_ptr<LocalStage>> stages;
    const std::vector<int> cuts{0, 1, 3, 4};
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      pools.push_back(std::make_unique<tensor::ThreadPool>(1));
      const model::LayerRange range{cuts[i], cuts[i + 1]};
      model::KvBlockCounts blocks = kv_pool_blocks(config, range, model::KvType::F16, 0, kContext, 2, 16);
      // The middle stage's window pool just holds two sequences' windows, so that another
      // prompt evicts the windows it had cached; the first keeps its own, and is asked again.
      blocks.window = i == 1 ? 6 : 64;
      stages.push_back(std::make_shared<LocalStage>(model::Model::load(file, range), *pools.back(),
                                                    KvOptions{model::KvType::F16, {blocks}}));
    }
    Engine engine(std::vector<std::shared_ptr<Stage>>(stages.begin(), stages.end()), config.vocab_size,
                  [](Token) { return false; },
                  EngineOptions{.context_size = kContext, .max_parallel = 2, .prefill_chunk = 16,
                                .prefix_cache = prefix_cache, .sliding_window = config.sliding_window});
    std::vector<Outcome> outcomes;
    for (const GenerationRequest& r : requests) outcomes.push_back(submit_for_outcome(engine, r).get());
    return outcomes;
  };
  std::vector<Token> system;
  for (int i = 0; i < 50; ++i) system.push_back(static_cast<Token>(3 + (i * 37) % 2000));
  const auto turn = [&](int n) {
    std::vector<Token> question;
    for (int i = 0; i < 9; ++i) question.push_back(static_cast<Token>(5 + (n * 101 + i * 13) % 2000));
    return request(concat(system, question), 10, n % 2 == 0 ? 0.0f : 0.7f, 3 + n);
  };
  // Two turns on the system prompt, another prompt that takes the first stage's window pool,
  // two more turns.
  const std::vector<GenerationRequest> requests{turn(0), turn(1), request(tokens(60, 9), 30), turn(2), turn(3)};
  const std::vector<Outcome> without = run_all(false, requests);
  const std::vector<Outcome> with = run_all(true, requests);
  for (size_t i = 0; i < requests.size(); ++i) expect_same(with[i], without[i], "request " + std::to_string(i));
  // The whole blocks before the last prompt token: 48 of 59.
  EXPECT_EQ(cached(with[1]), 48);
  EXPECT_LT(cached(with[3]), 48) << "the middle stage lost the system prompt's last window";
  EXPECT_EQ(cached(with[4]), 48) << "computed again by the turn before";
}

TEST(PrefixCache, StagesHoldNoSequenceAfterward) {
  Cluster on({0, 2, 4}, true);
  const GenerationRequest r = request(tokens(40, 9), 10);
  on.run(r);
  on.run(r);
  on.engine.reset();
  for (const auto& stage : on.local) {
    EXPECT_EQ(stage->sequence_count(), 0u);
    EXPECT_EQ(stage->kv_stats().pinned_blocks, 0);
    EXPECT_GT(stage->kv_stats().used_blocks, 0) << "the finished sequences' blocks stay cached";
  }
}

}  // namespace
}  // namespace strata::engine
