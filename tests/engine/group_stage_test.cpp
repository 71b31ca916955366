// A tensor-parallel group as a pipeline stage: requests through groups (alone, beside single
// stages, even and uneven shares, dense and Mixture-of-Experts) give the tokens and logprobs of
// the whole model on one stage, concurrently, with a cached prefix and with drafts; the group
// agrees on one prefix hold, reports a lost member as lost, and leaves no state behind. Its
// keys and values are one stage's, bit for bit, and move to and from other stages at a
// pipeline switch, which then goes on as if nothing had changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <unistd.h>

#include "engine/drafter.h"
#include "engine/engine.h"
#include "engine/group_stage.h"
#include "engine/local_stage.h"
#include "gated_stage.h"
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

// A random-weight synthetic model, written once per test binary and removed at its exit.
struct WrittenModel {
  WrittenModel(const model::SyntheticShape& shape, const std::string& weight_types)
      : model{(fs::temp_directory_path() /
               ("strata_group_stage_test_" + std::string(shape.name) + "_" + std::to_string(::getpid()) + ".gguf"))
                  .string(),
              0, 0} {
    model::write_synthetic_model(shape, model::parse_weight_types(weight_types), model.path, 11);
    const auto file = gguf::File::open(model.path);
    const model::Config config = model::Config::from_gguf(*file);
    model.vocab = config.vocab_size;
    model.layers = config.layer_count;
  }
  ~WrittenModel() { fs::remove(model.path); }
  TestModel model;
};

const TestModel& moe() {
  static const WrittenModel written(*model::find_synthetic_shape("qwen3moe-tiny"), "Q8_0");
  return written.model;
}

// Gemma 3's sliding windows of 12 positions in 5 of its 6 layers, with KV heads for 3 members:
// a sequence's state there starts past position 0 once its window has moved on a block.
const TestModel& windowed() {
  static constexpr model::SyntheticShape kShape{
      .name = "gemma3-kv3", .description = "tests: a window of 12, GQA 6/3", .arch = "gemma3", .vocab_size = 512,
      .context_length = 128, .embedding_dim = 96, .layer_count = 6, .head_count = 6, .kv_head_count = 3, .ffn_dim = 200,
      .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 32, .qk_norm = true, .sliding_window = 12,
      .rope_linear_factor = 8.0f};
  static const WrittenModel written(kShape, "F32");
  return written.model;
}

constexpr int kBlocks = 256;

// A member's exchange that notes the widths of every gather it takes part in.
class NotedExchange final : public model::Exchange {
 public:
  explicit NotedExchange(model::Exchange& inner) : inner_(inner) {}
  int member() const override { return inner_.member(); }
  int size() const override { return inner_.size(); }
  void all_gather_bytes(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                        std::span<std::byte> full) override {
    widths_seen.emplace_back(widths.begin(), widths.end());  // only its member's thread gathers
    inner_.all_gather_bytes(mine, widths, rows, full);
  }
  void abort() override { inner_.abort(); }
  std::vector<std::vector<size_t>> widths_seen;

 private:
  model::Exchange& inner_;
};

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
        noted.push_back(std::make_unique<NotedExchange>(groups.back()->member(static_cast<int>(i))));
        members.push_back(member(model::Model::load_share(file, range, shares, *noted.back())));
      }
      if (range.has_head(config)) {
        head_member = noted[noted.size() - shares.size()].get();
        for (const model::TensorShare& share : shares) logits_widths.push_back(share.vocab_rows.size() * sizeof(float));
      }
      stages.push_back(std::make_shared<GroupStage>(std::move(members), shares));
    }
  }
  std::shared_ptr<Stage> member(std::unique_ptr<model::Model> model) {
    pools.push_back(std::make_unique<tensor::ThreadPool>(1));
    local.push_back(std::make_shared<LocalStage>(std::move(model), *pools.back(), KvOptions{model::KvType::F16, {kBlocks, kBlocks}}));
    return local.back();
  }
  // Gathers of whole logits rows by the group that holds the head, if one does.
  size_t logits_gathers() const {
    if (head_member == nullptr) return 0;
    return static_cast<size_t>(std::count(head_member->widths_seen.begin(), head_member->widths_seen.end(), logits_widths));
  }
  size_t held() const {
    size_t n = 0;
    for (const auto& s : local) n += s->sequence_count();
    return n;
  }
  std::vector<std::unique_ptr<model::LocalGroup>> groups;  // outlive the models that gather through them
  std::vector<std::unique_ptr<NotedExchange>> noted;
  NotedExchange* head_member = nullptr;  // the first member of the group that holds the head
  std::vector<size_t> logits_widths;      // the bytes of its members' parts of a logits row
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

