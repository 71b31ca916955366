#include "cluster/node.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "cluster/cluster_metrics.h"
#include "cluster/cluster_status.h"
#include "cluster/control_rules.h"
#include "cluster/hello_targets.h"
#include "cluster/leader_scheduler.h"
#include "cluster/node_resources.h"
#include "cluster/node_stages.h"
#include "cluster/node_weights.h"
#include "cluster/placement_proposal.h"
#include "cluster/resumable_request.h"
#include "rpc/hello_client.h"
#include "rpc/node_service.h"
#include "rpc/peer_channel.h"
#include "rpc/remote_generator.h"
#include "rpc/remote_stage.h"
#include "units/byte_size.h"

namespace strata::cluster {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr auto kGossipInterval = std::chrono::milliseconds(500);
constexpr auto kHelloDeadline = std::chrono::milliseconds(1000);
// How long a gossip round waits for its Hellos' answers before it acts on what it knows.
constexpr auto kHelloWait = std::chrono::milliseconds(200);
// The longest a leader's switch to a new placement may take to hand over the sequences'
// state (finishing the batches in flight, then moving keys and values): a node keeps its
// previous stage this long, and a node that leaves waits this long for it.
constexpr auto kHandOverLimit = std::chrono::seconds(60);
// Placements a node remembers, the current one included: a new leader finds the stages of the
// one before it there, which hold the state of the requests the old leader passes on.
constexpr size_t kRecentPlacements = 4;

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.starts_with("127.") || host == "[::1]" || host == "::1";
}

// "host:port"
bool is_loopback(const std::string& address) { return is_loopback_host(address.substr(0, address.rfind(':'))); }

// "ipv4:10.0.0.2:43122" -> "10.0.0.2"
std::string host_of_peer(const std::string& peer) {
  std::string rest = peer;
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (rest.starts_with(scheme)) rest = rest.substr(std::string_view(scheme).size());
  }
  return rest.substr(0, rest.rfind(':'));
}

// The cluster's own types for what peers say, at the protobuf boundary.
PlacementView view_of(const rpc::Placement& p) {
  PlacementView view{p.epoch(), p.leader_id(), {}, !p.error().empty()};
  for (const rpc::Stage& s : p.stages()) view.stages.push_back({s.node_id(), s.node_address()});
  return view;
}

NodeView view_of(const rpc::NodeInfo& info) {
  return {info.node_id(),     info.node_address(), info.instance(),         info.started_unix_ms(),
          info.ready_epoch(), info.state(),        info.leaving(),          info.protocol_version(),
          info.model_hash(),  info.model_name()};
}

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The options with the engine's threads resolved: every core unless given.
NodeOptions with_threads(NodeOptions options) {
  if (options.engine.threads <= 0) {
    options.engine.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  return options;
}

}  // namespace

std::string model_hash(const gguf::File& file) { return rpc::sha256_hex(file.header_bytes()); }

class ClusterNode::Impl final : public rpc::NodeHandler {
 public:
  Impl(std::shared_ptr<const gguf::File> file, std::function<bool(engine::Token)> eog, NodeOptions options)
      : file_(std::move(file)),
        eog_(std::move(eog)),
        options_(with_threads(std::move(options))),
        config_(model::Config::from_gguf(*file_)),
        key_(std::make_shared<rpc::ClusterKey>(options_.secret())),
        weights_(file_, key_,
                 {options_.node_id, model_hash(*file_), options_.engine.threads, options_.partial, options_.fetch_streams,
                  options_.test_fetch_delay, options_.on_transfer, [this](const std::string& line) { log(line); }}),
        remote_(rpc::Caller{options_.node_id, 0, key_}) {
    if (options_.engine.context_size <= 0) options_.engine.context_size = config_.context_length;
    // The placement reserves KV memory as this node stores it.
    ModelFootprint footprint = footprint_of(*file_);
    footprint.kv_bytes_per_layer_per_token = model::KvLayout(config_, 1, options_.engine.kv_type).block_bytes / model::kKvBlock;
    const uint64_t kv_reserve_tokens = static_cast<uint64_t>(options_.engine.context_size) *
                                       static_cast<uint64_t>(std::max(1, options_.engine.max_parallel));
    placement_rules_ = {options_.node_id, options_.strategy, options_.fixed_stages, kv_reserve_tokens, std::move(footprint)};
    if (!across_machines()) {
      for (const std::string& peer : options_.peers) {
        if (!is_loopback(peer)) {
          throw std::runtime_error("peer " + peer + " is not on this machine: a cluster across machines needs "
                                   "--cluster-key (or STRATA_CLUSTER_KEY) on every node");
        }
      }
      if (!is_loopback_host(options_.host)) {
        throw std::runtime_error("without --cluster-key the node service listens on this machine only; "
                                 "--node-host " + options_.host + " needs a key");
      }
    }
    self_.set_node_id(options_.node_id);
    self_.set_api_address(options_.api_address);
    self_.set_model_hash(model_hash(*file_));
    self_.set_protocol_version(rpc::kProtocolVersion);
    self_.set_instance(rpc::fresh_nonce());
    self_.set_started_unix_ms(rpc::unix_time_ms());
    self_.set_model_name(options_.partial ? options_.partial->manifest().model_name()
                                          : fs::path(file_->path()).stem().string());
    self_.set_memory_bytes(options_.memory_limit > 0 ? options_.memory_limit : detect_usable_memory());
    self_.set_kv_memory_bytes(options_.engine.kv_memory);
    if (options_.engine.kv_memory == 0) {
      // Its pool holds the same blocks whatever its range, each of these bytes per layer.
      self_.set_kv_bytes_per_layer(static_cast<uint64_t>(kv_options({0, 1}).blocks) *
                                   model::KvLayout(config_, 1, options_.engine.kv_type).block_bytes);
    }
    self_.set_weight_bytes_per_second(measure_weight_speed(options_.engine.threads));
    self_.set_state("starting");
    control_ = initial_control_state(view_of(self_), options_.peers, Clock::now());

    server_ = listen_for_nodes();
    const std::string advertised_host = options_.host == "0.0.0.0" ? "" : options_.host;
    {
      std::lock_guard lock(mutex_);
      self_.set_node_address(advertised_host + ":" + std::to_string(server_->port()));
      control_.self.address = self_.node_address();
      control_.started = Clock::now();
    }
    log("node " + options_.node_id + " listens for nodes on " + options_.host + ":" +
        std::to_string(server_->port()) + " (" + units::describe_bytes(self_.memory_bytes()) + " usable, " +
        units::describe_bytes(static_cast<uint64_t>(self_.weight_bytes_per_second())) + "/s of weights)" +
        (across_machines() ? "" : "; no --cluster-key: it forms a cluster only with this user's nodes on this machine"));
    start_discovery();
    gossip_ = std::thread([this] { gossip_loop(); });
  }

