// Speculative decoding: a step that feeds drafts after a sequence's last token gives, from the
// last stage, the tokens that decoding one at a time gives, greedy or seeded, on the shared
// model and on a synthetic one, alone or beside other requests, over one to three stages; a
// request that ends inside a run of confirmed drafts (max_tokens, its end of generation, a stop)
// ends exactly where it would have.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <map>
#include <numeric>
#include <thread>
#include <unistd.h>

#include "engine/drafter.h"
#include "engine/engine.h"
#include "engine/local_stage.h"
#include "model/synthetic.h"
#include "outcome.h"

namespace strata::engine {
namespace {

namespace fs = std::filesystem;

struct TestModel {
  std::string name;
  std::string path;
  int vocab;
  int layers;
};

const TestModel& dreams() {
  static const TestModel model{"dreams", kDreams, 512, 4};
  return model;
}

// A random-weight qwen3-tiny (4 layers, vocabulary 2048) of weights from `seed`, written once
// per test binary and removed at its exit.
struct WrittenSynthetic {
  explicit WrittenSynthetic(uint64_t seed)
      : model{"qwen3-tiny", (fs::temp_directory_path() / ("strata_speculative_test_" + std::to_string(::getpid()) +
                                                          "_" + std::to_string(seed) + ".gguf")).string(),
              2048, 4} {
    model::write_synthetic_model(*model::find_synthetic_shape("qwen3-tiny"), model::parse_weight_types("Q8_0"),
                                 model.path, seed);
  }
  ~WrittenSynthetic() { fs::remove(model.path); }
  TestModel model;
};

const TestModel& synthetic() {
  static const WrittenSynthetic written(7);
  return written.model;
}

// The same shape and vocabulary, other weights: a draft model that is mostly wrong.
const TestModel& other_synthetic() {
  static const WrittenSynthetic written(8);
  return written.model;
}

bool ends_at_2(Token t) { return t == 2; }

// The model's layers cut at `cuts`, each range a stage with its own pool and thread.
struct Stages {
  Stages(const TestModel& m, const std::vector<int>& cuts, int blocks = 256) {
    auto file = std::shared_ptr<const gguf::File>(gguf::File::open(m.path));
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      pools.push_back(std::make_unique<tensor::ThreadPool>(1));
      local.push_back(std::make_shared<LocalStage>(model::Model::load(file, model::LayerRange{cuts[i], cuts[i + 1]}),
                                                   *pools.back(), KvOptions{model::KvType::F16, {blocks}}));
    }
  }
  std::vector<std::shared_ptr<Stage>> list() const { return {local.begin(), local.end()}; }
  size_t held() const {
    size_t n = 0;
    for (const auto& s : local) n += s->sequence_count();
    return n;
  }
  std::vector<std::unique_ptr<tensor::ThreadPool>> pools;
  std::vector<std::shared_ptr<LocalStage>> local;
};

// Prompts that repeat themselves, so that prompt lookup finds drafts and the model (the shared
// one, at least) copies: a phrase three times, then its start.
GenerationRequest request(const TestModel& m, int i) {
  GenerationRequest r;
  std::vector<Token> phrase;
  for (int j = 0; j < 5 + i % 4; ++j) phrase.push_back(static_cast<Token>(259 + (i * 41 + j * 13) % (m.vocab - 260)));
  r.prompt = {1};
  for (int k = 0; k < 3; ++k) r.prompt.insert(r.prompt.end(), phrase.begin(), phrase.end());
  r.prompt.insert(r.prompt.end(), phrase.begin(), phrase.begin() + 2);
  r.max_tokens = 24 + i % 9;
  r.sampling.temperature = i % 2 ? 0.9f : 0.0f;
  r.sampling.seed = 700 + static_cast<uint64_t>(i);
  if (i % 3 == 1) {  // the penalties read the history that drafts move on
    r.sampling.repetition_penalty = 1.2f;
    r.sampling.presence_penalty = 0.3f;
    r.sampling.penalty_last_n = 6;
  }
  r.logprobs = true;
  r.top_logprobs = 2;
  return r;
}

// Drafts from a known continuation of each prompt: right ones, or, with `wrong`, one in three
// steps with its third draft wrong and one in three with its first, as a drafter's guesses go.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(std::map<std::vector<Token>, std::vector<Token>> continuations, int vocab, bool wrong)
      : continuations_(std::move(continuations)), vocab_(vocab), wrong_(wrong) {}
  std::vector<Token> draft(State*, std::span<const Token> history, int max) const override {
    for (const auto& [prompt, continuation] : continuations_) {
      if (history.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), history.begin())) continue;
      const size_t at = history.size() - prompt.size();
      std::vector<Token> out;
      for (size_t i = at; i < continuation.size() && out.size() < static_cast<size_t>(max); ++i) {
        out.push_back(continuation[i]);
      }
      if (wrong_ && !out.empty() && at % 3 != 0) {
        Token& spoiled = out[at % 3 == 1 ? std::min<size_t>(2, out.size() - 1) : 0];
        spoiled = (spoiled + 1) % vocab_;
      }
      return out;
    }
    return {};
  }

 private:
  std::map<std::vector<Token>, std::vector<Token>> continuations_;
  int vocab_;
  bool wrong_;
};

