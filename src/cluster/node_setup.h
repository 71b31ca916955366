// A node's setup from its options and its model file, before it runs: the options resolved and
// checked, what it says of itself, the rules its placements are made by, its stages' KV pools,
// the port its node service listens on, and its discovery on the LAN.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cluster/discovery.h"
#include "cluster/hello_targets.h"
#include "cluster/leader_scheduler.h"
#include "cluster/node.h"
#include "cluster/placement_proposal.h"
#include "engine/local_stage.h"
#include "model/config.h"
#include "parallel/group_links.h"
#include "rpc/node_service.h"

namespace strata::cluster {

// The options with the engine's threads (every core unless given) and context (the model's)
// resolved. Throws std::runtime_error when they cannot work: a node without a cluster key
// reaches, and is reached, on this machine only.
NodeOptions usable_options(NodeOptions options, const model::Config& config);

// The KV pool of a stage over `range`: --kv-memory, or the placement's KV reserve for it.
engine::KvOptions kv_options(const engine::EngineOptions& engine, const model::Config& config, model::LayerRange range);
// Blocks of a stage's pool of sliding-window layers without --kv-memory: its --parallel
// sequences' windows and steps; 0 for a model without such layers.
int window_kv_blocks(const engine::EngineOptions& engine, const model::Config& config);

// What every placement the node makes, leading, is made by. The placement reserves KV memory
// as the node stores it.
PlacementRules placement_rules(const NodeOptions& options, const gguf::File& file, const model::Config& config);

// What the node says of itself that stays while it runs (its address comes once it listens):
// its memory is measured, and its speed at reading weights.
cluster_types::NodeInfo describe_node(const NodeOptions& options, const gguf::File& file, const model::Config& config);

// The engine of a leader's scheduler (LeaderScheduler): the node's engine options, the startup
// wait as long as requests wait for a new pipeline, sequence ids from a random offset per
// engine (so that one leader's id never names another's sequence on a stage), and
// `held_stages` to find the stages that hold the state of the requests a previous leader passed on.
LeaderScheduler::MakeEngine engine_maker(
    const NodeOptions& options, const model::Config& config, std::function<bool(engine::Token)> is_end_of_generation,
    std::function<std::vector<std::shared_ptr<engine::Stage>>(uint64_t)> held_stages);

// The group links trust whom the node links trust: certificates of the cluster's authority.
parallel::LinkCredentials group_link_credentials(const rpc::LinkSecurity& security);

// The node service of `handler`, on options.host and options.node_port, or on any free port when
// that one is taken and it is only a default (options.any_port_if_taken); the log says where, and
// what the node (`self`) offers.
std::unique_ptr<rpc::NodeServer> listen_for_nodes(rpc::NodeHandler& handler, const NodeOptions& options,
                                                  std::shared_ptr<rpc::ClusterKey> key, const cluster_types::NodeInfo& self);

// Discovery of the nodes with the same key on the LAN, announcing this node (`self`'s id and
// model) at `node_port`, the nodes it finds added to `found`; null when it is off (asked to be,
// or out of reach of other machines: the log says why).
std::unique_ptr<Discovery> start_discovery(const NodeOptions& options, const cluster_types::NodeInfo& self, int node_port,
                                           std::shared_ptr<rpc::ClusterKey> key, DiscoveredNodes& found);

}  // namespace strata::cluster
