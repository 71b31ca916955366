// A tensor-parallel group as a pipeline stage: requests through groups (alone, beside single
// stages, even and uneven shares, dense and Mixture-of-Experts) give the tokens and logprobs of
// the whole model on one stage, concurrently, with a cached prefix and with drafts; the group
// agrees on one prefix hold, reports a lost member as lost, and leaves no state behind.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <unistd.h>

#include "engine/drafter.h"
#include "engine/engine.h"
#include "engine/group_stage.h"
#include "engine/local_stage.h"
#include "model/exchange.h"
#include "model/synthetic.h"
#include "model/tensor_share.h"
#include "outcome.h"

namespace strata::engine {
namespace {

namespace fs = std::filesystem;

struct TestModel {
  std::string path;
  int vocab;
  int layers;
};

const TestModel& dreams() {
  static const TestModel model{kDreams, 512, 4};
  return model;
}

// A random-weight qwen3moe-tiny (Q8_0), written once per test binary and removed at its exit.
struct WrittenMoe {
  WrittenMoe()
      : model{(fs::temp_directory_path() / ("strata_group_stage_test_" + std::to_string(::getpid()) + ".gguf")).string(),
              0, 0} {
    const model::SyntheticShape& shape = *model::find_synthetic_shape("qwen3moe-tiny");
    model::write_synthetic_model(shape, model::parse_weight_types("Q8_0"), model.path, 11);
    const auto file = gguf::File::open(model.path);
    const model::Config config = model::Config::from_gguf(*file);
    model.vocab = config.vocab_size;
    model.layers = config.layer_count;
  }
  ~WrittenMoe() { fs::remove(model.path); }
  TestModel model;
};

const TestModel& moe() {
  static const WrittenMoe written;
  return written.model;
}

constexpr int kBlocks = 256;

// A pipeline's stages: per range, one LocalStage, or with weights a group of members sharing it
// in those proportions, each member with a pool and a thread of its own.
struct Layout {
  struct Range {
    int first;
    int last;
    std::vector<double> weights;  // empty: a single stage
  };
  Layout(const TestModel& m, const std::vector<Range>& ranges) {
    auto file = std::shared_ptr<const gguf::File>(gguf::File::open(m.path));
    const model::Config config = model::Config::from_gguf(*file);
    for (const Range& r : ranges) {
      const model::LayerRange range{r.first, r.last};
      if (r.weights.empty()) {
        stages.push_back(member(model::Model::load(file, range)));
        continue;
      }
      groups.push_back(std::make_unique<model::LocalGroup>(static_cast<int>(r.weights.size())));
      const std::vector<model::TensorShare> shares = model::plan_tensor_shares(config, r.weights);
      std::vector<std::shared_ptr<Stage>> members;
      for (size_t i = 0; i < shares.size(); ++i) {
        members.push_back(member(model::Model::load_share(file, range, shares, groups.back()->member(static_cast<int>(i)))));
      }
      stages.push_back(std::make_shared<GroupStage>(std::move(members)));
    }
  }
  std::shared_ptr<Stage> member(std::unique_ptr<model::Model> model) {
    pools.push_back(std::make_unique<tensor::ThreadPool>(1));
    local.push_back(std::make_shared<LocalStage>(std::move(model), *pools.back(), KvOptions{model::KvType::F16, {kBlocks}}));
    return local.back();
  }
  size_t held() const {
    size_t n = 0;
    for (const auto& s : local) n += s->sequence_count();
    return n;
  }
  std::vector<std::unique_ptr<model::LocalGroup>> groups;  // outlive the models that gather through them
  std::vector<std::unique_ptr<tensor::ThreadPool>> pools;
  std::vector<std::shared_ptr<LocalStage>> local;
  std::vector<std::shared_ptr<Stage>> stages;
};

bool ends_at_2(Token t) { return t == 2; }

// Prompts that share a leading block with every other (a system prompt, for the prefix cache)
// and repeat a phrase (for prompt lookup's drafts).
GenerationRequest request(const TestModel& m, int i) {
  GenerationRequest r;
  r.prompt = {1};
  for (int j = 0; j < 17; ++j) r.prompt.push_back(static_cast<Token>(300 + j * 7 % (m.vocab - 300)));
  std::vector<Token> phrase;
  for (int j = 0; j < 4 + i % 3; ++j) phrase.push_back(static_cast<Token>(259 + (i * 41 + j * 13) % (m.vocab - 260)));
  for (int k = 0; k < 2; ++k) r.prompt.insert(r.prompt.end(), phrase.begin(), phrase.end());
  r.max_tokens = 16 + i % 9;
  r.sampling.temperature = i % 2 ? 0.9f : 0.0f;
  r.sampling.seed = 900 + static_cast<uint64_t>(i);
  r.logprobs = true;
  r.top_logprobs = 2;
  return r;
}

std::vector<GenerationRequest> requests(const TestModel& m, int count) {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < count; ++i) out.push_back(request(m, i));
  return out;
}

std::vector<Outcome> run(const std::vector<std::shared_ptr<Stage>>& stages, const TestModel& m,
                         const std::vector<GenerationRequest>& rs, EngineOptions options) {
  options.context_size = 128;
  Engine engine(stages, m.vocab, ends_at_2, options);
  std::vector<std::future<Outcome>> futures;
  for (const GenerationRequest& r : rs) futures.push_back(submit_for_outcome(engine, r));
  std::vector<Outcome> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

// Each request alone on one stage of the whole model.
std::vector<Outcome> alone(const TestModel& m, const std::vector<GenerationRequest>& rs) {
  std::vector<Outcome> out;
  for (const GenerationRequest& r : rs) {
    Layout one(m, {{0, m.layers, {}}});
    out.push_back(run(one.stages, m, {r}, {.max_parallel = 1}).front());
  }
  return out;
}

void expect_same(const std::vector<Outcome>& got, const std::vector<Outcome>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].reason, want[i].reason) << what << ", request " << i << ": " << got[i].error;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", request " << i;
    EXPECT_EQ(got[i].logprobs(), want[i].logprobs()) << what << ", request " << i;
    for (size_t t = 0; t < std::min(got[i].generated.size(), want[i].generated.size()); ++t) {
      ASSERT_EQ(got[i].generated[t].top.size(), want[i].generated[t].top.size());
      for (size_t k = 0; k < got[i].generated[t].top.size(); ++k) {
        EXPECT_EQ(got[i].generated[t].top[k].token, want[i].generated[t].top[k].token) << what << ", request " << i;
        EXPECT_EQ(got[i].generated[t].top[k].logprob, want[i].generated[t].top[k].logprob) << what << ", request " << i;
      }
    }
  }
}