// Each request alone, one token a step, on one stage.
std::vector<Outcome> one_at_a_time(const TestModel& m, const std::vector<GenerationRequest>& requests,
                                   const std::function<bool(Token)>& ends = ends_at_2) {
  Stages stages(m, {0, m.layers});
  Engine engine(stages.list(), m.vocab, ends, {.context_size = 128, .max_parallel = 1});
  std::vector<Outcome> out;
  for (const auto& r : requests) out.push_back(submit_for_outcome(engine, r).get());
  return out;
}

std::map<std::vector<Token>, std::vector<Token>> continuations(const std::vector<GenerationRequest>& requests,
                                                               const std::vector<Outcome>& outcomes) {
  std::map<std::vector<Token>, std::vector<Token>> out;
  for (size_t i = 0; i < requests.size(); ++i) out[requests[i].prompt] = outcomes[i].tokens;
  return out;
}

class Speculative : public ::testing::TestWithParam<const TestModel& (*)()> {
 protected:
  const TestModel& model() const { return GetParam()(); }
};

TEST_P(Speculative, GivesTheTokensOfOneAtATimeAloneAndBesideOthersOverOneToThreeStages) {
  const TestModel& m = model();
  constexpr int kRequests = 8;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < kRequests; ++i) requests.push_back(request(m, i));
  const std::vector<Outcome> want = one_at_a_time(m, requests);
  const auto lookup = std::make_shared<PromptLookupDrafter>();
  const auto oracle = std::make_shared<OracleDrafter>(continuations(requests, want), m.vocab, true);
  const std::vector<std::pair<std::string, std::shared_ptr<const Drafter>>> drafters{{"prompt lookup", lookup},
                                                                                      {"an oracle, often wrong", oracle}};
  for (const auto& [drafter_name, drafter] : drafters) {
    for (const std::vector<int>& cuts : {std::vector<int>{0, 4}, {0, 2, 4}, {0, 1, 3, 4}}) {
      for (const int parallel : {1, 4}) {
        const std::string what = m.name + ", " + drafter_name + ", " + std::to_string(cuts.size() - 1) +
                                 " stage(s), " + std::to_string(parallel) + " at once";
        Stages stages(m, cuts);
        Engine::SpeculationCounts counts;
        {
          Engine engine(stages.list(), m.vocab, ends_at_2,
                        {.context_size = 128, .max_parallel = parallel, .max_queued = kRequests,
                         .drafter = drafter, .draft_max = 5, .drafting_sequences = 16});
          std::vector<std::future<Outcome>> futures;
          for (const auto& r : requests) futures.push_back(submit_for_outcome(engine, r));
          std::vector<Outcome> got;
          for (auto& f : futures) got.push_back(f.get());
          expect_same(got, want, what);
          counts = engine.speculation();
          const int accepted = std::accumulate(got.begin(), got.end(), 0, [](int sum, const Outcome& o) {
            return sum + (o.generated.empty() ? 0 : o.generated.back().drafts_accepted);
          });
          EXPECT_LE(static_cast<uint64_t>(accepted), counts.accepted) << what;
        }
        EXPECT_EQ(stages.held(), 0u) << what;
        if (drafter == oracle) {
          EXPECT_GT(counts.accepted, 0u) << what;
          EXPECT_GT(counts.drafted, counts.accepted) << what << ": some drafts are wrong";
        }
        if (drafter == lookup && m.name == "dreams") {
          EXPECT_GT(counts.accepted, 0u) << what << ": the model copies";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Speculative, ::testing::Values(&dreams, &synthetic),
                         [](const auto& info) { return info.index == 0 ? std::string("Dreams") : std::string("Synthetic"); });

// A draft model proposes its greedy continuation, keeping its own keys and values in step with
// each sequence (rejected drafts rewound): the shared model drafting for itself (greedy drafts
// right but where the penalties or a seed choose otherwise) and a synthetic model drafting for
// another of other weights (drafts mostly wrong), the text is the same.
TEST(SpeculativeDraftModel, GivesTheTokensOfOneAtATime) {
  for (const auto& [m, drafting] : {std::pair{&dreams(), &dreams()}, std::pair{&synthetic(), &other_synthetic()}}) {
    const auto draft_model = std::make_shared<ModelDrafter>(
        model::Model::load(std::shared_ptr<const gguf::File>(gguf::File::open(drafting->path))), 1);
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < 6; ++i) requests.push_back(request(*m, i));
    const std::vector<Outcome> want = one_at_a_time(*m, requests);
    for (const std::vector<int>& cuts : {std::vector<int>{0, 4}, {0, 1, 3, 4}}) {
      const std::string what = m->name + ", " + std::to_string(cuts.size() - 1) + " stage(s)";
      Stages stages(*m, cuts);
      Engine::SpeculationCounts counts;
      {
        Engine engine(stages.list(), m->vocab, ends_at_2,
                      {.context_size = 128, .max_parallel = 3, .max_queued = 8, .drafter = draft_model,
                       .draft_max = 4, .drafting_sequences = 16});
        std::vector<std::future<Outcome>> futures;
        for (const auto& r : requests) futures.push_back(submit_for_outcome(engine, r));
        std::vector<Outcome> got;
        for (auto& f : futures) got.push_back(f.get());
        expect_same(got, want, what);
        counts = engine.speculation();
      }
      EXPECT_EQ(stages.held(), 0u);
      EXPECT_GT(counts.drafted, 0u) << what;
      if (m == &dreams()) {
        EXPECT_GT(counts.accepted * 2, counts.drafted) << what << ": the model drafting for itself is mostly right";
      }
    }
  }
}

// Every draft right, up to 8 a step: a request that ends inside such a run takes no token after
// its end, and its sampler and state are where one at a time would leave them.
TEST(SpeculativeEnds, MaxTokensEndOfGenerationAndAStopInsideAnAcceptedRun) {
  const TestModel& m = dreams();
  GenerationRequest long_one = request(m, 4);
  long_one.max_tokens = 40;
  const std::vector<Outcome> whole = one_at_a_time(m, {long_one}, [](Token) { return false; });
  ASSERT_EQ(whole[0].tokens.size(), 40u);
  const auto oracle =
      std::make_shared<OracleDrafter>(continuations({long_one}, whole), m.vocab, /*wrong=*/false);
  for (const std::vector<int>& cuts : {std::vector<int>{0, 4}, {0, 1, 3, 4}}) {
    const std::string what = std::to_string(cuts.size() - 1) + " stage(s)";
    // max_tokens: 11 and 19 fall inside runs of 9 tokens (8 drafts and one more).
    for (const int max_tokens : {1, 2, 11, 19}) {
      Stages stages(m, cuts);
      Engine engine(stages.list(), m.vocab, [](Token) { return false; },
                    {.context_size = 128, .drafter = oracle, .draft_max = 8, .drafting_sequences = 16});
      GenerationRequest r = long_one;
      r.max_tokens = max_tokens;
      const Outcome got = submit_for_outcome(engine, r).get();
      EXPECT_EQ(got.reason, FinishReason::Length) << what;
      EXPECT_EQ(got.tokens, std::vector<Token>(whole[0].tokens.begin(), whole[0].tokens.begin() + max_tokens)) << what;
      if (max_tokens > 2) {
        EXPECT_GT(engine.speculation().accepted, 0u) << what;
      }
    }
    // The end of generation: a token that first comes at the 13th place ends the request there.
    size_t end_at = 12;
    while (std::find(whole[0].tokens.begin(), whole[0].tokens.begin() + static_cast<std::ptrdiff_t>(end_at),
                     whole[0].tokens[end_at]) != whole[0].tokens.begin() + static_cast<std::ptrdiff_t>(end_at)) {
      ++end_at;
    }
    ASSERT_LT(end_at, whole[0].tokens.size());
    const Token end = whole[0].tokens[end_at];
    const auto ends = [end](Token t) { return t == end; };
    const std::vector<Outcome> plain = one_at_a_time(m, {long_one}, ends);
    ASSERT_EQ(plain[0].tokens.size(), end_at + 1);
    {
      Stages stages(m, cuts);
      Engine engine(stages.list(), m.vocab, ends,
                    {.context_size = 128, .drafter = oracle, .draft_max = 8, .drafting_sequences = 16});
      const Outcome got = submit_for_outcome(engine, long_one).get();
      EXPECT_EQ(got.reason, FinishReason::Stop) << what;
      EXPECT_EQ(got.tokens, plain[0].tokens) << what;
      EXPECT_TRUE(got.generated.back().end_of_generation) << what;
    }
    // A stop string, as the API sees one: on_token says no more after the 7th token.
    {
      Stages stages(m, cuts);
      {
        Engine engine(stages.list(), m.vocab, [](Token) { return false; },
                      {.context_size = 128, .drafter = oracle, .draft_max = 8, .drafting_sequences = 16});
        const Outcome got = submit_for_outcome(engine, long_one, /*stop_after=*/7).get();
        EXPECT_EQ(got.reason, FinishReason::Cancelled) << what;
        EXPECT_EQ(got.tokens, std::vector<Token>(whole[0].tokens.begin(), whole[0].tokens.begin() + 7)) << what;
      }
      EXPECT_EQ(stages.held(), 0u);
    }
  }
}

// A stage of the tests below: forwards to a local one, and with `lose_at` is lost at that call.
class TestStage final : public Stage {
 public:
  explicit TestStage(std::shared_ptr<LocalStage> inner, int lose_at = 0) : inner_(std::move(inner)), lose_at_(lose_at) {}
  StageOutput forward(const StageBatch& batch) override {
    if (++calls_ >= lose_at_ && lose_at_ > 0) throw StageLost("the stage's node is gone");
    return inner_->forward(batch);
  }
  void release(std::span<const SequenceId> ids) override { inner_->release(ids); }
  int hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) override {
    return inner_->hold_prefix(id, capacity, tokens);
  }
  model::KvBlockCounts kv_blocks() override { return inner_->kv_blocks(); }
  StageLayers layers() const override { return inner_->layers(); }
  LayerKv read_kv(SequenceId id, int layer) override { return inner_->read_kv(id, layer); }
  void write_kv(const LayerKv& kv) override { inner_->write_kv(kv); }
  int calls() const { return calls_; }

 private:
  std::shared_ptr<LocalStage> inner_;
  int lose_at_;
  std::atomic<int> calls_{0};
};

std::vector<std::shared_ptr<Stage>> wrapped(const Stages& stages, int lose_last_at = 0) {
  std::vector<std::shared_ptr<Stage>> out;
  for (const auto& s : stages.local) out.push_back(std::make_shared<TestStage>(s, out.size() + 1 == stages.local.size() ? lose_last_at : 0));
  return out;
}

void wait_for_steps(const Engine& engine, uint64_t steps) {
  while (engine.speculation().steps < steps) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The stages hold drafts that were not confirmed when the pipeline changes: a stage lost
// (the sequences are computed again), a hand-over (their state moves without those drafts) or
// a scheduler that passes its requests on (the next one moves their state): the same texts.
TEST(SpeculativeSwitch, ALostStageAHandOverAndAPassOnGiveTheSameTokens) {
  const TestModel& m = dreams();
  constexpr int kRequests = 6;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(request(m, i));
    requests.back().max_tokens = 60;
  }
  const std::vector<Outcome> want = one_at_a_time(m, requests);
  const auto oracle = std::make_shared<OracleDrafter>(continuations(requests, want), m.vocab, true);
  const EngineOptions options{.context_size = 128, .max_parallel = kRequests, .max_queued = kRequests,
                              .replay_wait = std::chrono::seconds(30), .drafter = oracle, .draft_max = 4, .drafting_sequences = 16};
  const auto collect = [&](std::vector<std::future<Outcome>>& futures, const std::string& what) {
    std::vector<Outcome> got;
    for (auto& f : futures) got.push_back(f.get());
    expect_same(got, want, what);
  };
  {
    Stages before(m, {0, 2, 4});
    Stages after(m, {0, 1, 4});
    const auto lost = wrapped(before, /*lose_last_at=*/15);
    {
      Engine engine(lost, m.vocab, ends_at_2, options);
      std::vector<std::future<Outcome>> futures;
      for (const auto& r : requests) futures.push_back(submit_for_outcome(engine, r));
      while (std::static_pointer_cast<TestStage>(lost.back())->calls() < 15) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      engine.replace_pipeline(after.list());
      collect(futures, "a lost stage");
      EXPECT_GT(engine.switch_counts().recomputed, 0u);
    }
    EXPECT_EQ(before.held() + after.held(), 0u);
  }
  {
    Stages first(m, {0, 2, 4});
    Stages second(m, {0, 1, 3, 4});
    Stages third(m, {0, 4});
    {
      Engine engine(wrapped(first), m.vocab, ends_at_2, options);
      std::vector<std::future<Outcome>> futures;
      for (const auto& r : requests) futures.push_back(submit_for_outcome(engine, r));
      wait_for_steps(engine, 8);
      engine.replace_pipeline(wrapped(second), /*hand_over=*/true);
      wait_for_steps(engine, 20);
      engine.replace_pipeline(wrapped(third), /*hand_over=*/true);
      collect(futures, "hand-overs");
      EXPECT_GT(engine.switch_counts().handed_over, 0u);
      EXPECT_EQ(engine.switch_counts().recomputed, 0u) << "the drafts held past a sequence's inputs stopped a move";
    }
    EXPECT_EQ(first.held() + second.held() + third.held(), 0u);
  }
  {
    Stages first(m, {0, 2, 4});
    Stages second(m, {0, 3, 4});
    std::vector<std::vector<GeneratedToken>> generated(kRequests);
    std::vector<std::optional<HeldState>> held(kRequests);
    std::vector<std::promise<Outcome>> ended(kRequests);
    {
      Engine engine(wrapped(first), m.vocab, ends_at_2, options);
      for (size_t i = 0; i < kRequests; ++i) {
        RequestCallbacks callbacks;
        callbacks.on_token = [&generated, i](const GeneratedToken& t) {
          generated[i].push_back(t);
          return true;
        };
        callbacks.on_finish = [&ended, &generated, i](FinishReason reason, const std::string& error) {
          Outcome o;
          o.generated = generated[i];
          for (const auto& t : o.generated) o.tokens.push_back(t.token);
          o.reason = reason;
          o.error = error;
          ended[i].set_value(o);
        };
        callbacks.on_passed_on = [&held, i](const HeldState& h) { held[i] = h; };
        ASSERT_TRUE(engine.submit(requests[i], std::move(callbacks)));
      }
      wait_for_steps(engine, 12);
      engine.pass_on(7, "passed on");
    }
    EngineOptions next_options = options;
    next_options.held_stages = [&](uint64_t) { return first.list(); };
    next_options.first_sequence_id = 1000;
    Engine next(second.list(), m.vocab, ends_at_2, next_options);
    std::vector<std::future<Outcome>> futures;
    int passed = 0;
    for (size_t i = 0; i < kRequests; ++i) {
      if (!held[i]) {
        futures.push_back(ended[i].get_future());
        continue;
      }
      ++passed;
      GenerationRequest rest = requests[i];
      for (const GeneratedToken& t : generated[i]) rest.prompt.push_back(t.token);
      rest.max_tokens -= static_cast<int>(generated[i].size());
      rest.resumed_after = static_cast<int>(generated[i].size());
      rest.held = held[i];
      auto outcome = std::make_shared<std::promise<Outcome>>();
      futures.push_back(outcome->get_future());
      RequestCallbacks callbacks;
      auto tokens = std::make_shared<std::vector<GeneratedToken>>(generated[i]);
      callbacks.on_token = [tokens](const GeneratedToken& t) {
        tokens->push_back(t);
        return true;
      };
      callbacks.on_finish = [tokens, outcome](FinishReason reason, const std::string& error) {
        Outcome o;
        o.generated = *tokens;
        for (const auto& t : o.generated) o.tokens.push_back(t.token);
        o.reason = reason;
        o.error = error;
        outcome->set_value(o);
      };
      ASSERT_TRUE(next.submit(rest, std::move(callbacks)));
    }
    collect(futures, "passed on");
    EXPECT_GT(passed, 0);
    EXPECT_EQ(next.switch_counts().handed_over, static_cast<uint64_t>(passed));
    EXPECT_EQ(next.switch_counts().recomputed, 0u);
  }
}

// When the pools run short the newest sequence is pre-empted, drafts or not, and computed again
// to the same text; drafts only take room the pool has to spare.
TEST(SpeculativeSwitch, PreemptedSequencesGiveTheSameTokens) {
  const TestModel& m = dreams();
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 10; ++i) {
    requests.push_back(request(m, i));
    requests.back().max_tokens = 128 - static_cast<int>(requests.back().prompt.size());
  }
  const std::vector<Outcome> want = one_at_a_time(m, requests);
  const auto lookup = std::make_shared<PromptLookupDrafter>();
  for (const std::vector<int>& cuts : {std::vector<int>{0, 4}, {0, 1, 3, 4}}) {
    const std::string what = std::to_string(cuts.size() - 1) + " stage(s)";
    Stages stages(m, cuts, /*blocks=*/20);
    {
      Engine engine(stages.list(), m.vocab, ends_at_2,
                    {.context_size = 128, .max_parallel = 10, .max_queued = 10, .drafter = lookup, .draft_max = 8,
                     .drafting_sequences = 16});
      std::vector<std::future<Outcome>> futures;
      for (const auto& r : requests) futures.push_back(submit_for_outcome(engine, r));
      std::vector<Outcome> got;
      for (auto& f : futures) got.push_back(f.get());
      expect_same(got, want, what);
      EXPECT_GT(engine.preemptions(), 0u) << what;
      EXPECT_GT(engine.speculation().accepted, 0u) << what;
    }
    for (const auto& s : stages.local) {
      EXPECT_EQ(s->sequence_count(), 0u);
      EXPECT_EQ(s->kv_stats().pinned_blocks, 0);
    }
  }
}

