// A node's placements and the leader's scheduler, on the shared model: the last few placements
// kept and their stages found (this node's own, other nodes' at the address it knows them by),
// a placement made or waiting for a hand-made one's nodes, the scheduler following the
// placement once every stage is ready, and a node that stands aside letting all of it go.
#include "cluster/leadership.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "engine/group_stage.h"
#include "rpc/messages.h"
#include "node_info_fixture.h"

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";
const ControlTime t0 = ControlTime{} + 1h;

cluster_types::Placement placement(uint64_t epoch, const std::string& leader,
                                   const std::vector<std::tuple<std::string, int, int>>& stages) {
  cluster_types::Placement p{.epoch = epoch, .leader_id = leader};
  for (const auto& [id, first, last] : stages) p.stages.push_back({id, "leader's name for " + id + ":1", first, last});
  return p;
}

class LeadershipTest : public ::testing::Test {
 protected:
  LeadershipTest()
      : file_(gguf::File::open(kDreams)),
        membership_(initial_control_state(view_of(node("a", "127.0.0.1:7001")), {}, t0), {}),
        stages_({file_, 1, [](model::LayerRange) { return engine::KvOptions{model::KvType::F32, {16}}; }, nullptr,
                 [this] {
                   std::lock_guard lock(mutex_);
                   ++ready_;
                   changed_.notify_all();
                 },
                 {}}),
        leadership_(LeadershipOptions{
            .rules = {"a", Strategy::Speed, {}, 64, footprint_of(*file_)},
            .make_engine =
                [this](std::vector<std::shared_ptr<engine::Stage>> stages) {
                  engine::EngineOptions options;
                  options.context_size = 128;
                  return std::make_shared<engine::Engine>(std::move(stages), 512, [](engine::Token) { return false; },
                                                          options);
                },
            .remote_stage =
                [this](const cluster_types::Stage& s, uint64_t epoch, bool leading) {
                  reached_.push_back(s.node_id + "@" + s.node_address + "/" + std::to_string(epoch) +
                                     (leading ? " leading" : ""));
                  return stages_.current();  // any stage stands for another node's here
                },
            .log = [this](const std::string& line) { lines_.push_back(line); }}) {}

  ~LeadershipTest() override {
    if (std::shared_ptr<engine::Engine> engine = leadership_.scheduler().take()) engine->shutdown();
    leadership_.scheduler().join_retiring();
  }

  // Holds [first, last) for placement `epoch`, ready to serve.
  void ready(int first, int last, uint64_t epoch) {
    stages_.hold(StageSeat{{first, last}}, epoch);
    std::unique_lock lock(mutex_);
    ASSERT_TRUE(changed_.wait_for(lock, 30s, [&] { return ready_ > 0; }));
    lock.unlock();
    stages_.hold(StageSeat{{first, last}}, epoch);
    ASSERT_TRUE(stages_.ready_for(epoch));
  }

  std::shared_ptr<const gguf::File> file_;
  Membership membership_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int ready_ = 0;
  StageHost stages_;
  std::vector<std::string> reached_;
  std::vector<std::string> lines_;
  Leadership leadership_;
};

TEST_F(LeadershipTest, TheLastFewPlacementsAreKeptAndTheirStagesFound) {
  ready(0, 2, 1);
  rpc::HelloOutcome b;
  b.reply.sender = node("b", "10.0.0.2:7002");
  membership_.hello_answered("10.0.0.2:7002", b, t0);
  for (uint64_t epoch = 1; epoch <= 4; ++epoch) leadership_.adopt(placement(epoch, "a", {{"a", 0, 2}, {"b", 2, 4}}));
  EXPECT_EQ(leadership_.placement().epoch, 4u);

  const std::vector<std::shared_ptr<engine::Stage>> first = leadership_.stages_of(1, stages_, membership_);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0], stages_.stage_of(1));
  EXPECT_EQ(reached_.back(), "b@10.0.0.2:7002/1 leading") << "at the address b is known by, not the leader's name";
  EXPECT_NE(leadership_.chain_stage(1, "b", membership_), nullptr);
  EXPECT_EQ(reached_.back(), "b@10.0.0.2:7002/1") << "a chain's stage repairs nothing";
  EXPECT_EQ(leadership_.chain_stage(1, "a", membership_), nullptr) << "a node passes nothing on to itself";
  EXPECT_EQ(leadership_.chain_stage(9, "b", membership_), nullptr);
  EXPECT_TRUE(leadership_.stages_of(2, stages_, membership_).empty()) << "this node's stage serves placement 1 only";

  leadership_.adopt(placement(5, "a", {{"a", 0, 2}, {"b", 2, 4}}));
  EXPECT_TRUE(leadership_.stages_of(1, stages_, membership_).empty()) << "four placements are kept, not five";
  const std::optional<model::LayerRange> b_layers = layers_of(leadership_.placement(), "b");
  ASSERT_TRUE(b_layers);
  EXPECT_EQ(b_layers->first, 2);
  EXPECT_EQ(b_layers->last, 4);
  EXPECT_FALSE(layers_of(leadership_.placement(), "c"));
}