TEST_P(Groups, ChooseGreedyTokensFromEachMembersBestRatherThanGatheringTheLogits) {
  const TestModel& m = model();
  std::vector<GenerationRequest> rs = requests(m, 6);
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].sampling.temperature = 0.0f;
    rs[i].logprobs = false;
    if (i % 2 == 1) {
      rs[i].sampling.repetition_penalty = 1.3f;
      rs[i].sampling.presence_penalty = 0.4f;
      rs[i].sampling.frequency_penalty = 0.2f;
    }
  }
  const std::vector<Outcome> want = alone(m, rs);
  for (const auto& layout : layouts(m)) {
    Layout stages(m, layout);
    expect_same(run(stages.stages, m, rs, {.max_parallel = 4}), want, describe(layout));
    EXPECT_EQ(stages.logits_gathers(), 0u) << describe(layout);
  }
  {  // with drafts, a best for each row
    Layout stages(m, layouts(m).front());
    const std::vector<Outcome> got = run(stages.stages, m, rs,
                                         {.max_parallel = 2, .drafter = std::make_shared<PromptLookupDrafter>(), .draft_max = 4});
    expect_same(got, want, "with drafts");
    EXPECT_EQ(stages.logits_gathers(), 0u) << "with drafts";
    int drafted = 0;
    for (const Outcome& o : got) {
      if (!o.generated.empty()) drafted += o.generated.back().drafts_accepted + o.generated.back().drafts_rejected;
    }
    EXPECT_GT(drafted, 0) << "prompt lookup found no drafts: the test checks nothing about them";
  }
  // Logprobs need the whole row's softmax: then the rows are gathered, which the count above sees.
  const std::vector<GenerationRequest> with_logprobs = requests(m, 1);
  Layout stages(m, layouts(m).front());
  expect_same(run(stages.stages, m, with_logprobs, {.max_parallel = 4}), alone(m, with_logprobs), "with logprobs");
  EXPECT_GT(stages.logits_gathers(), 0u);
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

// Groupings of 2 and 3 members, even and uneven, that the model has KV heads enough for.
std::vector<std::vector<double>> groupings(const TestModel& m) {
  const auto file = gguf::File::open(m.path);
  std::vector<std::vector<double>> out{{1, 1}, {1, 3}};
  if (model::Config::from_gguf(*file).kv_head_count >= 3) {
    out.push_back({1, 1, 1});
    out.push_back({3, 1, 2});
  }
  return out;
}

// Drives a pipeline by hand: each stage after the first gets the one before's rows.
std::vector<float> forward(const std::vector<std::shared_ptr<Stage>>& stages, StageBatch batch) {
  for (const auto& stage : stages) batch.hidden = stage->forward(batch).rows;
  return std::move(batch.hidden);
}

// The inputs of two sequences, one over several blocks, one within its first, each with the
// logits of its last input back.
StageBatch prompts(const TestModel& m) {
  StageBatch batch;
  for (SequenceId id : {1, 2}) {
    const std::vector<Token> prompt = request(m, static_cast<int>(id)).prompt;
    const int count = id == 1 ? 3 * model::kKvBlock + 5 : 7;
    for (int i = 0; i < count; ++i) batch.tokens.push_back(prompt[static_cast<size_t>(i) % prompt.size()]);
    batch.sequences.push_back({.id = id, .token_count = count, .capacity = 128});
  }
  return batch;
}