// Prompt lookup proposes what followed the last earlier occurrence of the history's last n
// tokens, longest n first, and goes on repeating a pattern that reaches the end.
// Drafts from a known continuation with the first draft wrong in the calls `spoiled` names,
// recording each call: the history's length and the drafts allowed.
class RecordingDrafter final : public Drafter {
 public:
  RecordingDrafter(std::vector<Token> prompt, std::vector<Token> continuation, int vocab,
                   std::function<bool(size_t call)> spoiled)
      : prompt_(std::move(prompt)), continuation_(std::move(continuation)), vocab_(vocab),
        spoiled_(std::move(spoiled)) {}
  std::vector<Token> draft(State*, std::span<const Token> history, int max) const override {
    const size_t call = calls.size();
    calls.emplace_back(history.size(), max);
    const size_t at = history.size() - prompt_.size();
    std::vector<Token> out;
    for (size_t i = at; i < continuation_.size() && out.size() < static_cast<size_t>(max); ++i) {
      out.push_back(continuation_[i]);
    }
    if (spoiled_(call) && !out.empty()) out[0] = (out[0] + 1) % vocab_;
    return out;
  }
  mutable std::vector<std::pair<size_t, int>> calls;  // on the engine's loop thread only

 private:
  std::vector<Token> prompt_, continuation_;
  int vocab_;
  std::function<bool(size_t)> spoiled_;
};