  ~Impl() override { shutdown(); }

  std::unique_ptr<rpc::NodeServer> listen_for_nodes() {
    const auto listen = [this](int port) {
      return std::make_unique<rpc::NodeServer>(*this, options_.node_id, key_, options_.host, port,
                                               [this](const std::string& line) { log(line); },
                                               options_.test_tensor_chunk_bytes);
    };
    if (!options_.any_port_if_taken || options_.node_port == 0) return listen(options_.node_port);
    try {
      return listen(options_.node_port);
    } catch (const rpc::PortTaken& taken) {
      log(std::string(taken.what()) + "; listening on any free port instead");
      return listen(0);
    }
  }

  int node_port() const { return server_->port(); }

  void shutdown() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    weights_.stop();
    changed_.notify_all();
    discovery_.reset();  // no more announcements of this node, nor calls back into it
    if (gossip_.joinable()) gossip_.join();
    std::shared_ptr<engine::Engine> scheduler;
    {
      std::lock_guard lock(mutex_);
      scheduler = scheduler_.take();
    }
    if (scheduler) scheduler->shutdown();
    scheduler_.join_retiring();
    rpc::RemoteStage::wait_for_releases(rpc::RemoteStage::kDefaultDeadline + std::chrono::seconds(1));
    remote_.shutdown();
    server_->stop();
    if (loader_.joinable()) loader_.join();
  }

  engine::ModelLimits limits() const {
    return {options_.engine.context_size, options_.engine.max_parallel, options_.engine.max_queued};
  }

  // A request of this node's API: counted until it ends, so that a node that leaves lets its
  // own clients' requests finish first; refused once it leaves.
  bool submit_for_client(engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
    {
      std::lock_guard lock(mutex_);
      if (control_.leaving) {
        throw engine::Unavailable("node " + options_.node_id + " is leaving the cluster: send requests to another node", 1);
      }
      ++client_requests_;
    }
    const auto ended = [this] {
      {
        std::lock_guard lock(mutex_);
        --client_requests_;
      }
      changed_.notify_all();
    };
    callbacks.on_finish = [ended, on_finish = std::move(callbacks.on_finish)](engine::FinishReason reason,
                                                                              const std::string& error) {
      if (on_finish) on_finish(reason, error);
      ended();
    };
    try {
      if (submit(std::move(request), std::move(callbacks))) return true;
    } catch (const std::exception&) {
      ended();
      throw;
    }
    ended();  // refused: its callbacks are never called
    return false;
  }

  bool submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
    const auto deadline = Clock::now() + options_.startup_wait;
    while (true) {
      std::shared_ptr<engine::Engine> local;
      rpc::PeerChannel leader;
      {
        std::unique_lock lock(mutex_);
        while (true) {
          if (stopping_) throw engine::Unavailable("the node is shutting down");
          if (const std::string why = refusal(); !why.empty()) throw engine::Unavailable(why, 30);
          if (!placement_.error().empty()) throw engine::Unavailable(placement_.error(), 30);
          if (scheduling()) {
            local = scheduler_.engine();
            break;
          }
          if (const PeerState* l = serving_leader()) {
            leader = channel(l->info.address);
            break;
          }
          if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
            throw engine::Unavailable("the cluster is not serving yet: " + waiting_for(), 5);
          }
        }
      }
      if (local) return local->submit(request, resumable(request, std::move(callbacks), resubmit_, options_.log));
      try {
        return remote_.submit(leader, request, resumable(request, callbacks, resubmit_, options_.log));
      } catch (const engine::Unavailable&) {
        // The leader is between placements: wait for the next one, up to the startup wait.
        std::unique_lock lock(mutex_);
        if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) throw;
      }
    }
  }

  // NodeHandler
  std::string hello(const rpc::HelloRequest& request, const std::string& peer, rpc::HelloReply& reply) override {
    rpc::NodeInfo sender = request.sender();
    // A node listening on every interface is reached at the host its call came from.
    if (sender.node_address().starts_with(":")) sender.set_node_address(host_of_peer(peer) + sender.node_address());
    {
      std::lock_guard lock(mutex_);
      // A new placement to load, or a peer now ready for it: acted on at once, not a gossip round later.
      const Decision decision = hear(sender, request.known(), request.placement(), {}, 0.0);
      if (!decision.refuse_caller.empty()) return decision.refuse_caller;
      *reply.mutable_node() = self_info();
      // A node refused tells nothing but who it is.
      if (!refusal().empty()) return {};
      for (const auto& [id, info] : peer_infos_) *reply.add_known() = info;
      *reply.mutable_placement() = placement_;
    }
    changed_.notify_all();
    return {};
  }

  std::shared_ptr<engine::Stage> stage(uint64_t epoch, std::string& why) override {
    std::lock_guard lock(mutex_);
    if (why = refusal(); !why.empty()) return nullptr;
    // The previous placement's stage serves until the leader has switched, and hands over
    // the state of its sequences then.
    std::shared_ptr<engine::Stage> stage = stages_.of(epoch);
    if (!stage) {
      why = "node " + options_.node_id + " runs no stage of placement " + std::to_string(epoch) +
            " (its placement is " + std::to_string(placement_.epoch()) + ")";
    }
    return stage;
  }

  std::shared_ptr<engine::Stage> chain_stage(uint64_t epoch, const std::string& node_id, std::string& why) override {
    std::lock_guard lock(mutex_);
    const auto found = recent_placements_.find(epoch);
    if (found != recent_placements_.end() && node_id != options_.node_id) {
      for (const rpc::Stage& s : found->second.stages()) {
        if (s.node_id() == node_id) return reached_stage(s, epoch, /*leading=*/false);
      }
    }
    why = "node " + options_.node_id + " knows no stage of node " + node_id + " in placement " + std::to_string(epoch);
    return nullptr;
  }

  std::shared_ptr<engine::Generator> scheduler(std::string& why) override {
    std::lock_guard lock(mutex_);
    if (!scheduling() || !refusal().empty()) {
      why = "node " + options_.node_id + " does not schedule requests now: " + waiting_for();
      return nullptr;
    }
    return scheduler_.engine();
  }

  // NodeHandler: weights for nodes that have no file.
  std::optional<rpc::ModelManifestReply> manifest(const std::string& model_hash, std::string& why) override {
    return weights_.manifest(model_hash, why);
  }

  std::optional<rpc::TensorBytes> tensor(const rpc::FetchTensorRequest& request, std::string& why) override {
    return weights_.tensor(request, why);
  }

  std::pair<int, std::string> health() const {
    std::lock_guard lock(mutex_);
    if (control_.leaving) return {503, R"({"status":"leaving"})"};
    if (const std::string why = refusal(); !why.empty()) {
      return {503, json{{"status", "refused"}, {"waiting_for", why}}.dump()};
    }
    if (serving()) {
      return {200, R"({"status":"ok"})"};
    }
    json body{{"status", loading_ ? "loading" : "waiting"}, {"waiting_for", waiting_for()}};
    if (loading_) body["progress"] = load_progress_.load();
    if (options_.partial) body["transfer"] = transfer_json(weights_.held());
    return {503, body.dump()};
  }

  std::string readiness() const {
    std::lock_guard lock(mutex_);
    if (!refusal().empty()) return waiting_for();
    if (serving() || stopping_ || !placement_.error().empty()) return {};
    std::string why = waiting_for();
    if (loading_) why += " (this node has " + std::to_string(static_cast<int>(load_progress_.load() * 100)) + "% of its layers)";
    return why;
  }

  std::string status_json() const { return cluster::status_json(status()); }

  ClusterStatus status() const {
    std::lock_guard lock(mutex_);
    ClusterStatus status{.node_id = options_.node_id,
                         .model_name = self_.model_name(),
                         .model_hash = self_.model_hash(),
                         .layers = config_.layer_count,
                         .leader = leader_id(),
                         .serving = serving(),
                         .placement = placement_,
                         .leaving = control_.leaving};
    status.nodes.push_back({self_info(), true, std::nullopt});
    for (const auto& [id, peer] : control_.peers) {
      status.nodes.push_back({peer_infos_.at(id), false,
                              PeerLink{alive(peer, Clock::now()),
                                       peer.seen ? std::optional(seconds_since(peer.last_seen)) : std::nullopt,
                                       peer.rtt_ms, peer.problem}});
    }
    if (!placement_.error().empty() || placement_.stages_size() == 0) status.waiting_for = waiting_for();
    if (const std::shared_ptr<engine::Engine>& scheduler = scheduler_.engine()) {
      const engine::Engine::SwitchCounts counts = scheduler->switch_counts();
      const engine::Engine::SpeculationCounts drafts = scheduler->speculation();
      status.scheduler = SchedulerCounts{counts.handed_over, counts.recomputed, scheduler->preemptions(),
                                         drafts.steps,       drafts.drafted,    drafts.accepted};
    }
    return status;
  }

  void write_metrics(metrics::Exposition& out) const {
    const ClusterStatus now = status();
    std::shared_ptr<engine::Engine> scheduler;
    {
      std::lock_guard lock(mutex_);
      scheduler = scheduler_.engine();
    }
    // The engine's lock is taken without this node's: its loop calls back into the node.
    cluster::write_metrics(now, scheduler ? scheduler->load() : engine::Engine::Load{}, out);
  }

  void leave() {
    std::unique_lock lock(mutex_);
    const auto someone_takes_over = [&] { return cluster::someone_takes_over(control_, Clock::now()); };
    if (stopping_ || !someone_takes_over()) return;
    decide(control::DrainAsked{});
    changed_.notify_all();
    log("leaving: the cluster places the model without this node, the sequences it holds move to the nodes "
        "that take its layers over, and its clients' requests in flight finish");
    const auto started = Clock::now();
    const bool left = changed_.wait_for(lock, kHandOverLimit, [&] {
      return stopping_ || (handed_over() && client_requests_ == 0) || !someone_takes_over();
    });
    const std::string after = std::to_string(seconds_since(started)).substr(0, 4) + " s";
    log(left ? "left after " + after + ": nothing of this node is in use"
             : "leaving after " + after + " without the hand-over confirmed");
  }

  std::string why_needed() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> others = members();
    std::erase(others, options_.node_id);
    if (others.empty()) return "no other node of its cluster runs to take its layers over";
    try {
      std::vector<NodeCapacity> nodes;
      for (const std::string& id : others) nodes.push_back(capacity_of(peer_infos_.at(id)));
      place_layers(nodes, placement_rules_.footprint, placement_request(placement_rules_));
    } catch (const DoesNotFit& e) {
      return std::string("the other nodes cannot hold the model without this node: ") + e.what();
    }
    return {};
  }

  // A placement without this node serves, and this node holds no sequence's state.
  bool handed_over() const {
    if (placement_.stages_size() == 0 || serving_leader() == nullptr) return false;
    for (const rpc::Stage& s : placement_.stages()) {
      if (s.node_id() == options_.node_id) return false;
    }
    return !stages_.holds_sequences();
  }

 private:
  // The pool of a stage over `range`: --kv-memory, or the placement's KV reserve for it.
  engine::KvOptions kv_options(model::LayerRange range) const {
    const engine::EngineOptions& e = options_.engine;
    return {e.kv_type, engine::kv_pool_blocks(config_, range.size(), e.kv_type, e.kv_memory, e.context_size, e.max_parallel)};
  }

  void log(const std::string& line) const {
    if (options_.log) options_.log(line);
  }

  // A cluster key was given; without one the node keeps to this machine, under its user's secret.
  bool across_machines() const { return !options_.cluster_key.empty(); }

  // The live peers of this model, with the weights each says it holds, in id order.
  std::vector<WeightsHolder> weights_holders() const {
    std::lock_guard lock(mutex_);
    std::vector<WeightsHolder> holders;
    for (const auto& [id, peer] : control_.peers) {
      if (!alive(peer, Clock::now()) || !compatible(peer)) continue;
      const rpc::NodeInfo& info = peer_infos_.at(id);
      holders.push_back({info.node_address(), info.weights()});
    }
    return holders;
  }

  // A new placement moved this node's layers off `range`.
  bool layers_moved(model::LayerRange range) const {
    std::lock_guard lock(mutex_);
    const auto& stages = placement_.stages();
    return std::none_of(stages.begin(), stages.end(), [&](const rpc::Stage& s) {
      return s.node_id() == options_.node_id && s.first_layer() == range.first && s.last_layer() == range.last;
    });
  }

  void start_discovery() {
    if (!options_.discovery) return;
    if (!across_machines()) {
      log("discovery is off: without --cluster-key a node forms a cluster only with nodes on this machine, "
          "named with --peers");
      return;
    }
    if (is_loopback_host(options_.host)) {
      log("discovery is off: the node service listens on " + options_.host + " only, out of reach of other machines");
      return;
    }
    Announcement self;
    self.node_id = options_.node_id;
    self.node_port = server_->port();
    self.model_hash = self_.model_hash();
    self.protocol_version = rpc::kProtocolVersion;
    discovery_ = std::make_unique<Discovery>(DiscoveryOptions{
        .self = self,
        .port = options_.discovery_port,
        .interface_name = options_.discovery_interface,
        .key = key_,
        .on_found =
            [this](const std::string& node_id, const std::string& address) {
              if (discovered_.found(address, Clock::now())) log("discovery found node " + node_id + " at " + address);
            },
        .log = [this](const std::string& line) { log(line); }});
  }

  rpc::NodeInfo self_info() const {
    rpc::NodeInfo info = self_;
    info.set_ready_epoch(stages_.ready_epoch());
    info.set_leaving(control_.leaving);
    stages_.describe(info, options_.engine.kv_type);
    info.set_described_unix_ms(rpc::unix_time_ms());
    info.set_load_progress(loading_ ? load_progress_.load() : (stages_.has_current() ? 1.0 : 0.0));
    *info.mutable_weights() = weights_.held();
    info.set_state(!refusal().empty() ? "refused"
                   : scheduling()       ? "serving"
                   : info.weights().fetching()                          ? "fetching"
                   : loading_                                           ? "loading"
                   : stages_.has_current()                              ? "ready"
                   : placement_.stages_size() > 0                       ? "idle"
                                                                        : "starting");
    return info;
  }

  // This node schedules the requests of the current placement.
  bool scheduling() const { return scheduler_.serves(placement_.epoch()); }
  // Requests can run now: here, or at a leader that serves.
  // The placement names this node, which holds no stage at all: it restarted faster than it
  // was seen leaving, and the leader serves through its previous process, gone. (A node that
  // changes stages keeps its previous one meanwhile.)
  bool own_stage_missing() const {
    const bool placed_here = std::any_of(placement_.stages().begin(), placement_.stages().end(),
                                         [&](const rpc::Stage& s) { return s.node_id() == options_.node_id; });
    return placed_here && !stages_.has_any();
  }
  bool serving() const { return scheduling() || (serving_leader() != nullptr && !own_stage_missing()); }

  // What the rules decided on an event that its caller acts on.
  struct Decision {
    std::string refuse_caller;  // the Hello received is answered with this refusal
    bool stood_aside = false;
  };
  // The Hello an event came from: what KeepInfo and AdoptPlacement take of it.
  struct Heard {
    const rpc::NodeInfo& sender;
    const google::protobuf::RepeatedPtrField<rpc::NodeInfo>& known;
    const rpc::Placement& placement;
  };

  // The one place this node's decisions are made: the rules (control_rules.h) decide on
  // `event`, and the actions they return are carried out here (mutex_ held).
  Decision decide(const ControlEvent& event, const Heard* heard = nullptr) {
    ControlStep next = step(control_, event, Clock::now());
    control_ = std::move(next.state);
    Decision decision;
    for (const ControlAction& action : next.actions) {
      std::visit(Overloaded{
                     [&](const control::Log& a) { log(a.line); },
                     [&](const control::LogOnce& a) { log_once(a.key, a.line); },
                     [&](const control::ActNow&) { act_now_ = true; },
                     [&](const control::RefuseCaller& a) { decision.refuse_caller = a.why; },
                     [&](const control::KeepInfo& a) {
                       const rpc::NodeInfo& info = a.source < 0 ? heard->sender : heard->known[a.source];
                       peer_infos_[info.node_id()] = info;
                     },
                     [&](const control::AdoptPlacement&) {
                       set_placement(heard->placement);
                       log("placement " + std::to_string(placement_.epoch()) + " from " + placement_.leader_id() +
                           ": " + stages_text(placement_));
                     },
                     [&](const control::StandAside& a) {
                       stand_aside(a.why);
                       decision.stood_aside = true;
                     },
                     [&](const control::ProposePlacement& a) { place(a); },
                 },
                 action);
    }
    return decision;
  }

  // A Hello received (`address` empty), or the reply to this node's Hello to `address`.
  Decision hear(const rpc::NodeInfo& sender, const google::protobuf::RepeatedPtrField<rpc::NodeInfo>& known,
                const rpc::Placement& placement, const std::string& address, double rtt_ms) {
    control::HelloHeard hello{view_of(sender), {}, view_of(placement), address, rtt_ms, rpc::unix_time_ms()};
    for (const rpc::NodeInfo& info : known) hello.known.push_back(view_of(info));
    const Heard heard{sender, known, placement};
    return decide(hello, &heard);
  }

  // A node refused holds nothing and schedules nothing: its placement, made before it was
  // refused, is let go with its stage and its requests.
  void stand_aside(const std::string& why) {
    if (scheduler_.engine()) scheduler_.retire(engine::FinishReason::Error, why, std::nullopt);
    if (placement_.stages_size() > 0 || !placement_.error().empty()) placement_ = rpc::Placement();
    apply();
  }

  std::string refusal() const { return cluster::refusal(control_, Clock::now()); }

  void log_once(const std::string& key, const std::string& line) {
    if (said_once_.insert(key).second) log(line);
  }

  std::vector<std::string> members() const { return cluster::members(control_, Clock::now()); }
  std::string leader_id() const { return cluster::leader_id(control_, Clock::now()); }
  const PeerState* serving_leader() const { return cluster::serving_leader(control_, Clock::now()); }

  std::string waiting_for() const {
    if (const std::string why = refusal(); !why.empty()) return why;
    if (!placement_.error().empty()) return placement_.error();
    if (placement_.stages_size() == 0) {
      return "a placement (" + std::to_string(members().size()) + " node(s) known; the leader places the model "
             "once the members have settled)";
    }
    std::string missing;
    for (const rpc::Stage& s : placement_.stages()) {
      const bool ready = s.node_id() == options_.node_id ? stages_.ready_for(placement_.epoch())
                                                         : peer_ready(s.node_id(), placement_.epoch());
      if (!ready) missing += (missing.empty() ? "" : ", ") + s.node_id();
    }
    if (!missing.empty()) return "nodes loading their layers of placement " + std::to_string(placement_.epoch()) + ": " + missing;
    return "the leader " + placement_.leader_id() + " to start its scheduler";
  }

  bool peer_ready(const std::string& id, uint64_t epoch) const {
    return cluster::peer_ready(control_, id, epoch, Clock::now());
  }

  rpc::PeerChannel channel(const std::string& address) {
    auto& ch = channels_[address];
    if (!ch) ch = rpc::PeerChannel::to(address, *key_);
    return ch;
  }

  void gossip_loop() {
    // address -> its Hello task. A peer that does not answer (a cable cut) holds up only
    // its own Hellos for their deadline, never the round, so that news of the others (a new
    // placement, a node ready for it) goes on at once. Declared before every lock of the loop:
    // its futures wait for their tasks, which take mutex_.
    std::map<std::string, std::future<void>> hellos;
    while (true) {
      std::vector<std::string> addresses;
      rpc::HelloRequest request;
      HelloNews news;
      {
        std::unique_lock lock(mutex_);
        if (stopping_) return;
        addresses = hello_targets(control_, discovered_.addresses(Clock::now()));
        request = hello_request();
        news = hello_news();
        // A peer whose Hello is still in flight is passed by: its task says this round's news
        // once the Hello returns (decided under this lock, so that no news falls between).
        std::erase_if(addresses, [&](const std::string& address) { return !greeting_.insert(address).second; });
      }
      std::erase_if(hellos, [](const auto& entry) {
        return entry.second.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      });
      auto unanswered = std::make_shared<std::atomic<int>>(static_cast<int>(addresses.size()));  // of this round's Hellos
      for (const std::string& address : addresses) {
        hellos[address] = std::async(std::launch::async, [this, address, request, said = news, unanswered]() mutable {
          bool greeted = greet(address, request);
          std::unique_lock lock(mutex_);  // not between the round's look at the count and its wait
          --*unanswered;
          changed_.notify_all();
          for (HelloNews now; greeted && !stopping_ && (now = hello_news()) != said; said = now) {
            request = hello_request();
            lock.unlock();
            greeted = greet(address, request);
            lock.lock();
          }
          greeting_.erase(address);  // a failed Hello is tried again by the next round
        });
      }
      {
        std::unique_lock lock(mutex_);
        changed_.wait_for(lock, kHelloWait, [&] { return stopping_ || act_now_ || *unanswered == 0; });
        act_now_ = false;
        if (stopping_) return;
        const uint64_t epoch = placement_.epoch();
        // A new placement goes out first (the next round, at once): loading layers here would
        // take the cores its Hellos need.
        if (!decide(control::Round{}).stood_aside && placement_.epoch() == epoch) {
          apply();
          start_scheduler();
          drop_previous_stage();
        }
      }
      changed_.notify_all();
      std::unique_lock lock(mutex_);
      changed_.wait_for(lock, kGossipInterval, [&] { return stopping_ || act_now_; });
      act_now_ = false;
      if (stopping_) return;
    }
  }

  // What in a Hello its receiver acts on at once: the placement, and whether this node is ready
  // for it, serves it or leaves.
  struct HelloNews {
    uint64_t epoch = 0;
    std::string leader;
    uint64_t ready_epoch = 0;
    bool serving = false;
    bool leaving = false;
    bool operator==(const HelloNews&) const = default;
  };
  HelloNews hello_news() const {
    return {placement_.epoch(), placement_.leader_id(), stages_.ready_epoch(), scheduling(), control_.leaving};
  }

  // What this node tells a peer: itself, the nodes it sees alive, its placement (mutex_ held).
  rpc::HelloRequest hello_request() const {
    rpc::HelloRequest request;
    *request.mutable_sender() = self_info();
    for (const auto& [id, peer] : control_.peers) {
      if (alive(peer, Clock::now())) *request.add_known() = peer_infos_.at(id);
    }
    *request.mutable_placement() = placement_;
    return request;
  }

  // say_hello, which fails only on something unexpected (signing, logging): that is logged.
  bool greet(const std::string& address, const rpc::HelloRequest& request) {
    try {
      say_hello(address, request);
      return true;
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      log("a Hello to " + address + " failed: " + e.what());
      return false;
    }
  }

  void say_hello(const std::string& address, const rpc::HelloRequest& request) {
    rpc::PeerChannel ch;
    {
      std::lock_guard lock(mutex_);
      ch = channel(address);
    }
    const rpc::HelloOutcome outcome = rpc::say_hello(ch, request, options_.node_id, *key_, kHelloDeadline);
    const rpc::HelloReply& reply = outcome.reply;
    std::lock_guard lock(mutex_);
    switch (outcome.failure) {
      case rpc::HelloFailure::None: break;
      case rpc::HelloFailure::Unreachable: decide(control::HelloRefused{address}); break;
      case rpc::HelloFailure::HandshakeRefused:
        decide(control::HelloRefused{address});
        log_once(address + " handshake",
                 "the TLS handshake with the node at " + address + " was refused: it has another cluster key (or it "
                 "is not a Strata node of protocol " + std::to_string(rpc::kProtocolVersion) + "): " + outcome.message);
        break;
      case rpc::HelloFailure::IdTaken: decide(control::IdTaken{address, outcome.message}); break;
      case rpc::HelloFailure::Refused:
        log_once(address + outcome.message, "node at " + address + " refused this node: " + outcome.message);
        break;
      case rpc::HelloFailure::Other: break;
    }
    if (outcome.failure != rpc::HelloFailure::None) {
      if (act_now_) changed_.notify_all();
      return;
    }
    if (const std::string why = rpc::malformed(reply); !why.empty()) {
      log_once(address + why, "refused the Hello reply of the node at " + address + ": " + why);
      return;
    }
    rpc::NodeInfo info = reply.node();
    if (info.node_address().starts_with(":")) info.set_node_address(address.substr(0, address.rfind(':')) + info.node_address());
    // The answer may come after its round has acted: news in it starts the next one now.
    hear(info, reply.known(), reply.placement(), address, outcome.rtt_ms);
    if (act_now_) changed_.notify_all();
  }

  // Leader only: the new placement the rules ask for.
  void place(const control::ProposePlacement& proposal) {
    const std::vector<std::string>& now = proposal.members;
    std::vector<rpc::NodeInfo> members;
    for (const std::string& id : now) members.push_back(id == options_.node_id ? self_info() : peer_infos_.at(id));
    const Proposal next = propose_placement(proposal.epoch, members, placement_, proposal.may_repair, placement_rules_);
    if (!next.waits.empty()) {
      // A hand-made placement may name nodes that have not joined yet: wait for them. These
      // members are seen, so that a node of the placement that left and comes back (a new
      // process, holding no sequences) gets a new epoch.
      if (waiting_logged_.insert(next.waits).second) log("the fixed placement waits: " + next.waits);
      decide(control::PlacementWaits{now});
      return;
    }
    const rpc::Placement& placement = next.placement;
    set_placement(placement);
    decide(control::PlacementMade{now, view_of(placement)});
    log("placement " + std::to_string(placement.epoch()) + " over " + std::to_string(now.size()) + " node(s): " +
        stages_text(placement) + (placement.reason().empty() ? "" : "\n  " + placement.reason()) + left_out_text());
  }

  // The live nodes that a placement leaves out for their model or protocol, as lines of the
  // placement's log: a node alone among such nodes says why.
  std::string left_out_text() const {
    std::string text;
    for (const auto& [id, peer] : control_.peers) {
      if (alive(peer, Clock::now()) && !compatible(peer)) {
        text += "\n  " + id + " at " + peer.info.address + " is left out: it " + peer.problem;
      }
    }
    return text;
  }

  // Every node: hold the layers the current placement gives this node, for its epoch.
  void apply() {
    const rpc::Stage* mine = nullptr;
    for (const rpc::Stage& s : placement_.stages()) {
      if (s.node_id() == options_.node_id) mine = &s;
    }
    if (mine == nullptr) {
      if (stages_.has_current() || model_) log("this node holds no layers in placement " + std::to_string(placement_.epoch()));
      stages_.retire();
      model_.reset();
      return;
    }
    const model::LayerRange range{mine->first_layer(), mine->last_layer()};
    if (model_ && model_->range().first == range.first && model_->range().last == range.last) {
      if (!stages_.ready_for(placement_.epoch())) {
        stages_.start(model_, options_.engine.threads, kv_options(range), placement_.epoch());
        act_now_ = true;  // tell the leader it is ready
      }
      return;
    }
    if (loading_) return;
    loading_ = true;
    load_progress_ = 0.0;
    stages_.retire();
    // The layers it keeps are shared with the new range's model, the others go with this one.
    std::shared_ptr<model::Model> previous = std::move(model_);
    if (loader_.joinable()) loader_.join();
    const uint64_t epoch = placement_.epoch();
    log("loading layers [" + std::to_string(range.first) + ", " + std::to_string(range.last) + ") for placement " +
        std::to_string(epoch));
    loader_ = std::thread([this, range, previous = std::move(previous)]() mutable {
      std::shared_ptr<model::Model> model;
      std::string error;
      try {
        if (options_.partial) {
          weights_.fetch_layers(range, [this] { return weights_holders(); }, [this, range] { return layers_moved(range); });
        }
        model = model::Model::load(file_, range, [this](double share) { load_progress_ = share; }, previous.get());
        previous.reset();
      } catch (const std::exception& e) {
        error = e.what();
      }
      {
        std::lock_guard lock(mutex_);
        loading_ = false;
        const bool loaded = model != nullptr;
        if (loaded) {
          model_ = std::move(model);
          log("loaded layers [" + std::to_string(range.first) + ", " + std::to_string(range.last) + ")");
        } else if (error != last_load_error_) {
          // The next gossip round tries again: the same failure is said once.
          log("loading layers failed: " + error);
        }
        // Serve, and tell the leader, without waiting for the next round; a failure is tried
        // again a gossip round later, not at once in a loop.
        if (loaded) act_now_ = true;
        last_load_error_ = loaded ? std::string() : error;
      }
      changed_.notify_all();
    });
  }

  // Leader only: once every stage holds its layers of the current placement, run requests
  // there. Requests of an older placement go on in the new one, computed again from their
  // tokens or moved with their state. A node that stops leading passes its requests on to the
  // new leader once that serves, with their state while every stage of its pipeline runs.
  void start_scheduler() {
    const std::string lost = std::string(rpc::kSchedulerLost) + "this node no longer leads the cluster";
    if (scheduler_.engine() && placement_.leader_id() != options_.node_id) {
      const bool all_alive = scheduled_nodes_alive();
      // Until then its requests go on here, and new ones wait for the new leader.
      if (all_alive && placement_.error().empty() && serving_leader() == nullptr) return;
      log(all_alive ? "another node leads now: the requests scheduled here move to it with their state"
                    : "another node leads now: the requests scheduled here move to it");
      // A request passed on, or ended as Lost, goes on at the next leader.
      scheduler_.retire(engine::FinishReason::Lost, lost, all_alive ? std::optional(scheduler_.epoch()) : std::nullopt);
    }
    if (scheduler_.engine() && !placement_.error().empty()) {
      // The nodes left cannot hold the model: its requests end now, saying what is missing.
      log("the requests scheduled here end: " + placement_.error());
      scheduler_.retire(engine::FinishReason::Error, placement_.error(), std::nullopt);
    }
    if (placement_.leader_id() != options_.node_id || placement_.stages_size() == 0) return;
    if (scheduling()) return;
    // Every stage holds its layers first; only then are the links to them made.
    for (const rpc::Stage& s : placement_.stages()) {
      const bool ready = s.node_id() == options_.node_id ? stages_.ready_for(placement_.epoch())
                                                          : peer_ready(s.node_id(), placement_.epoch());
      if (!ready) return;
    }
    std::vector<std::shared_ptr<engine::Stage>> stages;
    std::vector<std::string> nodes;
    for (const rpc::Stage& s : placement_.stages()) {
      stages.push_back(s.node_id() == options_.node_id ? stages_.current() : remote_stage(s, placement_.epoch()));
      nodes.push_back(s.node_id());
    }
    // When every node of the old pipeline still runs (one leaves or joins), the sequences'
    // state moves to the new stages; after a loss they are computed again.
    scheduler_.serve(std::move(stages), scheduled_nodes_alive(), placement_.epoch(), std::move(nodes));
    log("serving placement " + std::to_string(scheduler_.epoch()) + " (" + std::to_string(placement_.stages_size()) +
        " stage(s))");
  }

  // Every node of the pipeline this node schedules still runs.
  bool scheduled_nodes_alive() const { return all_alive(control_, scheduler_.nodes(), Clock::now()); }

  // `leading`: the leader's, which repairs the placement when the stage is lost.
  std::shared_ptr<engine::Stage> remote_stage(const rpc::Stage& s, uint64_t epoch, bool leading = true) {
    rpc::Caller caller{options_.node_id, epoch, key_, options_.test_link_delay, {}};
    if (leading) caller.on_lost = [this](const std::string& peer_id, bool unreachable) { stage_lost(peer_id, unreachable); };
    return rpc::remote_stage(s.node_id(), channel(s.node_address()), std::move(caller),
                             engine::StageLayers{s.first_layer(), s.last_layer()});
  }

  // Another node's stage of a recent placement (the current one too), at the address this node knows it by
  // now: a leader names itself in its placements by the port it listens on only. mutex_ held.
  std::shared_ptr<engine::Stage> reached_stage(rpc::Stage s, uint64_t epoch, bool leading) {
    const auto peer = peer_infos_.find(s.node_id());
    if (peer != peer_infos_.end()) s.set_node_address(peer->second.node_address());
    return remote_stage(s, epoch, leading);
  }

  // The stages of placement `epoch`, as far as they may still hold sequences' state: the state
  // of the requests a previous leader passed on moves from them. Empty when unknown.
  std::vector<std::shared_ptr<engine::Stage>> stages_of(uint64_t epoch) {
    std::lock_guard lock(mutex_);
    const auto found = recent_placements_.find(epoch);
    if (found == recent_placements_.end()) return {};
    std::vector<std::shared_ptr<engine::Stage>> stages;
    for (const rpc::Stage& s : found->second.stages()) {
      if (s.node_id() != options_.node_id) {
        stages.push_back(reached_stage(s, epoch, /*leading=*/true));
      } else if (std::shared_ptr<engine::Stage> local = stages_.of(epoch)) {
        stages.push_back(std::move(local));
      } else {
        return {};
      }
    }
    return stages;
  }

  // The placement changes; the last few are kept for stages_of.
  void set_placement(const rpc::Placement& p) {
    if (p.epoch() != placement_.epoch()) {
      metrics::process_registry().counter("strata_placement_switches_total", "Placements this node has taken up.").add();
    }
    placement_ = p;
    recent_placements_[p.epoch()] = p;
    while (recent_placements_.size() > kRecentPlacements) recent_placements_.erase(recent_placements_.begin());
  }

  void drop_previous_stage() {
    stages_.drop_previous(scheduling() || serving_leader() != nullptr, placement_.epoch(), Clock::now(), kHandOverLimit);
  }

  void stage_lost(const std::string& peer_id, bool unreachable) {
    {
      std::lock_guard lock(mutex_);
      decide(control::StageFailed{peer_id, unreachable});
    }
    changed_.notify_all();
  }

  std::shared_ptr<const gguf::File> file_;
  std::function<bool(engine::Token)> eog_;
  NodeOptions options_;
  model::Config config_;
  PlacementRules placement_rules_;  // set once the engine options are resolved
  std::shared_ptr<rpc::ClusterKey> key_;
  NodeWeights weights_;
  rpc::RemoteGenerator remote_;
  // Where a request whose scheduler was lost goes on: to whichever scheduler serves next.
  const Resubmit resubmit_ = [this](engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
    return submit(std::move(request), std::move(callbacks));
  };
  std::unique_ptr<rpc::NodeServer> server_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  bool act_now_ = false;  // something changed that the gossip loop acts on: run it now
  rpc::NodeInfo self_;
  ControlState control_;  // what the rules decide by
  std::map<std::string, rpc::NodeInfo> peer_infos_;  // what each peer of control_ said of itself, whole
  DiscoveredNodes discovered_;
  std::map<std::string, rpc::PeerChannel> channels_;
  std::set<std::string> said_once_;  // keys of log lines said once
  std::set<std::string> greeting_;  // addresses with a Hello of the gossip loop in flight
  std::set<std::string> waiting_logged_;
  rpc::Placement placement_;
  std::shared_ptr<model::Model> model_;
  NodeStages stages_;
  int client_requests_ = 0;  // of this node's API, in flight
  bool loading_ = false;
  std::atomic<double> load_progress_{0.0};  // of the layers being loaded
  std::string last_load_error_;
  std::thread loader_;
  LeaderScheduler scheduler_{[this](std::vector<std::shared_ptr<engine::Stage>> stages) {
    engine::EngineOptions options = options_.engine;
    options.replay_wait = options_.startup_wait;
    options.held_stages = [this](uint64_t epoch) { return stages_of(epoch); };
    options.first_sequence_id = std::random_device{}() * (uint64_t{1} << 31) + 1;
    options.embedding_dim = config_.embedding_dim;
    return std::make_shared<engine::Engine>(std::move(stages), config_.vocab_size, eog_, options);
  }};
  std::map<uint64_t, rpc::Placement> recent_placements_;  // by epoch, the current one included
  std::unique_ptr<Discovery> discovery_;
  std::thread gossip_;
};

ClusterNode::ClusterNode(std::shared_ptr<const gguf::File> file, std::function<bool(engine::Token)> eog,
                         NodeOptions options)
    : impl_(std::make_unique<Impl>(std::move(file), std::move(eog), std::move(options))) {}
ClusterNode::~ClusterNode() = default;
int ClusterNode::node_port() const { return impl_->node_port(); }
engine::ModelLimits ClusterNode::limits() const { return impl_->limits(); }
bool ClusterNode::submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
  return impl_->submit_for_client(std::move(request), std::move(callbacks));
}
void ClusterNode::shutdown() { impl_->shutdown(); }
std::pair<int, std::string> ClusterNode::health() const { return impl_->health(); }
std::string ClusterNode::status_json() const { return impl_->status_json(); }
void ClusterNode::write_metrics(metrics::Exposition& out) const { impl_->write_metrics(out); }
std::string ClusterNode::waiting_for() const { return impl_->readiness(); }
void ClusterNode::leave() { impl_->leave(); }
std::string ClusterNode::why_needed() const { return impl_->why_needed(); }

}  // namespace strata::cluster