// One more input for each sequence of `batch`, from where its state ends.
StageBatch next_inputs(const StageBatch& batch, std::span<const Token> inputs) {
  StageBatch next;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceWork& w = batch.sequences[i];
    next.sequences.push_back({.id = w.id, .first_position = w.first_position + w.token_count, .token_count = 1,
                              .capacity = w.capacity});
    next.tokens.push_back(inputs[i]);
  }
  return next;
}

// Every layer of `to`'s range, of every sequence, moved from `from`.
void hand_over(Stage& from, Stage& to, std::span<const SequenceId> ids) {
  for (SequenceId id : ids) {
    for (int layer = to.layers().first; layer < to.layers().last; ++layer) to.write_kv(from.read_kv(id, layer));
  }
}

void expect_same_kv(const LayerKv& got, const LayerKv& want, const std::string& what) {
  EXPECT_EQ(got.id, want.id) << what;
  EXPECT_EQ(got.layer, want.layer) << what;
  EXPECT_EQ(got.positions, want.positions) << what;
  EXPECT_EQ(got.capacity, want.capacity) << what;
  EXPECT_EQ(got.first_position, want.first_position) << what;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.keys.type, want.keys.type) << what;
  EXPECT_EQ(got.values.type, want.values.type) << what;
  EXPECT_TRUE(got.keys.bytes == want.keys.bytes) << what << ": keys differ";
  EXPECT_TRUE(got.values.bytes == want.values.bytes) << what << ": values differ";
}

// The state tests run on a model with sliding windows too.
class GroupState : public Groups {};

TEST_P(GroupState, HoldTheKeysAndValuesOfOneStageOfTheWholeModel) {
  const TestModel& m = model();
  const int half = m.layers / 2;
  Layout whole(m, {{0, m.layers, {}}});
  const StageBatch started = prompts(m);
  forward(whole.stages, started);
  const StageBatch decoded = next_inputs(started, std::vector<Token>{5, 6});
  forward(whole.stages, decoded);
  bool windows_moved = false;
  for (const std::vector<double>& weights : groupings(m)) {
    for (const std::vector<Layout::Range>& ranges : {std::vector<Layout::Range>{{0, m.layers, weights}},
                                                     std::vector<Layout::Range>{{0, half, {}}, {half, m.layers, weights}}}) {
      Layout split(m, ranges);
      forward(split.stages, started);
      forward(split.stages, decoded);
      Stage& group = *split.stages.back();
      ASSERT_EQ(group.layers().first, ranges.back().first);
      ASSERT_EQ(group.layers().last, m.layers);
      for (SequenceId id : {1, 2}) {
        for (int layer = ranges.back().first; layer < m.layers; ++layer) {
          const LayerKv kv = group.read_kv(id, layer);
          expect_same_kv(kv, whole.stages[0]->read_kv(id, layer),
                         describe(ranges) + "sequence " + std::to_string(id) + ", layer " + std::to_string(layer));
          windows_moved = windows_moved || kv.first_position > 0;
        }
      }
    }
  }
  if (GetParam() == &windowed) {
    EXPECT_TRUE(windows_moved) << "no window had moved on: the test checks nothing of them";
  }
}

Token most_likely(std::span<const float> logits) {
  return static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Greedy steps of both sequences of `batch` (whose logits were `logits`) on `stages` and on
// `never_switched`, which must give the same logits; returns the last batch and its logits.
std::pair<StageBatch, std::vector<float>> decode_alike(const std::vector<std::shared_ptr<Stage>>& stages,
                                                       const std::vector<std::shared_ptr<Stage>>& never_switched,
                                                       StageBatch batch, std::vector<float> logits, int vocab,
                                                       const std::string& what) {
  for (int step = 0; step < 4; ++step) {
    std::vector<Token> chosen;
    for (size_t i = 0; i < batch.sequences.size(); ++i) {
      chosen.push_back(most_likely(std::span<const float>(logits).subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab))));
    }
    batch = next_inputs(batch, chosen);
    logits = forward(stages, batch);
    EXPECT_TRUE(logits == forward(never_switched, batch)) << what << ", step " << step;
  }
  return {std::move(batch), std::move(logits)};
}