// After a step whose drafts all fail, a sequence whose drafts have mostly been right (a copy
// meeting an edit) drafts again at the next step, half as many as it last took; one whose
// drafts have mostly failed pauses 1, then 2 steps, drafting one at a time.
TEST(SpeculativeDraftCounts, AMissInACopyHalvesTheDraftsAndAMostlyWrongSequencePauses) {
  const TestModel& m = dreams();
  GenerationRequest r = request(m, 0);
  r.max_tokens = 40;
  const std::vector<Token> continuation = one_at_a_time(m, {r}).front().tokens;
  ASSERT_EQ(continuation.size(), 40u);
  auto run = [&](std::function<bool(size_t)> spoiled) {
    const auto drafter = std::make_shared<RecordingDrafter>(r.prompt, continuation, m.vocab, std::move(spoiled));
    Stages stages(m, {0, m.layers});
    Engine engine(stages.list(), m.vocab, ends_at_2,
                  {.context_size = 128, .max_parallel = 1, .drafter = drafter, .draft_max = 8});
    EXPECT_EQ(submit_for_outcome(engine, r).get().tokens, continuation);
    return drafter->calls;
  };
  // Right twice (4, then 8 drafts), then wrong from the first draft on.
  const auto copy = run([](size_t call) { return call == 2; });
  ASSERT_GE(copy.size(), 4u);
  EXPECT_EQ(copy[1].second, 8);
  EXPECT_EQ(copy[2].second, 8);
  EXPECT_EQ(copy[3].first, copy[2].first + 1) << "it drafts at the step after the miss";
  EXPECT_EQ(copy[3].second, 4);
  // Always wrong.
  const auto wrong = run([](size_t) { return true; });
  ASSERT_GE(wrong.size(), 3u);
  EXPECT_EQ(wrong[1].first, wrong[0].first + 2) << "one step without drafts";
  EXPECT_EQ(wrong[2].first, wrong[1].first + 3) << "two steps without drafts";
  EXPECT_EQ(wrong[1].second, 1);
  EXPECT_EQ(wrong[2].second, 1);
}

