// The scheduler a leader runs every request on, over one placement's pipeline at a time, and
// the schedulers that ran before it, retiring: they pass their requests on, or end them, off the
// caller's thread (the node's gossip thread, which must go on answering peers meanwhile). Not
// thread-safe: the node's lock guards it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace strata::cluster {

class LeaderScheduler {
 public:
  // Makes the engine of the first pipeline.
  using MakeEngine = std::function<std::shared_ptr<engine::Engine>(std::vector<std::shared_ptr<engine::Stage>> stages)>;
  explicit LeaderScheduler(MakeEngine make) : make_(std::move(make)) {}

  // The engine running now, or null.
  const std::shared_ptr<engine::Engine>& engine() const { return engine_; }
  // It runs placement `epoch`'s pipeline.
  bool serves(uint64_t epoch) const { return engine_ && epoch_ == epoch; }
  // The placement of the pipeline it runs, or ran last.
  uint64_t epoch() const { return epoch_; }
  // The nodes of that pipeline, in order.
  const std::vector<std::string>& nodes() const { return nodes_; }

  // Runs placement `epoch`'s `stages`, those of `nodes`: on a new engine, or on the running one,
  // whose sequences' state moves to them when `move_state` (the old pipeline's nodes all still
  // run), else is computed again.
  void serve(std::vector<std::shared_ptr<engine::Stage>> stages, bool move_state, uint64_t epoch,
             std::vector<std::string> nodes);
  // The running engine passes its requests on with their state, named by placement
  // `pass_on_epoch`, or else ends them with `reason` and `why`. None runs after.
  void retire(engine::FinishReason reason, std::string why, std::optional<uint64_t> pass_on_epoch);
  // The running engine, taken out to be shut down without the node's lock. None runs after.
  std::shared_ptr<engine::Engine> take() { return std::move(engine_); }
  // Waits until every retiring engine is done.
  void join_retiring();

 private:
  MakeEngine make_;
  std::shared_ptr<engine::Engine> engine_;
  uint64_t epoch_ = 0;
  std::vector<std::string> nodes_;
  std::vector<std::thread> retiring_;
};

}  // namespace strata::cluster