// Groups of three where the model has KV heads enough for three members.
std::vector<std::vector<Layout::Range>> layouts(const TestModel& m) {
  const int half = m.layers / 2;
  const auto file = gguf::File::open(m.path);
  const bool three = model::Config::from_gguf(*file).kv_head_count >= 3;
  return {
      {{0, m.layers, {1, 1}}},
      {{0, m.layers, three ? std::vector<double>{1, 3, 1} : std::vector<double>{1, 3}}},
      {{0, half, {}}, {half, m.layers, {2, 1}}},
      {{0, half, {1, 2}}, {half, m.layers, three ? std::vector<double>{1, 1, 1} : std::vector<double>{1, 1}}},
  };
}

std::string describe(const std::vector<Layout::Range>& layout) {
  std::string out;
  for (const Layout::Range& r : layout) {
    out += "[" + std::to_string(r.first) + "," + std::to_string(r.last) + ")";
    for (size_t i = 0; i < r.weights.size(); ++i) out += (i ? ":" : " ") + std::to_string(static_cast<int>(r.weights[i]));
    out += " ";
  }
  return out;
}

class Groups : public ::testing::TestWithParam<const TestModel& (*)()> {
 protected:
  const TestModel& model() const { return GetParam()(); }
};

TEST_P(Groups, GiveTheWholeModelsTokensConcurrentlyAndLeaveNothingBehind) {
  const TestModel& m = model();
  const std::vector<GenerationRequest> rs = requests(m, 8);
  const std::vector<Outcome> want = alone(m, rs);
  for (const auto& layout : layouts(m)) {
    Layout stages(m, layout);
    expect_same(run(stages.stages, m, rs, {.max_parallel = 4}), want, describe(layout));
    EXPECT_EQ(stages.held(), 0u) << describe(layout);
  }
}

TEST_P(Groups, ReuseACachedPrefixOnEveryMember) {
  const TestModel& m = model();
  const std::vector<GenerationRequest> rs = requests(m, 3);
  const std::vector<Outcome> want = alone(m, rs);
  Layout stages(m, {{0, m.layers, {1, 2}}});
  std::vector<Outcome> got;
  for (const GenerationRequest& r : rs) got.push_back(run(stages.stages, m, {r}, {.max_parallel = 1}).front());
  expect_same(got, want, "one after another");
  for (size_t i = 1; i < got.size(); ++i) {
    ASSERT_FALSE(got[i].generated.empty());
    EXPECT_EQ(got[i].generated.front().cached_tokens, model::kKvBlock) << "request " << i;
  }
}