TEST(PromptLookup, ProposesWhatFollowedTheLastOccurrenceOfTheTail) {
  const PromptLookupDrafter lookup(3, 1);
  const std::vector<Token> copy{1, 5, 6, 7, 8, 9, 4, 5, 6, 7};
  EXPECT_EQ(lookup.draft(nullptr, copy, 4), (std::vector<Token>{8, 9, 4, 5}));
  EXPECT_EQ(lookup.draft(nullptr, copy, 1), (std::vector<Token>{8}));
  const std::vector<Token> later{1, 7, 2, 9, 7, 3, 9, 7};  // "9 7" twice: the later one wins
  EXPECT_EQ(lookup.draft(nullptr, later, 2), (std::vector<Token>{3, 9}));
  const std::vector<Token> shorter{1, 4, 8, 2, 6, 8};  // only "8" occurs before
  EXPECT_EQ(lookup.draft(nullptr, shorter, 3), (std::vector<Token>{2, 6, 8}));
  // "5 6 42" and "6 42" not before: "5 6" is, before 7, as if 42 had replaced 7 (an edit), and
  // that wins over what followed the lone 42 before (11 5 6).
  const std::vector<Token> edited{1, 42, 11, 5, 6, 7, 8, 9, 5, 6, 42};
  EXPECT_EQ(lookup.draft(nullptr, edited, 3), (std::vector<Token>{8, 9, 5}));
  const std::vector<Token> lone{1, 42, 11, 5, 6, 7, 8, 9, 3, 42};  // "9 3" not before either: the lone 42
  EXPECT_EQ(lookup.draft(nullptr, lone, 2), (std::vector<Token>{11, 5}));
  const std::vector<Token> cycle{1, 3, 4, 3, 4};  // "3 4" ended by "3 4": 3 4 3 4 ...
  EXPECT_EQ(lookup.draft(nullptr, cycle, 5), (std::vector<Token>{3, 4, 3, 4, 3}));
  EXPECT_TRUE(lookup.draft(nullptr, std::vector<Token>{1, 2, 3}, 4).empty()) << "nothing occurs twice";
  EXPECT_TRUE(lookup.draft(nullptr, copy, 0).empty());
  EXPECT_TRUE(lookup.draft(nullptr, std::vector<Token>{}, 3).empty());
}

