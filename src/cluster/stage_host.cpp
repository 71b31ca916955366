#include "cluster/stage_host.h"

#include "model/tensor_share.h"

namespace strata::cluster {

StageHost::StageHost(StageHostOptions options) : options_(std::move(options)) {}

StageHost::~StageHost() { wait_for_load(); }

void StageHost::wait_for_load() {
  // Not under the lock: the load's end takes it. Called once nothing calls hold().
  if (loader_.joinable()) loader_.join();
}

void StageHost::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void StageHost::hold(std::optional<StageSeat> seat, uint64_t epoch) {
  bool ready = false;
  {
    std::lock_guard lock(mutex_);
    if (!seat) {
      if (stages_.has_current() || model_) log("this node holds no layers in placement " + std::to_string(epoch));
      stages_.retire();
      model_.reset();
      return;
    }
    const model::LayerRange range = seat->range;
    if (model_ && seat_.same_layers(*seat)) {
      if (stages_.ready_for(epoch)) return;
      stages_.start(model_, options_.threads, options_.kv(range), epoch);
      ready = true;
    } else {
      if (loading_) return;
      loading_ = true;
      load_progress_ = 0.0;
      stages_.retire();
      // The layers it keeps are shared with the new range's model, the others go with this one.
      std::shared_ptr<model::Model> previous = std::move(model_);
      if (loader_.joinable()) loader_.join();  // it has ended: loading_ was false
      log("loading layers [" + std::to_string(range.first) + ", " + std::to_string(range.last) + ")" +
          (seat->weights.empty() ? "" : " as member " + std::to_string(seat->member) + " of group '" + seat->group + "'") +
          " for placement " + std::to_string(epoch));
      loader_ = std::thread([this, seat = *seat, previous = std::move(previous)]() mutable {
        std::shared_ptr<model::Model> model;
        std::string error;
        try {
          if (options_.fetch) options_.fetch(seat.range);
          model = load(seat, previous.get());
          previous.reset();
        } catch (const std::exception& e) {
          error = e.what();
        }
        loaded(seat, std::move(model), error);
      });
    }
  }
  if (ready && options_.on_ready) options_.on_ready();  // tell the leader it is ready
}

std::shared_ptr<model::Model> StageHost::load(const StageSeat& seat, const model::Model* previous) {
  const auto progress = [this](double share) { load_progress_ = share; };
  if (seat.weights.empty()) return model::Model::load(options_.file, seat.range, progress, previous);
  if (!options_.join) throw std::runtime_error("this node cannot join a tensor-parallel group");
  std::shared_ptr<model::Exchange> exchange = options_.join(seat);
  const std::vector<model::TensorShare> shares =
      model::plan_tensor_shares(model::Config::from_gguf(*options_.file), seat.weights);
  std::unique_ptr<model::Model> share = model::Model::load_share(options_.file, seat.range, shares, *exchange);
  load_progress_ = 1.0;
  // The model gathers through the exchange until its last stage lets it go.
  return std::shared_ptr<model::Model>(share.release(), [exchange](model::Model* m) { delete m; });
}

void StageHost::loaded(const StageSeat& seat, std::shared_ptr<model::Model> model, const std::string& error) {
  const bool ready = model != nullptr;
  const model::LayerRange range = seat.range;
  {
    std::lock_guard lock(mutex_);
    loading_ = false;
    if (ready) {
      model_ = std::move(model);
      seat_ = seat;
      log("loaded layers [" + std::to_string(range.first) + ", " + std::to_string(range.last) + ")");
    } else if (error != last_load_error_) {
      // The next gossip round tries again: the same failure is said once.
      log("loading layers failed: " + error);
    }
    last_load_error_ = ready ? std::string() : error;
  }
  // Serve, and tell the leader, without waiting for the next round; a failure is tried again a
  // gossip round later, not at once in a loop.
  if (ready && options_.on_ready) options_.on_ready();
}

std::shared_ptr<engine::Stage> StageHost::stage_of(uint64_t epoch) const {
  std::lock_guard lock(mutex_);
  return stages_.of(epoch);
}

std::shared_ptr<engine::Stage> StageHost::current() const {
  std::lock_guard lock(mutex_);
  return stages_.current();
}

bool StageHost::ready_for(uint64_t epoch) const {
  std::lock_guard lock(mutex_);
  return stages_.ready_for(epoch);
}

uint64_t StageHost::ready_epoch() const {
  std::lock_guard lock(mutex_);
  return stages_.ready_epoch();
}

bool StageHost::has_current() const {
  std::lock_guard lock(mutex_);
  return stages_.has_current();
}

bool StageHost::has_any() const {
  std::lock_guard lock(mutex_);
  return stages_.has_any();
}

bool StageHost::holds_sequences() const {
  std::lock_guard lock(mutex_);
  return stages_.holds_sequences();
}

void StageHost::drop_previous(bool leader_serves, uint64_t placement_epoch, std::chrono::steady_clock::time_point now,
                              std::chrono::steady_clock::duration hand_over_limit) {
  std::lock_guard lock(mutex_);
  stages_.drop_previous(leader_serves, placement_epoch, now, hand_over_limit);
}

bool StageHost::loading() const {
  std::lock_guard lock(mutex_);
  return loading_;
}

double StageHost::load_progress() const { return load_progress_; }

void StageHost::describe(cluster_types::NodeInfo& info, model::KvType kv_type) const {
  std::lock_guard lock(mutex_);
  info.ready_epoch = stages_.ready_epoch();
  stages_.describe(info, kv_type);
  info.load_progress = loading_ ? load_progress_.load() : (stages_.has_current() ? 1.0 : 0.0);
}

}  // namespace strata::cluster