TEST_P(GroupState, TakeOverOneStagesStateAndHandItBackAsIfNothingHadMoved) {
  const TestModel& m = model();
  const std::vector<SequenceId> ids{1, 2};
  for (const std::vector<double>& weights : groupings(m)) {
    const std::vector<Layout::Range> grouped{{0, m.layers, weights}};
    Layout never_switched(m, {{0, m.layers, {}}}), before(m, {{0, m.layers, {}}}), group(m, grouped),
        after(m, {{0, m.layers, {}}});
    StageBatch batch = prompts(m);
    std::vector<float> logits = forward(before.stages, batch);
    ASSERT_TRUE(logits == forward(never_switched.stages, batch));
    hand_over(*before.stages[0], *group.stages[0], ids);
    std::tie(batch, logits) = decode_alike(group.stages, never_switched.stages, batch, logits, m.vocab,
                                           "into " + describe(grouped));
    hand_over(*group.stages[0], *after.stages[0], ids);
    decode_alike(after.stages, never_switched.stages, batch, logits, m.vocab, "out of " + describe(grouped));
  }
}

TEST_P(GroupState, MoveTheirStateAtPipelineSwitchesFromOneStageAndOnToAPipeline) {
  const TestModel& m = model();
  const std::vector<GenerationRequest> rs = requests(m, 8);
  const std::vector<Outcome> want = alone(m, rs);
  const int half = m.layers / 2;
  Layout one(m, {{0, m.layers, {}}}), group(m, {{0, m.layers, {1, 2}}}), pipeline(m, {{0, half, {2, 1}}, {half, m.layers, {}}});
  // Each switch comes while the pipeline before it holds its 6th batch, when every request has
  // started and none has ended.
  auto first = std::make_shared<GatedStage>(one.stages[0], 6);
  auto second = std::make_shared<GatedStage>(group.stages[0], 6);
  {
    Engine engine({first}, m.vocab, ends_at_2, {.context_size = 128, .max_parallel = 8, .max_queued = 8});
    std::vector<std::future<Outcome>> futures;
    for (const GenerationRequest& r : rs) futures.push_back(submit_for_outcome(engine, r));
    first->wait_until_held();
    engine.replace_pipeline({second}, /*hand_over=*/true);
    first->open();
    second->wait_until_held();
    engine.replace_pipeline(pipeline.stages, /*hand_over=*/true);
    second->open();
    std::vector<Outcome> got;
    for (auto& f : futures) got.push_back(f.get());
    expect_same(got, want, "switched from one stage to a group to a pipeline");
    EXPECT_GT(first->reads(), 0) << "nothing moved from the stage to the group";
    EXPECT_GT(second->reads(), 0) << "nothing moved from the group to the pipeline";
    EXPECT_GT(engine.switch_counts().handed_over, 0u);
    EXPECT_EQ(engine.switch_counts().recomputed, 0u);
  }
  EXPECT_EQ(one.held() + group.held() + pipeline.held(), 0u) << "the old stages let go of what moved";
}

std::string model_name(const ::testing::TestParamInfo<const TestModel& (*)()>& info) {
  return info.param == &dreams ? "dreams" : info.param == &moe ? "qwen3moe" : "gemma3_windowed";
}

INSTANTIATE_TEST_SUITE_P(Models, Groups, ::testing::Values(&dreams, &moe), model_name);
INSTANTIATE_TEST_SUITE_P(Models, GroupState, ::testing::Values(&dreams, &moe, &windowed), model_name);

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

