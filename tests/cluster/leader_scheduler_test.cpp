// A leader's scheduler across placements, over one local stage of the shared model: a new
// pipeline on the running engine, and an engine retired with its requests ended.
#include "cluster/leader_scheduler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "engine/local_stage.h"

namespace strata::cluster {
namespace {

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

class LeaderSchedulerTest : public ::testing::Test {
 protected:
  LeaderSchedulerTest()
      : model_(model::Model::load(std::shared_ptr<const gguf::File>(gguf::File::open(kDreams)))),
        pool_(1),
        scheduler_([this](std::vector<std::shared_ptr<engine::Stage>> stages) {
          ++made_;
          engine::EngineOptions options;
          options.context_size = 256;
          return std::make_shared<engine::Engine>(std::move(stages), model_->config().vocab_size,
                                                  [](engine::Token) { return false; }, options);
        }) {}
  ~LeaderSchedulerTest() override {
    if (const std::shared_ptr<engine::Engine> engine = scheduler_.take()) engine->shutdown();
    scheduler_.join_retiring();
  }

  std::vector<std::shared_ptr<engine::Stage>> pipeline() {
    return {std::make_shared<engine::LocalStage>(model_, pool_, engine::KvOptions{model::KvType::F32, {64}})};
  }

  std::shared_ptr<model::Model> model_;
  tensor::ThreadPool pool_;
  int made_ = 0;
  LeaderScheduler scheduler_;
};

TEST_F(LeaderSchedulerTest, ANewPlacementRunsOnTheSameEngine) {
  EXPECT_FALSE(scheduler_.serves(0)) << "no engine runs";
  scheduler_.serve(pipeline(), false, 3, {"a"});
  const std::shared_ptr<engine::Engine> first = scheduler_.engine();
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(scheduler_.serves(3));
  EXPECT_EQ(scheduler_.nodes(), (std::vector<std::string>{"a"}));
  scheduler_.serve(pipeline(), false, 4, {"b"});
  EXPECT_EQ(scheduler_.engine(), first);
  EXPECT_EQ(made_, 1);
  EXPECT_TRUE(scheduler_.serves(4));
  EXPECT_FALSE(scheduler_.serves(3));
  EXPECT_EQ(scheduler_.nodes(), (std::vector<std::string>{"b"}));
}

TEST_F(LeaderSchedulerTest, ARetiredEngineEndsItsRequestsAndNoneRunsAfter) {
  scheduler_.serve(pipeline(), false, 1, {"a"});
  std::promise<std::pair<engine::FinishReason, std::string>> finished;
  engine::RequestCallbacks callbacks;
  callbacks.on_token = [](const engine::GeneratedToken&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // still running when it is retired
    return true;
  };
  callbacks.on_finish = [&finished](engine::FinishReason reason, const std::string& error) {
    finished.set_value({reason, error});
  };
  engine::GenerationRequest request;
  request.prompt = {1, 300};
  request.max_tokens = 200;
  ASSERT_TRUE(scheduler_.engine()->submit(request, callbacks));
  scheduler_.retire(engine::FinishReason::Error, "the model does not fit", std::nullopt);
  EXPECT_EQ(scheduler_.engine(), nullptr);
  EXPECT_FALSE(scheduler_.serves(1));
  EXPECT_EQ(scheduler_.epoch(), 1u) << "the placement it ran last";
  scheduler_.join_retiring();
  const auto [reason, error] = finished.get_future().get();
  EXPECT_EQ(reason, engine::FinishReason::Error);
  EXPECT_EQ(error, "the model does not fit");
}

}  // namespace
}  // namespace strata::cluster
