// A node's control loop without threads of its own or sockets, on the shared model and a clock
// of the test's own: a node alone places the model once its members have settled, loads its
// layers a round later and then schedules them; a placement that a leader's Hello brings is
// taken up and its layers held; a node refused its id stands aside and lets everything go.
#include "cluster/control_driver.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "rpc/messages.h"
#include "node_info_fixture.h"

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";
const ControlTime t0 = ControlTime{} + 1h;

class ControlDriverTest : public ::testing::Test {
 protected:
  ControlDriverTest()
      : file_(gguf::File::open(kDreams)),
        membership_(initial_control_state(view_of(node("b", "127.0.0.1:7002")), {}, t0), log()),
        leadership_(LeadershipOptions{.rules = {"b", Strategy::Speed, {}, 64, footprint_of(*file_)},
                                      .make_engine =
                                          [](std::vector<std::shared_ptr<engine::Stage>> stages) {
                                            engine::EngineOptions options;
                                            options.context_size = 128;
                                            return std::make_shared<engine::Engine>(
                                                std::move(stages), 512, [](engine::Token) { return false; }, options);
                                          },
                                      .remote_stage = nullptr,
                                      .log = log()}),
        stages_({file_, 1, [](model::LayerRange) { return engine::KvOptions{model::KvType::F32, {16}}; }, nullptr,
                 [this] {
                   std::lock_guard lock(mutex_);
                   ++ready_;
                   changed_.notify_all();
                 },
                 log()}),
        gossip_(GossipHost{}),  // never started: its act_now() only marks the next round as due
        driver_("b", {membership_, leadership_, stages_, gossip_}, [] { return node("b", "127.0.0.1:7002"); }, log()) {
    membership_.listening_at("127.0.0.1:7002", false, t0);
  }

  ~ControlDriverTest() override {
    if (std::shared_ptr<engine::Engine> engine = leadership_.scheduler().take()) engine->shutdown();
    leadership_.scheduler().join_retiring();
  }

  std::function<void(const std::string&)> log() {
    return [this](const std::string& line) {
      std::lock_guard lock(mutex_);
      lines_.push_back(line);
    };
  }
  // Waits up to 30 s for the stage host to have become ready `count` times.
  bool readied(int count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 30s, [&] { return ready_ >= count; });
  }
  bool said(const std::string& start) {
    std::lock_guard lock(mutex_);
    return std::any_of(lines_.begin(), lines_.end(), [&](const std::string& line) { return line.starts_with(start); });
  }

  std::shared_ptr<const gguf::File> file_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int ready_ = 0;
  std::vector<std::string> lines_;
  Membership membership_;
  Leadership leadership_;
  StageHost stages_;
  Gossip gossip_;
  ControlDriver driver_;
};

TEST_F(ControlDriverTest, ANodeAlonePlacesTheModelLoadsItsLayersAndSchedulesThem) {
  driver_.round(t0);
  EXPECT_EQ(leadership_.placement().epoch, 0u) << "the members settle first";
  driver_.round(t0 + kSettle + 1s);
  ASSERT_EQ(leadership_.placement().epoch, 1u);
  EXPECT_TRUE(said("placement 1 over 1 node(s): b [0, 4)"));
  EXPECT_FALSE(stages_.loading()) << "a new placement goes out before its layers load";
  driver_.round(t0 + kSettle + 2s);
  ASSERT_TRUE(readied(1));
  EXPECT_FALSE(leadership_.scheduling());
  driver_.round(t0 + kSettle + 3s);
  EXPECT_TRUE(stages_.ready_for(1));
  EXPECT_TRUE(leadership_.scheduling()) << "every stage is ready: the leader serves";
  EXPECT_TRUE(said("serving placement 1 (1 stage(s))"));
}

TEST_F(ControlDriverTest, APlacementAHelloBringsIsTakenUpAndItsLayersHeld) {
  cluster_types::Hello hello{node("a", "127.0.0.1:7001")};
  hello.sender.state = "serving";
  cluster_types::Placement& p = hello.placement;
  p.epoch = 6;
  p.leader_id = "a";
  for (const auto& [id, first, last] : {std::tuple{"a", 0, 2}, std::tuple{"b", 2, 4}}) {
    p.stages.push_back({id, std::string("127.0.0.1:700") + (id[0] == 'a' ? "1" : "2"), first, last});
  }
  const ControlDriver::Decision decision =
      driver_.carry_out(membership_.hello_received(hello, "ipv4:127.0.0.1:50000", t0), &hello.placement);
  EXPECT_TRUE(decision.refuse_caller.empty());
  EXPECT_EQ(leadership_.placement().epoch, 6u);
  EXPECT_TRUE(said("placement 6 from a: a [0, 2), b [2, 4)"));
  driver_.round(t0 + 100ms);
  ASSERT_TRUE(readied(1));
  EXPECT_TRUE(said("loading layers [2, 4) for placement 6"));
  driver_.round(t0 + 200ms);
  EXPECT_TRUE(stages_.ready_for(6));
  EXPECT_FALSE(leadership_.scheduling()) << "a leads";
}

TEST_F(ControlDriverTest, ANodeRefusedItsIdStandsAside) {
  driver_.round(t0);
  driver_.round(t0 + kSettle + 1s);
  ASSERT_EQ(leadership_.placement().epoch, 1u);
  rpc::HelloOutcome taken;
  taken.failure = rpc::HelloFailure::IdTaken;
  taken.message = "node id 'b' is taken by the process at 127.0.0.1:7009";
  driver_.carry_out(membership_.hello_answered("127.0.0.1:7009", taken, t0 + kSettle + 1s));
  EXPECT_TRUE(said("this node takes no part in the cluster: node id 'b' is taken"));
  driver_.round(t0 + kSettle + 2s);
  EXPECT_TRUE(leadership_.placement().stages.empty()) << "its placement is let go";
  EXPECT_FALSE(stages_.loading());
  EXPECT_FALSE(stages_.has_any());
}

}  // namespace
}  // namespace strata::cluster