// A member on another node as a chain reaches it: it records the `then` of every batch sent
// to it and answers with its own rows, or is lost when sent to or when answering.
class ChainMember final : public Stage {
 public:
  enum class Lost { Never, WhenSent, WhenAnswering };
  ChainMember(std::string node, float answer, Lost lost = Lost::Never) : node_(std::move(node)), answer_(answer), lost_(lost) {}
  std::string chain_node() const override { return node_; }
  void send(const StageBatch& batch) override {
    if (lost_ == Lost::WhenSent) throw StageLost("no stream to it", node_, true);
    sent.push_back(batch.then);
  }
  StageOutput receive() override {
    if (lost_ == Lost::WhenAnswering) throw StageLost("its stream broke", node_, false);
    return {{answer_}, {}};
  }
  StageOutput forward(const StageBatch&) override { throw std::logic_error("a chain member is sent its batches"); }
  void release(std::span<const SequenceId>) override {}
  int hold_prefix(SequenceId, int, std::span<const Token>) override { return 0; }
  model::KvBlockCounts kv_blocks() override { return {}; }
  std::vector<std::vector<std::string>> sent;

 private:
  std::string node_;
  float answer_;
  Lost lost_;
};

// A group of members on other nodes is a link of a chain, named by its first member: a batch
// goes to every member, the rest of the chain to the first only (the others only compute their
// shares), and the first one's answer is the group's.
TEST(GroupStage, PassesABatchOnThroughItsFirstMemberOnly) {
  auto first = std::make_shared<ChainMember>("node-a", 1.0f);
  auto second = std::make_shared<ChainMember>("node-b", 2.0f);
  GroupStage group({first, second});
  EXPECT_EQ(group.chain_node(), "node-a");
  StageBatch batch;
  batch.then = {"node-c", "node-d"};
  group.send(batch);
  batch.then = {"node-c"};
  group.send(batch);
  EXPECT_EQ(first->sent, (std::vector<std::vector<std::string>>{{"node-c", "node-d"}, {"node-c"}}));
  EXPECT_EQ(second->sent, (std::vector<std::vector<std::string>>{{}, {}}));
  EXPECT_EQ(group.receive().rows, std::vector<float>{1.0f});
  EXPECT_EQ(group.receive().rows, std::vector<float>{1.0f});
  EXPECT_THROW(group.receive(), std::logic_error) << "nothing more was sent";
  // A member on this node cannot be sent a batch by another: such a group is given each one.
  GroupStage with_local({first, std::make_shared<ScriptedMember>(std::vector<int>{0})});
  EXPECT_EQ(with_local.chain_node(), "");
}

// A member lost as the batch goes out, or as its answer comes back, makes the group lost,
// named by that member.
TEST(GroupStage, IsLostInAChainWhenAnyMemberIsLost) {
  for (const ChainMember::Lost when : {ChainMember::Lost::WhenSent, ChainMember::Lost::WhenAnswering}) {
    auto first = std::make_shared<ChainMember>("node-a", 1.0f);
    GroupStage group({first, std::make_shared<ChainMember>("node-b", 2.0f, when)});
    group.send({});
    try {
      group.receive();
      FAIL() << "a group with a lost member answered";
    } catch (const StageLost& e) {
      EXPECT_EQ(e.node, "node-b");
    }
    EXPECT_EQ(first->sent.size(), 1u);
  }
}

// A member on another node whose answer to a batch comes once the test lets it (within 10 s),
// or is its loss.
class AnsweringLater final : public Stage {
 public:
  explicit AnsweringLater(bool lost) : lost_(lost) {}
  std::string chain_node() const override { return "node-b"; }
  void send(const StageBatch&) override { ++sent; }
  StageOutput receive() override {
    std::unique_lock lock(mutex_);
    opened_.wait_for(lock, std::chrono::seconds(10), [&] { return open_; });
    ++answered;
    if (lost_) throw StageLost("its stream broke", "node-b", false);
    return {{2.0f}, {}};
  }
  StageOutput forward(const StageBatch&) override { throw std::logic_error("a member elsewhere is sent its batches"); }
  void release(std::span<const SequenceId>) override {}
  int hold_prefix(SequenceId, int, std::span<const Token>) override { return 0; }
  model::KvBlockCounts kv_blocks() override { return {}; }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    opened_.notify_all();
  }
  std::atomic<int> sent = 0;
  std::atomic<int> answered = 0;

 private:
  const bool lost_;
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// The first member, here: answers with its own row, and notes how many batches the member
// elsewhere had been sent when it computed.
class FirstHere final : public Stage {
 public:
  explicit FirstHere(const AnsweringLater& elsewhere) : elsewhere_(elsewhere) {}
  StageOutput forward(const StageBatch&) override {
    sent_when_computing.push_back(elsewhere_.sent);
    return {{1.0f}, {}};
  }
  void release(std::span<const SequenceId> ids) override { released.insert(released.end(), ids.begin(), ids.end()); }
  int hold_prefix(SequenceId, int, std::span<const Token>) override { return 0; }
  model::KvBlockCounts kv_blocks() override { return {}; }
  std::vector<int> sent_when_computing;
  std::vector<SequenceId> released;

