// The layers a node runs for its placement: the model of its range, loaded on a thread of its
// own (a node without the model file first fetches the tensors it lacks), and its pipeline
// stages across placement switches (node_stages.h): the current placement's, and the one
// before it, which goes on serving until the leader has switched and hands over its sequences'
// state then. A range that stays is started at once for the new placement, sharing the layers.
//
// A node in a tensor-parallel group loads its share of the layers (model::Model::load_share) once
// it has joined the group's links, a group of each placement its own.
//
// Its own lock guards its state; it never holds it while calling back, so the node may call it
// under its own lock, and its callbacks may take that.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "cluster/node_stages.h"
#include "gguf/gguf.h"
#include "model/exchange.h"

namespace strata::cluster {

// The longest a leader's switch to a new placement may take to hand over the sequences' state
// (finishing the batches in flight, then moving keys and values): a node keeps its previous
// stage this long, and a node that leaves waits this long for it.
inline constexpr auto kHandOverLimit = std::chrono::seconds(60);
// How long the members of a group wait for each other's links as they load their shares: each
// hears of the placement within a gossip round or two.
inline constexpr auto kGroupJoinLimit = std::chrono::seconds(20);

// The part of a placement's stage that a node computes: its layers and, in a tensor-parallel
// group, its place there.
struct StageSeat {
  model::LayerRange range;
  // A group's: its name (each placement's its own), the members' weights and the addresses of
  // their links in member order, and this node's index; no weights: the node alone.
  std::string group;
  std::vector<double> weights;
  std::vector<std::string> exchange_addresses;
  int member = 0;
  // The same layers, or the same share in the same group (wherever its links are reached).
  bool same_layers(const StageSeat& other) const {
    return range == other.range && group == other.group && weights == other.weights && member == other.member;
  }
};

struct StageHostOptions {
  std::shared_ptr<const gguf::File> file;
  int threads = 1;  // each stage's own
  // The KV pool of a stage over a range.
  std::function<engine::KvOptions(model::LayerRange)> kv;
  // Set for a node without the model file: before a range loads, fetches its tensors that the
  // file lacks; throws when they cannot be had.
  std::function<void(model::LayerRange)> fetch;
  // A stage became ready for its placement: its layers loaded, or kept for a new placement.
  std::function<void()> on_ready;
  std::function<void(const std::string&)> log;
  // Joins a group's links as `seat` says: the exchange its members gather through. Throws when
  // the members cannot all be reached.
  std::function<std::unique_ptr<model::Exchange>(const StageSeat& seat)> join;
};

class StageHost {
 public:
  explicit StageHost(StageHostOptions options);
  ~StageHost();  // waits for a load under way

  // Holds the layers `seat` gives this node in placement `epoch` (nullopt: the placement gives
  // this node none, and it lets its stage and layers go). Loads them unless held: the layers
  // kept from the range held before are shared, not prepared again (a group's share is always
  // loaded anew). A load that failed is tried again at the next call.
  void hold(std::optional<StageSeat> seat, uint64_t epoch);

  // NodeStages' answers, under this host's lock.
  std::shared_ptr<engine::Stage> stage_of(uint64_t epoch) const;
  std::shared_ptr<engine::Stage> current() const;
  bool ready_for(uint64_t epoch) const;
  uint64_t ready_epoch() const;
  bool has_current() const;
  bool has_any() const;
  bool holds_sequences() const;
  void drop_previous(bool leader_serves, uint64_t placement_epoch, std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::duration hand_over_limit);

  bool loading() const;
  // Returns once a load under way has ended (the node shuts down: nothing holds layers after).
  void wait_for_load();
  // What a Hello says of the stages: the placement whose layers it holds, how far their load
  // got, the sequences and KV pool of the current stage (of `kv_type`).
  void describe(cluster_types::NodeInfo& info, model::KvType kv_type) const;
  // How far the load under way got (0 to 1).
  double load_progress() const;

 private:
  // The load of `range` ended with `model`, or failed with `error`.
  void loaded(const StageSeat& seat, std::shared_ptr<model::Model> model, const std::string& error);
  // `seat`'s layers: a group member's share, over the exchange it joins, else the range.
  std::shared_ptr<model::Model> load(const StageSeat& seat, const model::Model* previous);
  void log(const std::string& line) const;

  StageHostOptions options_;
  mutable std::mutex mutex_;
  std::shared_ptr<model::Model> model_;  // the layers held, of the current or the last seat
  StageSeat seat_;                       // model_'s
  NodeStages stages_;
  bool loading_ = false;
  std::atomic<double> load_progress_{0.0};  // of the layers being loaded
  std::string last_load_error_;             // said once, while the same load fails
  std::thread loader_;
};

}  // namespace strata::cluster
