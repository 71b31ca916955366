// A node's layers across placements, on the shared model: a range loads on a thread of its own
// and then serves its placement; the same range serves the next placement at once, beside the
// previous one's stage; another range loads anew; no range lets everything go; a load that
// fails is said once and tried again.
#include "cluster/stage_host.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stdexcept>

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

class StageHostTest : public ::testing::Test {
 protected:
  StageHostOptions options() {
    return {std::shared_ptr<const gguf::File>(gguf::File::open(kDreams)),
            1,
            [](model::LayerRange) { return engine::KvOptions{model::KvType::F32, {16}}; },
            [this](model::LayerRange range) {
              std::lock_guard lock(mutex_);
              fetched_.push_back(range.first);
              if (fail_fetch_) throw std::runtime_error("no peer holds tensor blk.0.attn_q.weight");
            },
            [this] {
              std::lock_guard lock(mutex_);
              ++ready_;
              changed_.notify_all();
            },
            [this](const std::string& line) {
              std::lock_guard lock(mutex_);
              lines_.push_back(line);
              changed_.notify_all();
            }};
  }
  // Waits up to 30 s for the host's on_ready to have been called `count` times in all.
  bool readied(int count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 30s, [&] { return ready_ >= count; });
  }
  int said(const std::string& line) {
    std::lock_guard lock(mutex_);
    return static_cast<int>(std::count(lines_.begin(), lines_.end(), line));
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  int ready_ = 0;
  bool fail_fetch_ = false;
  std::vector<int> fetched_;
  std::vector<std::string> lines_;
};

TEST_F(StageHostTest, ARangeLoadsThenServesItsPlacementAndTheNextBesideThePrevious) {
  StageHost host(options());
  host.hold(StageSeat{{0, 2}}, 1);
  ASSERT_TRUE(readied(1)) << "the load ends with on_ready";
  EXPECT_FALSE(host.ready_for(1)) << "a loaded range serves from the next round";
  host.hold(StageSeat{{0, 2}}, 1);
  EXPECT_TRUE(readied(2));
  EXPECT_TRUE(host.ready_for(1));
  const std::shared_ptr<engine::Stage> first = host.stage_of(1);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(host.current(), first);

  host.hold(StageSeat{{0, 2}}, 2);  // the same layers: no load
  EXPECT_TRUE(host.ready_for(2)) << "a range held serves the next placement at once";
  EXPECT_EQ(host.stage_of(1), first) << "the previous placement's stage goes on serving it";
  EXPECT_NE(host.stage_of(2), first);
  EXPECT_EQ(host.ready_epoch(), 2u);
  EXPECT_EQ(said("loading layers [0, 2) for placement 1"), 1);
  EXPECT_EQ(said("loaded layers [0, 2)"), 1);

  cluster_types::NodeInfo info;
  host.describe(info, model::KvType::F32);
  EXPECT_EQ(info.ready_epoch, 2u);
  EXPECT_DOUBLE_EQ(info.load_progress, 1.0);
  EXPECT_EQ(info.kv_cache->pool_blocks, 16u);
  EXPECT_EQ(fetched_, std::vector<int>{0}) << "the fetch runs before every load, and only then";
}

TEST_F(StageHostTest, AnotherRangeLoadsAnewAndNoRangeLetsEverythingGo) {
  StageHost host(options());
  host.hold(StageSeat{{0, 2}}, 1);
  ASSERT_TRUE(readied(1));
  host.hold(StageSeat{{0, 2}}, 1);
  ASSERT_TRUE(host.ready_for(1));
  host.hold(StageSeat{{2, 4}}, 2);
  EXPECT_FALSE(host.has_current()) << "the stage of the old range retires while the new one loads";
  EXPECT_TRUE(host.has_any());
  ASSERT_TRUE(readied(3));
  host.hold(StageSeat{{2, 4}}, 2);
  EXPECT_TRUE(host.ready_for(2));
  host.hold(std::nullopt, 3);
  EXPECT_FALSE(host.has_current());
  EXPECT_EQ(said("this node holds no layers in placement 3"), 1);
  host.drop_previous(true, 3, std::chrono::steady_clock::now(), kHandOverLimit);
  EXPECT_FALSE(host.has_any()) << "dropped once the leader serves a newer placement and it holds no sequence";
}

TEST_F(StageHostTest, AFailedLoadIsSaidOnceAndTriedAgain) {
  fail_fetch_ = true;
  StageHost host(options());
  for (int attempt = 0; attempt < 3; ++attempt) {
    host.hold(StageSeat{{0, 4}}, 1);
    host.wait_for_load();
  }
  EXPECT_EQ(fetched_.size(), 3u);
  EXPECT_EQ(said("loading layers failed: no peer holds tensor blk.0.attn_q.weight"), 1);
  EXPECT_FALSE(host.loading());
  EXPECT_FALSE(host.has_any());
  EXPECT_EQ(ready_, 0);
}

}  // namespace
}  // namespace strata::cluster