 private:
  const AnsweringLater& elsewhere_;
};

// A member on another node waits for its batch while the members here compute: it is sent the
// batch first, and the group answers without waiting for its answer, which it takes at its next
// call.
TEST(GroupStage, SendsAMemberElsewhereItsBatchFirstAndTakesItsAnswerAtTheNextCall) {
  auto elsewhere = std::make_shared<AnsweringLater>(/*lost=*/false);
  auto here = std::make_shared<FirstHere>(*elsewhere);
  GroupStage group({here, elsewhere});
  EXPECT_EQ(group.forward({}).rows, std::vector<float>{1.0f});
  EXPECT_EQ(here->sent_when_computing, std::vector<int>{1});
  EXPECT_EQ(elsewhere->answered, 0) << "the forward waited for the answer from another node";
  elsewhere->open();
  EXPECT_EQ(group.forward({}).rows, std::vector<float>{1.0f});
  EXPECT_EQ(here->sent_when_computing, (std::vector<int>{1, 2}));
  group.release({});
  EXPECT_EQ(elsewhere->answered, 2) << "release took the last answer";
}

// A member elsewhere lost as it answers makes the group's next call lost, named by it (a
// release still releases); when a member here failed too, its answer is awaited and its loss
// is the group's failure at once.
TEST(GroupStage, IsLostAtItsNextCallWhenAMemberElsewhereIsLostAnswering) {
  for (const bool next_is_forward : {true, false}) {
    auto elsewhere = std::make_shared<AnsweringLater>(/*lost=*/true);
    elsewhere->open();
    auto here = std::make_shared<FirstHere>(*elsewhere);
    GroupStage group({here, elsewhere});
    EXPECT_EQ(group.forward({}).rows, std::vector<float>{1.0f});
    const std::vector<SequenceId> ids{7};
    try {
      if (next_is_forward) {
        group.forward({});
      } else {
        group.release(ids);
      }
      FAIL() << "the answer of a lost member was not taken";
    } catch (const StageLost& e) {
      EXPECT_EQ(e.node, "node-b");
    }
    EXPECT_EQ(here->released, next_is_forward ? std::vector<SequenceId>{} : ids);
  }
  auto elsewhere = std::make_shared<AnsweringLater>(/*lost=*/true);
  elsewhere->open();
  GroupStage failing_here({std::make_shared<ScriptedMember>(std::vector<int>{0}), elsewhere});
  try {
    failing_here.forward({});
    FAIL() << "a group whose first member failed computed";
  } catch (const StageLost& e) {
    EXPECT_EQ(e.node, "node-b");
  }
}

TEST(GroupStage, RefusesNoMembers) { EXPECT_THROW(GroupStage({}), std::invalid_argument); }

// A member of layers [0, 2) that holds one sequence's state as given, and takes over any.
class KvMember final : public Stage {
 public:
  explicit KvMember(LayerKv held, StageLayers layers = {0, 2}) : held(std::move(held)), layers_(layers) {}
  StageOutput forward(const StageBatch&) override { return {}; }
  void release(std::span<const SequenceId>) override {}
  int hold_prefix(SequenceId, int, std::span<const Token>) override { return 0; }
  model::KvBlockCounts kv_blocks() override { return {}; }
  StageLayers layers() const override { return layers_; }
  LayerKv read_kv(SequenceId, int) override { return held; }
  void write_kv(const LayerKv& kv) override { held = kv; }
  LayerKv held;