// A stage refuses a rewind of a sequence it has not started, or past what it holds, and drafts
// that are not among a sequence's inputs.
TEST(SpeculativeStage, RefusesInconsistentRewindsAndDrafts) {
  Stages stages(dreams(), {0, 4});
  LocalStage& stage = *stages.local[0];
  StageBatch first;
  first.sequences.push_back({1, 0, 4, 32});
  first.tokens = {1, 300, 301, 302};
  ASSERT_NO_THROW(stage.forward(first));
  StageBatch batch;
  batch.sequences.push_back({1, 5, 1, 32});
  batch.tokens = {303};
  batch.sequences[0].rewind = true;
  EXPECT_THROW(stage.forward(batch), std::invalid_argument) << "a rewind past what it holds";
  batch.sequences[0] = {2, 0, 1, 32};
  batch.sequences[0].rewind = true;
  EXPECT_THROW(stage.forward(batch), std::invalid_argument) << "a rewind of a sequence it does not hold";
  batch.sequences[0] = {1, 3, 1, 32};
  EXPECT_THROW(stage.forward(batch), std::invalid_argument) << "going back without saying so";
  batch.sequences[0].rewind = true;
  batch.sequences[0].sampling = sampling::SamplingStep{};
  batch.sequences[0].sampling->drafts = 1;
  EXPECT_THROW(stage.forward(batch), std::invalid_argument) << "a draft that is the sequence's last token";
  batch.sequences[0].sampling->drafts = 0;
  const StageOutput out = stage.forward(batch);  // back to position 3, and on
  ASSERT_EQ(out.sampled.size(), 1u);
  EXPECT_EQ(out.sampled[0].error, "");
}

}  // namespace
}  // namespace strata::engine