TEST_P(Groups, CheckDraftsAsTheWholeModelDoes) {
  const TestModel& m = model();
  const std::vector<GenerationRequest> rs = requests(m, 4);
  const std::vector<Outcome> want = alone(m, rs);
  Layout stages(m, {{0, m.layers / 2, {3, 1}}, {m.layers / 2, m.layers, {}}});
  const std::vector<Outcome> got = run(stages.stages, m, rs,
                                       {.max_parallel = 2, .drafter = std::make_shared<PromptLookupDrafter>(), .draft_max = 4});
  expect_same(got, want, "with drafts");
  int drafted = 0;
  for (const Outcome& o : got) {
    if (!o.generated.empty()) drafted += o.generated.back().drafts_accepted + o.generated.back().drafts_rejected;
  }
  EXPECT_GT(drafted, 0) << "prompt lookup found no drafts: the test checks nothing about them";
}

INSTANTIATE_TEST_SUITE_P(Models, Groups, ::testing::Values(&dreams, &moe),
                         [](const auto& info) { return info.param == &dreams ? std::string("dreams") : std::string("qwen3moe"); });

// A member that answers as told, recording what it was asked.
class ScriptedMember final : public Stage {
 public:
  explicit ScriptedMember(std::vector<int> holds, bool lost = false) : holds_(std::move(holds)), lost_(lost) {}
  StageOutput forward(const StageBatch&) override {
    if (lost_) throw StageLost("member gone", "node-b", true);
    throw std::runtime_error("a malformed batch");
  }
  void release(std::span<const SequenceId>) override {}
  int hold_prefix(SequenceId, int, std::span<const Token> tokens) override {
    asked.push_back(static_cast<int>(tokens.size()));
    const int held = holds_.at(std::min(asked.size() - 1, holds_.size() - 1));
    return std::min(held, static_cast<int>(tokens.size()) / model::kKvBlock * model::kKvBlock);
  }
  model::KvBlockCounts kv_blocks() override { return {static_cast<int>(100 + holds_.size()), 3}; }
  std::vector<int> asked;

 private:
  std::vector<int> holds_;
  bool lost_;
};

TEST(GroupStage, HoldsThePrefixEveryMemberHolds) {
  const int b = model::kKvBlock;
  auto first = std::make_shared<ScriptedMember>(std::vector<int>{3 * b});
  auto second = std::make_shared<ScriptedMember>(std::vector<int>{2 * b});
  // The third cannot keep its window when cut back to two blocks: it holds one.
  auto third = std::make_shared<ScriptedMember>(std::vector<int>{3 * b, b});
  GroupStage group({first, second, third});
  const std::vector<Token> tokens(static_cast<size_t>(3 * b + 5), 7);
  EXPECT_EQ(group.hold_prefix(1, 200, tokens), b);
  EXPECT_EQ(first->asked, (std::vector<int>{3 * b + 5, 2 * b, b}));
  EXPECT_EQ(third->asked, (std::vector<int>{3 * b + 5, 2 * b, b}));
}

TEST(GroupStage, HasTheFewestBlocksOfAnyMember) {
  GroupStage group({std::make_shared<ScriptedMember>(std::vector<int>{0, 0}), std::make_shared<ScriptedMember>(std::vector<int>{0})});
  EXPECT_EQ(group.kv_blocks().full, 101);
  EXPECT_EQ(group.kv_blocks().window, 3);
}

TEST(GroupStage, IsLostWhenAnyMemberIsLost) {
  GroupStage group({std::make_shared<ScriptedMember>(std::vector<int>{0}),
                    std::make_shared<ScriptedMember>(std::vector<int>{0}, /*lost=*/true)});
  try {
    group.forward({});
    FAIL() << "a group with a lost member computed";
  } catch (const StageLost& e) {
    EXPECT_EQ(e.node, "node-b");
    EXPECT_TRUE(e.unreachable);
  }
  GroupStage whole({std::make_shared<ScriptedMember>(std::vector<int>{0})});
  EXPECT_THROW(whole.forward({}), std::runtime_error);
}

// A member lost before it gathers anything: the member computing its share stops waiting for
// its rows (without leave_group it would wait for ever), and the group is lost.
TEST(GroupStage, AMembersLossEndsTheOthersWaiting) {
  auto file = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
  const model::Config config = model::Config::from_gguf(*file);
  const std::vector<double> weights{1, 1};
  const std::vector<model::TensorShare> shares = model::plan_tensor_shares(config, weights);
  model::LocalGroup exchange(2);
  tensor::ThreadPool pool(1);
  auto computing = std::make_shared<LocalStage>(
      model::Model::load_share(file, {0, config.layer_count}, shares, exchange.member(0)), pool,
      KvOptions{model::KvType::F16, {kBlocks}});
  GroupStage group({computing, std::make_shared<ScriptedMember>(std::vector<int>{0}, /*lost=*/true)});
  StageBatch batch;
  batch.sequences.push_back({.id = 1, .token_count = 3, .capacity = 16});
  batch.tokens = {1, 300, 301};
  EXPECT_THROW(group.forward(batch), StageLost);
}

TEST(GroupStage, RefusesNoMembers) { EXPECT_THROW(GroupStage({}), std::invalid_argument); }

}  // namespace
}  // namespace strata::engine
