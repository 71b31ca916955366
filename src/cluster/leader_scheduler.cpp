#include "cluster/leader_scheduler.h"

namespace strata::cluster {

void LeaderScheduler::serve(std::vector<std::shared_ptr<engine::Stage>> stages, bool move_state, uint64_t epoch,
                            std::vector<std::string> nodes) {
  if (engine_) {
    engine_->replace_pipeline(std::move(stages), move_state);
  } else {
    engine_ = make_(std::move(stages));
  }
  epoch_ = epoch;
  nodes_ = std::move(nodes);
}

void LeaderScheduler::retire(engine::FinishReason reason, std::string why, std::optional<uint64_t> pass_on_epoch) {
  retiring_.emplace_back([old = std::move(engine_), reason, why = std::move(why), pass_on_epoch] {
    if (pass_on_epoch) {
      old->pass_on(*pass_on_epoch, why);
    } else {
      old->abort(reason, why);
    }
  });
}

void LeaderScheduler::join_retiring() {
  for (std::thread& t : retiring_) t.join();
  retiring_.clear();
}

}  // namespace strata::cluster
