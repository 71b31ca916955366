#include "cluster/node.h"

#include <condition_variable>
#include <mutex>
#include <optional>

#include "cluster/cluster_metrics.h"
#include "cluster/control_driver.h"
#include "cluster/control_rules.h"
#include "cluster/gossip.h"
#include "cluster/link_meter.h"
#include "cluster/hello_targets.h"
#include "cluster/leadership.h"
#include "cluster/membership.h"
#include "cluster/node_progress.h"
#include "cluster/node_setup.h"
#include "cluster/node_weights.h"
#include "cluster/request_router.h"
#include "cluster/stage_host.h"
#include "parallel/group_links.h"
#include "rpc/hello_client.h"
#include "rpc/node_service.h"
#include "rpc/peer_channel.h"
#include "rpc/remote_stage.h"

namespace strata::cluster {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// The node's parts, each the one owner of its state, wired here: membership (what it knows of
// its peers), the control driver (which carries out what the rules decide), gossip (its rounds
// of Hellos), leadership (its placements and the leader's scheduler), the stage host (its
// layers and stages), the weights it serves and fetches, and the request router. `mutex_`
// guards membership, leadership and the driver; the other parts have locks of their own, taken
// after it, never before, and call back into the node without them.
class ClusterNode::Impl final : public rpc::NodeHandler {
 public:
  Impl(std::shared_ptr<const gguf::File> file, std::function<bool(engine::Token)> eog, NodeOptions options)
      : file_(std::move(file)),
        eog_(std::move(eog)),
        config_(model::Config::from_gguf(*file_)),
        options_(usable_options(std::move(options), config_)),
        key_(std::make_shared<rpc::ClusterKey>(options_.secret())),
        channels_(key_),
        links_(options_.host, 0, group_link_credentials(key_->links()), {.test_send_delay = options_.test_exchange_delay}),
        // A link measured may be what the leader waits for to place nodes that joined.
        link_meter_(measure_over(links_, kLinkMeasureLimit), [this] { gossip_.act_now(); }, options_.log),
        weights_(file_, key_,
                 {options_.node_id, model_hash(*file_), options_.engine.threads, options_.partial,
                  options_.fetch_streams, options_.test_fetch_delay, options_.on_transfer, options_.log}),
        placement_rules_(placement_rules(options_, *file_, config_)),
        self_(describe_node(options_, *file_, config_)),
        membership_(initial_control_state(view_of(self_), options_.peers, Clock::now()), options_.log),
        leadership_(leadership_options()),
        gossip_(gossip_host()),
        stage_host_(stage_host_options()),
        router_(rpc::Caller{options_.node_id, 0, key_}, router_options()),
        driver_(
            options_.node_id, {membership_, leadership_, stage_host_, gossip_}, [this] { return self_info(); },
            options_.log) {
    server_ = listen_for_nodes(*this, options_, key_, self_);
    const std::string advertised_host = options_.host == "0.0.0.0" ? "" : options_.host;
    {
      std::lock_guard lock(mutex_);
      self_.node_address = advertised_host + ":" + std::to_string(server_->port());
      self_.exchange_address = advertised_host + ":" + std::to_string(links_.port());
      membership_.listening_at(self_.node_address, true, Clock::now());
    }
    discovery_ = start_discovery(options_, self_, server_->port(), key_, discovered_);
    gossip_.start();
  }

  ~Impl() override { shutdown(); }

  int node_port() const { return server_->port(); }

  void shutdown() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    weights_.stop();
    link_meter_.stop();
    changed_.notify_all();
    discovery_.reset();  // no more announcements of this node, nor calls back into it
    gossip_.stop();
    std::shared_ptr<engine::Engine> scheduler;
    {
      std::lock_guard lock(mutex_);
      scheduler = leadership_.scheduler().take();
    }
    if (scheduler) scheduler->shutdown();
    leadership_.scheduler().join_retiring();
    rpc::RemoteStage::wait_for_releases(rpc::RemoteStage::kDefaultDeadline + std::chrono::seconds(1));
    router_.shutdown();
    server_->stop();
    stage_host_.wait_for_load();
  }