 private:
  StageLayers layers_;
};

// Two rows (positions 1 and 2 of 3) of one byte per element and KV head, 3 KV heads.
LayerKv three_heads() {
  return {7, 1, 3, 8, 1, {model::KvType::F32, {0, 1, 2, 3, 4, 5}}, {model::KvType::F32, {10, 11, 12, 13, 14, 15}}, {4, 5, 6}};
}

std::vector<model::TensorShare> kv_head_shares(std::initializer_list<int> heads) {
  std::vector<model::TensorShare> shares;
  int next = 0;
  for (int h : heads) {
    shares.push_back({.kv_heads = {next, next + h}});
    next += h;
  }
  return shares;
}

TEST(GroupStage, SplitsEachRowByKvHeadsInMemberOrderAndJoinsItBack) {
  auto first = std::make_shared<KvMember>(LayerKv{});
  auto second = std::make_shared<KvMember>(LayerKv{});
  GroupStage group({first, second}, kv_head_shares({1, 2}));
  EXPECT_EQ(group.layers().first, 0);
  EXPECT_EQ(group.layers().last, 2);
  group.write_kv(three_heads());
  EXPECT_EQ(first->held.keys.bytes, (std::vector<uint8_t>{0, 3}));
  EXPECT_EQ(second->held.keys.bytes, (std::vector<uint8_t>{1, 2, 4, 5}));
  EXPECT_EQ(second->held.values.bytes, (std::vector<uint8_t>{11, 12, 14, 15}));
  EXPECT_EQ(second->held.tokens, three_heads().tokens);
  expect_same_kv(group.read_kv(7, 1), three_heads(), "read back");
}

TEST(GroupStage, RefusesStateItCannotSplitOrJoin) {
  LayerKv other = three_heads();
  other.capacity = 9;
  EXPECT_THROW(GroupStage({std::make_shared<KvMember>(three_heads()), std::make_shared<KvMember>(other)}).read_kv(7, 1),
               std::runtime_error);
  other = three_heads();
  other.tokens[0] = 9;
  EXPECT_THROW(GroupStage({std::make_shared<KvMember>(three_heads()), std::make_shared<KvMember>(other)}).read_kv(7, 1),
               std::runtime_error);
  GroupStage unsplit({std::make_shared<KvMember>(LayerKv{}), std::make_shared<KvMember>(LayerKv{})});
  EXPECT_THROW(unsplit.write_kv(three_heads()), StageLost) << "a group without shares took state over";
  GroupStage group({std::make_shared<KvMember>(LayerKv{}), std::make_shared<KvMember>(LayerKv{})}, kv_head_shares({2, 2}));
  EXPECT_THROW(group.write_kv(three_heads()), std::invalid_argument) << "rows of 3 KV heads split among 4";
  LayerKv ragged = three_heads();
  ragged.keys.bytes.pop_back();
  EXPECT_THROW(group.write_kv(ragged), std::invalid_argument);
}

TEST(GroupStage, RefusesMembersOfOtherLayersAndSharesThatDoNotFit) {
  const auto member = [](StageLayers layers) { return std::make_shared<KvMember>(LayerKv{}, layers); };
  EXPECT_THROW(GroupStage({member({0, 2}), member({0, 3})}), std::invalid_argument);
  EXPECT_EQ(GroupStage({member({0, 2}), member({})}).layers().last, 0) << "a member that does not say";
  EXPECT_THROW(GroupStage({member({0, 2}), member({0, 2})}, kv_head_shares({1})), std::invalid_argument);
  std::vector<model::TensorShare> gap = kv_head_shares({1, 1});
  gap[1].kv_heads = {2, 3};
  EXPECT_THROW(GroupStage({member({0, 2}), member({0, 2})}, gap), std::invalid_argument);
}

}  // namespace
}  // namespace strata::engine