// A stage that passes a batch on to a tensor-parallel group reaches every member of it (at the
// addresses this node knows them by), as one stage named by the group's first member.
TEST_F(LeadershipTest, AChainPassesABatchOnToAGroupAsOneStage) {
  ready(0, 2, 1);
  cluster_types::Placement p = placement(1, "a", {{"a", 0, 2}, {"b", 2, 4}});
  p.stages[1].group = {{"b", "leader's name for b:1", "b:9", 1.0}, {"c", "leader's name for c:1", "c:9", 1.0}};
  for (const auto& [id, address] : {std::pair{"b", "10.0.0.2:7002"}, std::pair{"c", "10.0.0.3:7002"}}) {
    rpc::HelloOutcome hello;
    hello.reply.sender = node(id, address);
    membership_.hello_answered(address, hello, t0);
  }
  leadership_.adopt(p);
  const std::shared_ptr<engine::Stage> group = leadership_.chain_stage(1, "b", membership_);
  EXPECT_NE(std::dynamic_pointer_cast<engine::GroupStage>(group), nullptr);
  EXPECT_EQ(reached_, (std::vector<std::string>{"b@10.0.0.2:7002/1", "c@10.0.0.3:7002/1"}));
  EXPECT_EQ(leadership_.chain_stage(1, "c", membership_), nullptr) << "a group is named by its first member";
}

TEST_F(LeadershipTest, APlacementIsMadeOrWaitsForTheNodesItNames) {
  const control::ProposePlacement proposal{{"a"}, 3, false};
  const ControlEvent made = leadership_.place(proposal, {node("a", "127.0.0.1:7001")});
  ASSERT_TRUE(std::holds_alternative<control::PlacementMade>(made));
  EXPECT_EQ(std::get<control::PlacementMade>(made).placement.epoch, 3u);
  EXPECT_EQ(leadership_.placement().epoch, 3u);
  EXPECT_EQ(stages_text(leadership_.placement()), "a [0, 4)");

  Leadership fixed(LeadershipOptions{.rules = {"a", Strategy::Speed, {{"a", 0, 2}, {"b", 2, 4}}, 64, footprint_of(*file_)},
                                     .make_engine = nullptr,
                                     .remote_stage = nullptr,
                                     .log = [this](const std::string& line) { lines_.push_back(line); }});
  for (int round = 0; round < 2; ++round) {
    const ControlEvent waits = fixed.place(proposal, {node("a", "127.0.0.1:7001")});
    ASSERT_TRUE(std::holds_alternative<control::PlacementWaits>(waits));
  }
  EXPECT_EQ(fixed.placement().epoch, 0u);
  EXPECT_EQ(std::count_if(lines_.begin(), lines_.end(),
                          [](const std::string& line) { return line.starts_with("the fixed placement waits: "); }),
            1);
}

TEST_F(LeadershipTest, TheSchedulerServesOnceEveryStageIsReadyAndAStandAsideEndsIt) {
  const ControlState& control = membership_.control();
  leadership_.adopt(placement(1, "a", {{"a", 0, 4}}));
  leadership_.follow(control, stages_, t0);
  EXPECT_FALSE(leadership_.scheduling()) << "this node's stage is not ready";
  EXPECT_FALSE(leadership_.scheduler_counts());
  ready(0, 4, 1);
  leadership_.follow(control, stages_, t0);
  ASSERT_TRUE(leadership_.scheduling());
  EXPECT_EQ(leadership_.scheduler().nodes(), std::vector<std::string>{"a"});
  EXPECT_EQ(lines_.back(), "serving placement 1 (1 stage(s))");
  ASSERT_TRUE(leadership_.scheduler_counts());
  EXPECT_EQ(leadership_.scheduler_counts()->handed_over, 0u);

  leadership_.stand_aside("this node takes no part");
  EXPECT_TRUE(leadership_.placement().stages.empty());
  EXPECT_FALSE(leadership_.scheduling());
  EXPECT_EQ(leadership_.scheduler().engine(), nullptr);
}

}  // namespace
}  // namespace strata::cluster
