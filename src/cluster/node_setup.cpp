#include "cluster/node_setup.h"

#include <algorithm>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <thread>

#include "cluster/node_resources.h"
#include "model/kv_pool.h"
#include "rpc/auth.h"
#include "rpc/messages.h"
#include "rpc/tls.h"
#include "units/byte_size.h"

namespace strata::cluster {
namespace {

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.starts_with("127.") || host == "[::1]" || host == "::1";
}

// "host:port"
bool is_loopback(const std::string& address) { return is_loopback_host(address.substr(0, address.rfind(':'))); }

void log(const NodeOptions& options, const std::string& line) {
  if (options.log) options.log(line);
}

}  // namespace

NodeOptions usable_options(NodeOptions options, const model::Config& config) {
  if (options.engine.threads <= 0) {
    options.engine.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (options.engine.context_size <= 0) options.engine.context_size = config.context_length;
  if (options.cluster_key.empty()) {
    for (const std::string& peer : options.peers) {
      if (!is_loopback(peer)) {
        throw std::runtime_error("peer " + peer +
                                 " is not on this machine: a cluster across machines needs "
                                 "--cluster-key (or STRATA_CLUSTER_KEY) on every node");
      }
    }
    if (!is_loopback_host(options.host)) {
      throw std::runtime_error(
          "without --cluster-key the node service listens on this machine only; "
          "--node-host " +
          options.host + " needs a key");
    }
  }
  return options;
}

engine::KvOptions kv_options(const engine::EngineOptions& e, const model::Config& config, model::LayerRange range) {
  return {e.kv_type,
          engine::kv_pool_blocks(config, range, e.kv_type, e.kv_memory, e.context_size, e.max_parallel, e.step_inputs())};
}

int window_kv_blocks(const engine::EngineOptions& e, const model::Config& config) {
  if (config.sliding_window <= 0) return 0;
  return std::max(1, e.max_parallel) * model::window_blocks_needed(config.sliding_window, e.context_size, e.step_inputs());
}

PlacementRules placement_rules(const NodeOptions& options, const gguf::File& file, const model::Config& config) {
  ModelFootprint footprint = footprint_of(file);
  footprint.kv_bytes_per_layer_per_token =
      model::KvLayout(config, 1, options.engine.kv_type).block_bytes / model::kKvBlock;
  footprint.window_kv_tokens = static_cast<uint64_t>(window_kv_blocks(options.engine, config)) * model::kKvBlock;
  const uint64_t kv_reserve_tokens = static_cast<uint64_t>(options.engine.context_size) *
                                     static_cast<uint64_t>(std::max(1, options.engine.max_parallel));
  return {options.node_id, options.strategy, options.fixed_stages, kv_reserve_tokens, std::move(footprint)};
}

cluster_types::NodeInfo describe_node(const NodeOptions& options, const gguf::File& file, const model::Config& config) {
  cluster_types::NodeInfo self;
  self.node_id = options.node_id;
  self.api_address = options.api_address;
  self.model_hash = model_hash(file);
  self.protocol_version = rpc::kProtocolVersion;
  self.instance = rpc::fresh_nonce();
  self.started_unix_ms = rpc::unix_time_ms();
  self.model_name = options.partial ? options.partial->manifest().model_name
                                      : std::filesystem::path(file.path()).stem().string();
  self.memory_bytes = options.memory_limit > 0 ? options.memory_limit : detect_usable_memory();
  self.kv_memory_bytes = options.engine.kv_memory;
  if (options.engine.kv_memory == 0) {
    // Its pool holds the same blocks whatever its range, each of these bytes per layer.
    const uint64_t layer_block_bytes = model::KvLayout(config, 1, options.engine.kv_type).block_bytes;
    self.kv_bytes_per_layer = static_cast<uint64_t>(kv_options(options.engine, config, {0, 1}).blocks.full) *
                              layer_block_bytes;
    self.kv_bytes_per_window_layer = static_cast<uint64_t>(window_kv_blocks(options.engine, config)) * layer_block_bytes;
  }
  self.weight_bytes_per_second =
      options.test_weight_speed > 0.0 ? options.test_weight_speed : measure_weight_speed(options.engine.threads);
  self.state = "starting";
  return self;
}

LeaderScheduler::MakeEngine engine_maker(
    const NodeOptions& options, const model::Config& config, std::function<bool(engine::Token)> is_end_of_generation,
    std::function<std::vector<std::shared_ptr<engine::Stage>>(uint64_t)> held_stages) {
  engine::EngineOptions engine = options.engine;
  engine.replay_wait = options.startup_wait;
  engine.held_stages = std::move(held_stages);
  engine.embedding_dim = config.embedding_dim;
  engine.sliding_window = config.sliding_window;
  return [engine, vocab_size = config.vocab_size,
          eog = std::move(is_end_of_generation)](std::vector<std::shared_ptr<engine::Stage>> stages) mutable {
    engine.first_sequence_id = std::random_device{}() * (uint64_t{1} << 31) + 1;
    return std::make_shared<engine::Engine>(std::move(stages), vocab_size, eog, engine);
  };
}

std::string model_hash(const gguf::File& file) { return rpc::sha256_hex(file.header_bytes()); }

parallel::LinkCredentials group_link_credentials(const rpc::LinkSecurity& security) {
  return {security.authority_pem(), security.certificate_pem(), security.private_key_pem()};
}

std::unique_ptr<rpc::NodeServer> listen_for_nodes(rpc::NodeHandler& handler, const NodeOptions& options,
                                                  std::shared_ptr<rpc::ClusterKey> key, const cluster_types::NodeInfo& self) {
  const auto listen = [&](int port) {
    return std::make_unique<rpc::NodeServer>(handler, options.node_id, key, options.host, port, options.log,
                                             options.test_tensor_chunk_bytes);
  };
  std::unique_ptr<rpc::NodeServer> server;
  if (!options.any_port_if_taken || options.node_port == 0) {
    server = listen(options.node_port);
  } else {
    try {
      server = listen(options.node_port);
    } catch (const rpc::PortTaken& taken) {
      log(options, std::string(taken.what()) + "; listening on any free port instead");
      server = listen(0);
    }
  }
  log(options, "node " + options.node_id + " listens for nodes on " + options.host + ":" +
                   std::to_string(server->port()) + " (" + units::describe_bytes(self.memory_bytes) + " usable, " +
                   units::describe_bytes(static_cast<uint64_t>(self.weight_bytes_per_second)) + "/s of weights)" +
                   (!options.cluster_key.empty()
                        ? ""
                        : "; no --cluster-key: it forms a cluster only with this user's nodes on this machine"));
  return server;
}

std::unique_ptr<Discovery> start_discovery(const NodeOptions& options, const cluster_types::NodeInfo& self, int node_port,
                                           std::shared_ptr<rpc::ClusterKey> key, DiscoveredNodes& found) {
  if (!options.discovery) return nullptr;
  if (options.cluster_key.empty()) {
    log(options,
        "discovery is off: without --cluster-key a node forms a cluster only with nodes on this machine, "
        "named with --peers");
    return nullptr;
  }
  if (is_loopback_host(options.host)) {
    log(options,
        "discovery is off: the node service listens on " + options.host + " only, out of reach of other machines");
    return nullptr;
  }
  Announcement announcement;
  announcement.node_id = options.node_id;
  announcement.node_port = node_port;
  announcement.model_hash = self.model_hash;
  announcement.protocol_version = rpc::kProtocolVersion;
  return std::make_unique<Discovery>(
      DiscoveryOptions{.self = announcement,
                       .port = options.discovery_port,
                       .interface_name = options.discovery_interface,
                       .key = std::move(key),
                       .on_found =
                           [log = options.log, &found](const std::string& id, const std::string& address) {
                             if (found.found(address, std::chrono::steady_clock::now()) && log) {
                               log("discovery found node " + id + " at " + address);
                             }
                           },
                       .log = options.log});
}

}  // namespace strata::cluster