  engine::ModelLimits limits() const {
    return {options_.engine.context_size, options_.engine.max_parallel, options_.engine.max_queued};
  }

  bool submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
    return router_.submit_for_client(std::move(request), std::move(callbacks));
  }

  // NodeHandler
  std::string hello(const cluster_types::Hello& request, const std::string& peer, cluster_types::Hello& reply) override {
    {
      std::lock_guard lock(mutex_);
      // A new placement to load, or a peer now ready for it: acted on at once, not a gossip round later.
      const ControlDriver::Decision decision =
          driver_.carry_out(membership_.hello_received(request, peer, Clock::now()), &request.placement);
      if (!decision.refuse_caller.empty()) return decision.refuse_caller;
      // A node refused tells nothing but who it is.
      if (!refusal().empty()) {
        reply = {.sender = self_info()};
        return {};
      }
      reply = {self_info(), membership_.all_infos(), placement()};
    }
    changed_.notify_all();
    return {};
  }

  std::shared_ptr<engine::Stage> stage(uint64_t epoch, std::string& why) override {
    std::lock_guard lock(mutex_);
    if (why = refusal(); !why.empty()) return nullptr;
    // The previous placement's stage serves until the leader has switched, and hands over
    // the state of its sequences then.
    std::shared_ptr<engine::Stage> stage = stage_host_.stage_of(epoch);
    if (!stage) {
      why = "node " + options_.node_id + " runs no stage of placement " + std::to_string(epoch) +
            " (its placement is " + std::to_string(placement().epoch) + ")";
    }
    return stage;
  }

  std::shared_ptr<engine::Stage> chain_stage(uint64_t epoch, const std::string& node_id, std::string& why) override {
    std::lock_guard lock(mutex_);
    if (std::shared_ptr<engine::Stage> next = leadership_.chain_stage(epoch, node_id, membership_)) return next;
    why = "node " + options_.node_id + " knows no stage of node " + node_id + " in placement " + std::to_string(epoch);
    return nullptr;
  }

  std::shared_ptr<engine::Generator> scheduler(std::string& why) override {
    std::lock_guard lock(mutex_);
    if (!scheduling() || !refusal().empty()) {
      why = "node " + options_.node_id + " does not schedule requests now: " + cluster::waiting_for(progress());
      return nullptr;
    }
    return leadership_.scheduler().engine();
  }

  // NodeHandler: weights for nodes that have no file.
  std::optional<cluster_types::ModelManifest> manifest(const std::string& model_hash, std::string& why) override {
    return weights_.manifest(model_hash, why);
  }

  std::optional<rpc::TensorBytes> tensor(const cluster_types::TensorRequest& request, std::string& why) override {
    return weights_.tensor(request, why);
  }

  NodeProgress locked_progress() const {
    std::lock_guard lock(mutex_);
    return progress();
  }

  cluster_types::ClusterStatus status() const {
    std::lock_guard lock(mutex_);
    cluster_types::ClusterStatus status{.node_id = options_.node_id,
                                        .model_name = self_.model_name,
                                        .model_hash = self_.model_hash,
                                        .layers = config_.layer_count,
                                        .protocol_version = rpc::kProtocolVersion,
                                        .leader = leader_id(),
                                        .serving = serving(),
                                        .placement = placement(),
                                        .leaving = control().leaving};
    status.nodes.push_back({self_info(), true, std::nullopt});
    for (auto& peer : membership_.peer_statuses(Clock::now())) status.nodes.push_back(std::move(peer));
    if (!placement().error.empty() || placement().stages.empty())
      status.waiting_for = cluster::waiting_for(progress());
    status.scheduler = leadership_.scheduler_counts();
    return status;
  }

  engine::Engine::Load scheduler_load() const {
    std::shared_ptr<engine::Engine> scheduler;
    {
      std::lock_guard lock(mutex_);
      scheduler = leadership_.scheduler().engine();
    }
    // The engine's lock is taken without this node's: its loop calls back into the node.
    return scheduler ? scheduler->load() : engine::Engine::Load{};
  }

  void leave() {
    std::unique_lock lock(mutex_);
    const auto someone_takes_over = [&] { return cluster::someone_takes_over(control(), Clock::now()); };
    if (stopping_ || !someone_takes_over()) return;
    driver_.decide(control::DrainAsked{}, Clock::now());
    router_.close_to_clients();
    changed_.notify_all();
    log("leaving: the cluster places the model without this node, the sequences it holds move to the nodes "
        "that take its layers over, and its clients' requests in flight finish");
    const auto started = Clock::now();
    const bool left = changed_.wait_for(lock, kHandOverLimit, [&] {
      return stopping_ || (handed_over() && router_.client_requests() == 0) || !someone_takes_over();
    });
    const std::string after =
        std::to_string(std::chrono::duration<double>(Clock::now() - started).count()).substr(0, 4) + " s";
    log(left ? "left after " + after + ": nothing of this node is in use"
             : "leaving after " + after + " without the hand-over confirmed");
  }

  std::string why_needed() const {
    std::lock_guard lock(mutex_);
    std::vector<cluster_types::NodeInfo> others;
    for (const std::string& id : members()) {
      if (id != options_.node_id) others.push_back(membership_.info(id));
    }
    return cluster::why_needed(others, placement_rules_);
  }

 private:
  void log(const std::string& line) const {
    if (options_.log) options_.log(line);
  }

  // The parts' ties to this node.
  GossipHost gossip_host() {
    const auto locked = [this](auto read) {
      return [this, read] {
        std::lock_guard lock(mutex_);
        return read();
      };
    };
    return {.round = locked([this] {
              return std::pair{hello_targets(control(), discovered_.addresses(Clock::now())), hello_message()};
            }),
            .news = locked([this] { return hello_news(); }),
            .message = locked([this] { return hello_message(); }),
            .greet = [this](const std::string& address,
                            const cluster_types::Hello& hello) { return greet(address, hello); },
            .act = [this] { act_on_round(); }};
  }

  StageHostOptions stage_host_options() {
    StageHostOptions host{file_,
                          options_.engine.threads,
                          [this](model::LayerRange range) { return kv_options(options_.engine, config_, range); },
                          nullptr,
                          [this] {  // serve, and tell the leader, without waiting for the next round
                            gossip_.act_now();
                            changed_.notify_all();
                          },
                          options_.log};
    host.join = [this](const StageSeat& seat) -> std::unique_ptr<model::Exchange> {
      return links_.join(seat.group, seat.member, seat.exchange_addresses, kGroupJoinLimit);
    };
    if (options_.partial) {
      host.fetch = [this](model::LayerRange range) {
        weights_.fetch_layers(
            range,
            [this] {
              std::lock_guard lock(mutex_);
              return membership_.weights_holders(Clock::now());
            },
            [this, range] { return layers_moved(range); });
      };
    }
    return host;
  }

  LeadershipOptions leadership_options() {
    return {.rules = placement_rules_,
            .make_engine = engine_maker(options_, config_, eog_,
                                        [this](uint64_t epoch) {
                                          std::lock_guard lock(mutex_);
                                          return leadership_.stages_of(epoch, stage_host_, membership_);
                                        }),
            .remote_stage = [this](const cluster_types::Stage& s, uint64_t epoch,
                                   bool leading) { return remote_stage(s, epoch, leading); },
            .log = options_.log,
            .tensor_shares = [this](std::span<const double> weights) { return model::plan_tensor_shares(config_, weights); }};
  }

  RouterOptions router_options() {
    return {.node_id = options_.node_id,
            .startup_wait = options_.startup_wait,
            .route = [this](Clock::time_point deadline) { return route(deadline); },
            .wait_for_change =
                [this](Clock::time_point deadline) {
                  std::unique_lock lock(mutex_);
                  return changed_.wait_until(lock, deadline) == std::cv_status::no_timeout;
                },
            .on_client_done =
                [this] {
                  // Taken and let go, so that a leave() that looked at the count before it fell
                  // is waiting by now.
                  { std::lock_guard lock(mutex_); }
                  changed_.notify_all();
                },
            .log = options_.log};
  }

  // The router's: the scheduler here, or the leader's, once the cluster serves.
  Route route(Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    while (true) {
      if (stopping_) throw engine::Unavailable("the node is shutting down");
      if (const std::string why = refusal(); !why.empty()) throw engine::Unavailable(why, 30);
      if (!placement().error.empty()) throw engine::Unavailable(placement().error, 30);
      if (scheduling()) return {leadership_.scheduler().engine(), {}};
      if (const PeerState* leader = serving_leader()) return {nullptr, channels_.to(leader->info.address)};
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
        throw engine::Unavailable("the cluster is not serving yet: " + cluster::waiting_for(progress()), 5);
      }
    }
  }

  // A new placement moved this node's layers off `range`.
  bool layers_moved(model::LayerRange range) const {
    std::lock_guard lock(mutex_);
    const std::optional<model::LayerRange> now = layers_of(placement(), options_.node_id);
    return !now || now->first != range.first || now->last != range.last;
  }

  // What follows is called with mutex_ held.

  const ControlState& control() const { return membership_.control(); }
  const cluster_types::Placement& placement() const { return leadership_.placement(); }
  std::string refusal() const { return cluster::refusal(control(), Clock::now()); }
  std::vector<std::string> members() const { return cluster::members(control(), Clock::now()); }
  std::string leader_id() const { return cluster::leader_id(control(), Clock::now()); }
  const PeerState* serving_leader() const { return cluster::serving_leader(control(), Clock::now()); }
  // Node `id` (this one or a peer) holds its layers of placement `epoch`.
  bool stage_ready(const std::string& id, uint64_t epoch) const {
    return id == options_.node_id ? stage_host_.ready_for(epoch) : peer_ready(control(), id, epoch, Clock::now());
  }

  cluster_types::NodeInfo self_info() const {
    cluster_types::NodeInfo info = self_;
    info.leaving = control().leaving;
    stage_host_.describe(info, options_.engine.kv_type);
    info.described_unix_ms = rpc::unix_time_ms();
    info.links = link_meter_.links();
    info.weights = weights_.held();
    info.state = node_state(progress());
    return info;
  }

  NodeProgress progress() const {
    NodeProgress progress{.refusal = refusal(),
                          .placement_error = placement().error,
                          .placed = !placement().stages.empty(),
                          .members = members().size(),
                          .epoch = placement().epoch,
                          .leader = placement().leader_id,
                          .serving = serving(),
                          .leaving = control().leaving,
                          .stopping = stopping_,
                          .loading = stage_host_.loading(),
                          .load_progress = stage_host_.load_progress(),
                          .scheduling = scheduling(),
                          .fetching = weights_.held().fetching,
                          .holds_current_stage = stage_host_.has_current()};
    for (const cluster_types::Stage& s : placement().stages) {
      if (!stage_ready(s.node_id, placement().epoch)) progress.unready.push_back(s.node_id);
    }
    if (options_.partial) progress.fetched = weights_.held();
    return progress;
  }

  bool scheduling() const { return leadership_.scheduling(); }
  // The placement names this node, which holds no stage at all: it restarted faster than it
  // was seen leaving, and the leader serves through its previous process, gone. (A node that
  // changes stages keeps its previous one meanwhile.)
  bool own_stage_missing() const { return layers_of(placement(), options_.node_id) && !stage_host_.has_any(); }
  // Requests can run now: here, or at a leader that serves.
  bool serving() const { return scheduling() || (serving_leader() != nullptr && !own_stage_missing()); }

  // A placement without this node serves, and this node holds no sequence's state.
  bool handed_over() const {
    return !placement().stages.empty() && serving_leader() != nullptr && !layers_of(placement(), options_.node_id) &&
           !stage_host_.holds_sequences();
  }

  // Gossip's: what in a Hello its receiver acts on at once, and the Hello itself (this node,
  // the nodes it sees alive, its placement).
  HelloNews hello_news() const {
    return {placement().epoch, placement().leader_id, stage_host_.ready_epoch(), scheduling(), control().leaving};
  }
  HelloMessage hello_message() const {
    return {{self_info(), membership_.alive_infos(Clock::now()), placement()}, hello_news()};
  }

  // Gossip's, without mutex_: says Hello to `address` and takes the answer in; fails only on
  // something unexpected (signing, logging), which is logged.
  bool greet(const std::string& address, const cluster_types::Hello& hello) {
    try {
      const rpc::HelloOutcome outcome =
          rpc::say_hello(channels_.to(address), hello, options_.node_id, *key_, kHelloDeadline);
      {
        std::lock_guard lock(mutex_);
        // The answer may come after its round has acted: news in it starts the next one now.
        driver_.carry_out(membership_.hello_answered(address, outcome, Clock::now()), &outcome.reply.placement);
      }
      changed_.notify_all();
      return true;
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      log("a Hello to " + address + " failed: " + e.what());
      return false;
    }
  }

  // Gossip's, without mutex_, once a round's Hellos have answered.
  void act_on_round() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      link_meter_.track(membership_.alive_infos(Clock::now()));
      driver_.decide(control::LinksMeasured{link_meter_.measured_peers()}, Clock::now());
      driver_.round(Clock::now());
    }
    changed_.notify_all();
  }

  // Another node's stage of placement `epoch`; `leading`: the leader's, which repairs the
  // placement when the stage is lost.
  std::shared_ptr<engine::Stage> remote_stage(const cluster_types::Stage& s, uint64_t epoch, bool leading) {
    rpc::Caller caller{options_.node_id, epoch, key_, options_.test_link_delay, {}};
    if (leading)
      caller.on_lost = [this](const std::string& peer_id, bool unreachable) { stage_lost(peer_id, unreachable); };
    return rpc::remote_stage(s.node_id, channels_.to(s.node_address), std::move(caller),
                             engine::StageLayers{s.first_layer, s.last_layer});
  }

  // Without mutex_: a remote stage's, when a call to it failed.
  void stage_lost(const std::string& peer_id, bool unreachable) {
    {
      std::lock_guard lock(mutex_);
      driver_.decide(control::StageFailed{peer_id, unreachable}, Clock::now());
    }
    changed_.notify_all();
  }

  std::shared_ptr<const gguf::File> file_;
  std::function<bool(engine::Token)> eog_;
  model::Config config_;
  NodeOptions options_;
  std::shared_ptr<rpc::ClusterKey> key_;
  rpc::PeerChannels channels_;
  parallel::GroupLinks links_;  // to the other members of the tensor-parallel groups this node is in
  LinkMeter link_meter_;        // of this node's links to its peers' group links
  NodeWeights weights_;
  PlacementRules placement_rules_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  cluster_types::NodeInfo self_;
  Membership membership_;
  DiscoveredNodes discovered_;
  Leadership leadership_;
  // The parts below call back into everything above; each is stopped by shutdown().
  Gossip gossip_;
  StageHost stage_host_;
  RequestRouter router_;
  ControlDriver driver_;
  std::unique_ptr<rpc::NodeServer> server_;
  std::unique_ptr<Discovery> discovery_;
};

ClusterNode::ClusterNode(std::shared_ptr<const gguf::File> file, std::function<bool(engine::Token)> eog,
                         NodeOptions options)
    : impl_(std::make_unique<Impl>(std::move(file), std::move(eog), std::move(options))) {}
ClusterNode::~ClusterNode() = default;
int ClusterNode::node_port() const { return impl_->node_port(); }
engine::ModelLimits ClusterNode::limits() const { return impl_->limits(); }
bool ClusterNode::submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
  return impl_->submit(std::move(request), std::move(callbacks));
}
void ClusterNode::shutdown() { impl_->shutdown(); }
cluster_types::NodeHealth ClusterNode::health() const { return cluster::health(impl_->locked_progress()); }
cluster_types::ClusterStatus ClusterNode::status() const { return impl_->status(); }
void ClusterNode::write_metrics(metrics::Exposition& out) const {
  const cluster_types::ClusterStatus now = status();
  cluster::write_metrics(now, impl_->scheduler_load(), out);
}
std::string ClusterNode::waiting_for() const { return readiness(impl_->locked_progress()); }
void ClusterNode::leave() { impl_->leave(); }
std::string ClusterNode::why_needed() const { return impl_->why_needed(); }

}  // namespace strata::cluster
