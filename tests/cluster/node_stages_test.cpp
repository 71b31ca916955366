// A node's stages across placement switches: the previous placement's stage serves until the
// leader has switched and its sequences are gone, or the hand-over's limit has passed.
#include "cluster/node_stages.h"

#include <gtest/gtest.h>

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

class NodeStagesTest : public ::testing::Test {
 protected:
  NodeStagesTest() : model_(model::Model::load(std::shared_ptr<const gguf::File>(gguf::File::open(kDreams)))) {}
  void start(uint64_t epoch) { stages_.start(model_, 1, engine::KvOptions{model::KvType::F32, {16}}, epoch); }

  std::shared_ptr<model::Model> model_;
  NodeStages stages_;
};

TEST_F(NodeStagesTest, ANewPlacementsStageLeavesThePreviousOneServingItsOwn) {
  EXPECT_FALSE(stages_.has_any());
  EXPECT_EQ(stages_.ready_epoch(), 0u);
  start(1);
  const std::shared_ptr<engine::Stage> first = stages_.of(1);
  ASSERT_NE(first, nullptr);
  start(2);
  EXPECT_TRUE(stages_.ready_for(2));
  EXPECT_FALSE(stages_.ready_for(1));
  EXPECT_EQ(stages_.ready_epoch(), 2u);
  EXPECT_EQ(stages_.of(1), first) << "the previous placement's stage goes on serving it";
  EXPECT_EQ(stages_.of(2), stages_.current());
  EXPECT_NE(stages_.of(2), first);
  EXPECT_EQ(stages_.of(3), nullptr);
}

TEST_F(NodeStagesTest, ThePreviousStageIsDroppedOnceTheLeaderServesANewerPlacement) {
  start(1);
  start(2);
  const auto now = Clock::now();
  stages_.drop_previous(false, 2, now, 60s);
  EXPECT_NE(stages_.of(1), nullptr) << "the leader does not serve yet";
  stages_.drop_previous(true, 1, now, 60s);
  EXPECT_NE(stages_.of(1), nullptr) << "the leader serves the previous stage's own placement";
  stages_.drop_previous(true, 2, now, 60s);
  EXPECT_EQ(stages_.of(1), nullptr) << "it held no sequence";
  EXPECT_TRUE(stages_.ready_for(2));
}

TEST_F(NodeStagesTest, ARetiredStageIsNoLongerCurrentButStillServes) {
  start(4);
  stages_.retire();
  EXPECT_FALSE(stages_.has_current());
  EXPECT_TRUE(stages_.has_any());
  EXPECT_EQ(stages_.current(), nullptr);
  EXPECT_NE(stages_.of(4), nullptr);
  EXPECT_FALSE(stages_.holds_sequences());
}

TEST_F(NodeStagesTest, TheCurrentStageDescribesItsKvPool) {
  cluster_types::NodeInfo info;
  stages_.describe(info, model::KvType::F32);
  EXPECT_FALSE(info.kv_cache.has_value());
  start(1);
  stages_.describe(info, model::KvType::F32);
  ASSERT_TRUE(info.kv_cache.has_value());
  EXPECT_EQ(info.kv_cache->pool_blocks, 16u);
  EXPECT_EQ(info.kv_cache->used_blocks, 0u);
  EXPECT_EQ(info.kv_cache->type, model::kv_type_name(model::KvType::F32));
  EXPECT_EQ(info.held_sequences, 0u);
}

}  // namespace
}  // namespace strata::cluster
