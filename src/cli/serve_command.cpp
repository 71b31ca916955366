#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "api/server.h"
#include "cli/commands.h"
#include "cli/console.h"
#include "cli/model_source.h"
#include "cli/option_checks.h"
#include "cli/speculation.h"
#include "cluster/discovery.h"
#include "cluster/node.h"
#include "cluster/node_identity.h"
#include "metrics/metrics.h"
#include "model/config.h"
#include "constrain/matcher.h"
#include "rpc/channel.h"
#include "rpc/node_service.h"
#include "rpc/weights_client.h"
#include "tokenizer/tokenizer.h"
#include "units/byte_size.h"

namespace strata::cli {
namespace {

struct ServeOptions {
  std::string model;
  std::string chat_template_file;
  api::ServerOptions server;
  std::optional<std::string> api_key;
  engine::EngineOptions engine;
  int node_port = -1;  // -1: --port + 1 (0 when --port is 0)
  std::string node_host;
  std::vector<std::string> peers;
  std::string node_id;
  std::string state_dir;
  std::string cluster_key;
  bool no_discovery = false;
  int discovery_port = cluster::kDefaultDiscoveryPort;
  std::string discovery_interface;
  std::string memory_limit;
  std::string kv_type = "f16";
  std::string kv_memory;
  bool no_prefix_cache = false;
  std::string placement = "speed";
  std::string stages;
  double startup_wait_seconds = 60;
  int test_link_delay_ms = 0;
  double test_weight_speed = 0.0;
  int test_exchange_delay_us = 0;
  std::string cache_dir;
  int test_fetch_delay_ms = 0;
  uint64_t test_fetch_checkpoint_bytes = cluster::kProgressCheckpointBytes;
  uint64_t test_tensor_chunk_bytes = rpc::kTensorChunkBytes;
  std::string log_format = "text";
  std::string log_level = "info";
  SpeculationOptions speculation;
};

// "b+c" -> a tensor-parallel group of b and c sharing by their measured speeds (weights 0);
// "b*3+c" -> b with 3 parts of every layer to c's 1. One node: no group.
std::vector<cluster::GroupMember> parse_group(const std::string& nodes, const std::string& item) {
  std::vector<cluster::GroupMember> group;
  bool weighted = false;
  size_t begin = 0;
  while (begin <= nodes.size()) {
    const size_t end = std::min(nodes.find('+', begin), nodes.size());
    const std::string member = nodes.substr(begin, end - begin);
    const size_t star = member.find('*');
    double weight = 0.0;
    if (star != std::string::npos) {
      weighted = true;
      size_t used = 0;
      try {
        weight = std::stod(member.substr(star + 1), &used);
      } catch (const std::logic_error&) {
      }
      if (used == 0 || used != member.size() - star - 1 || !(weight > 0.0 && weight < 1e6)) {
        throw std::invalid_argument("--stages item '" + item + "' gives node '" + member.substr(0, star) +
                                    "' a weight that is not a positive number");
      }
    }
    if (member.substr(0, star).empty()) throw std::invalid_argument("--stages item '" + item + "' names an empty node");
    group.push_back({member.substr(0, star), weight});
    begin = end + 1;
  }
  if (weighted) {
    for (cluster::GroupMember& m : group) m.share = m.share == 0.0 ? 1.0 : m.share;
  }
  if (group.size() == 1) group.clear();
  return group;
}

// "a:0-10,b+c:11-21" (inclusive layer numbers, as `strata cluster` shows them) -> stages in
// pipeline order; "b+c" is a tensor-parallel group (parse_group).
std::vector<cluster::Stage> parse_stages(const std::string& text) {
  std::vector<cluster::Stage> stages;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    const size_t colon = item.rfind(':');
    const size_t dash = item.find('-', colon == std::string::npos ? 0 : colon);
    if (colon == std::string::npos || dash == std::string::npos || colon == 0) {
      throw std::invalid_argument("--stages item '" + item + "' is not NODE:FIRST-LAST (e.g. a:0-10)");
    }
    std::vector<cluster::GroupMember> group = parse_group(item.substr(0, colon), item);
    const std::string node = group.empty() ? item.substr(0, colon) : group.front().node_id;
    try {
      stages.push_back({node, std::stoi(item.substr(colon + 1, dash - colon - 1)), std::stoi(item.substr(dash + 1)) + 1,
                        std::move(group)});
    } catch (const std::logic_error&) {
      throw std::invalid_argument("--stages item '" + item + "' has a layer that is not a number");
    }
    begin = end + 1;
  }
  return stages;
}

// CLI11 skips an empty environment variable, which would turn authentication off unnoticed.
std::optional<std::string> api_key_from(const ServeOptions& o) {
  if (o.api_key) return o.api_key;
  if (const char* key = std::getenv("STRATA_API_KEY")) return key;
  return std::nullopt;
}

// The model of a node that `node.peers`, or discovery, finds: its manifest, kept as a partial
// model in the cache directory, whose layers' weights the node fetches once placed. Until the
// API server starts, `waiting` answers that the node waits for the model, on the port the API
// serves on afterwards (`server.port` becomes the one taken): held until then, so that no other
// socket of the machine takes the port meanwhile.
std::shared_ptr<cluster::PartialModel> model_from_peers(const ServeOptions& o, const cluster::NodeOptions& node,
                                                        api::ServerOptions& server,
                                                        std::optional<api::WaitingServer>& waiting) {
  const auto key = std::make_shared<const rpc::ClusterKey>(node.secret());
  // Nodes found by discovery, of any model (this one has none yet), besides the --peers.
  auto found = std::make_shared<std::pair<std::mutex, std::vector<std::string>>>();
  std::unique_ptr<cluster::Discovery> discovery;
  if (!node.cluster_key.empty() && node.discovery) {
    discovery = std::make_unique<cluster::Discovery>(cluster::DiscoveryOptions{
        .self = {.node_id = node.node_id, .node_port = node.node_port, .protocol_version = rpc::kProtocolVersion},
        .port = node.discovery_port,
        .interface_name = node.discovery_interface,
        .key = key,
        .on_found = [found](const std::string&, const std::string& address) {
          std::lock_guard lock(found->first);
          if (std::find(found->second.begin(), found->second.end(), address) == found->second.end()) {
            found->second.push_back(address);
          }
        },
        .log = node.log});
  }
  const auto addresses = [&node, found] {
    std::vector<std::string> all = node.peers;
    std::lock_guard lock(found->first);
    all.insert(all.end(), found->second.begin(), found->second.end());
    return all;
  };
  const auto manifest_here = std::make_shared<std::atomic<bool>>(false);
  waiting.emplace(server, [addresses, manifest_here] {
    if (*manifest_here) return std::string("the weights of this node's layers, and its place in the cluster");
    const std::vector<std::string> peers = addresses();
    std::string named;
    for (const std::string& peer : peers) named += (named.empty() ? "" : ", ") + peer;
    if (peers.empty()) return std::string("the model's manifest from a peer (none found yet)");
    return "the model's manifest from peer" + std::string(peers.size() > 1 ? "s " : " ") + named;
  });
  server.port = waiting->port();
  node.log("waiting for the model of its peers; http://" + server.host + ":" + std::to_string(server.port) +
           " answers 503 until it is here");
  auto model = cluster::PartialModel::open(cache_dir_or_default(o.cache_dir),
                                           rpc::fetch_manifest(addresses, node.node_id, *key, node.log),
                                           o.test_fetch_checkpoint_bytes);
  *manifest_here = true;
  return model;
}

std::string read_chat_template(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read the chat template " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int serve(const ServeOptions& o) {
  api::ServerOptions server = o.server;
  if (!o.chat_template_file.empty()) server.chat_template = read_chat_template(o.chat_template_file);
  server.api_key = api_key_from(o);
  if (server.api_key && server.api_key->empty()) {
    throw std::runtime_error("the API key is empty; give a key with --api-key or STRATA_API_KEY, "
                             "or set neither to serve without one");
  }
  if (server.metrics_key && server.metrics_key->empty()) {
    throw std::runtime_error("the metrics key is empty; give a key with --metrics-key, or none to scrape "
                             "/metrics with the API key");
  }
  cluster::NodeOptions node;
  node.node_id = cluster::resolve_node_id(o.node_id, o.state_dir);
  auto console = std::make_shared<Console>(node.node_id, o.log_format == "json" ? LogFormat::Json : LogFormat::Text,
                                           o.log_level);
  node.log = [console](const std::string& line) { console->log(spdlog::level::info, line); };
  server.log = node.log;
  rpc::route_grpc_log([console](const std::string& line) { console->log(spdlog::level::warn, line); });
  node.cluster_key = o.cluster_key;
  if (node.cluster_key.empty()) node.local_secret = cluster::read_or_create_local_secret();
  node.host = !o.node_host.empty() ? o.node_host : (o.cluster_key.empty() ? "127.0.0.1" : "0.0.0.0");
  node.node_port = o.node_port >= 0 ? o.node_port : (o.server.port == 0 ? 0 : o.server.port + 1);
  node.any_port_if_taken = o.node_port < 0;
  node.api_address = o.server.host + ":" + std::to_string(o.server.port);
  node.peers = o.peers;
  node.discovery = !o.no_discovery;
  node.discovery_port = o.discovery_port;
  node.discovery_interface = o.discovery_interface;
  node.memory_limit = o.memory_limit.empty() ? 0 : units::parse_byte_size(o.memory_limit);
  node.strategy = o.placement == "memory" ? cluster::Strategy::Memory : cluster::Strategy::Speed;
  node.fixed_stages = parse_stages(o.stages);
  node.startup_wait = std::chrono::milliseconds(static_cast<int64_t>(o.startup_wait_seconds * 1000));
  server.startup_wait = node.startup_wait;
  node.engine = o.engine;
  node.engine.kv_type = *model::parse_kv_type(o.kv_type);
  node.engine.kv_memory = o.kv_memory.empty() ? 0 : units::parse_byte_size(o.kv_memory);
  node.engine.prefix_cache = !o.no_prefix_cache;
  node.test_link_delay = std::chrono::milliseconds(o.test_link_delay_ms);
  node.test_weight_speed = o.test_weight_speed;
  node.test_exchange_delay = std::chrono::microseconds(o.test_exchange_delay_us);
  node.test_tensor_chunk_bytes = o.test_tensor_chunk_bytes;

  // Without a file, a node that joins others takes their model and fetches its layers' weights.
  std::shared_ptr<const gguf::File> file;
  std::optional<api::WaitingServer> waiting;
  if (o.model.empty() && (!o.peers.empty() || (!o.cluster_key.empty() && !o.no_discovery))) {
    node.partial = model_from_peers(o, node, server, waiting);
    node.on_transfer = [console](const cluster::TransferStats::Snapshot& s) { console->progress(s); };
    node.test_fetch_delay = std::chrono::milliseconds(o.test_fetch_delay_ms);
    file = node.partial->file();
  } else {
    file = gguf::File::open(model_path_or_demo(o.model, o.cache_dir));
  }
  server.model_facts = api::read_model_facts(*file);
  server.model_facts->digest = cluster::model_hash(*file);
  const model::Config config = model::Config::from_gguf(*file);
  server.embedding_pooling = config.pooling;
  server.embedding_dim = config.embedding_dim;
  const std::unique_ptr<tokenizer::Tokenizer> tokenizer = tokenizer::Tokenizer::from_gguf(*file);
  const tokenizer::Tokenizer* tok = tokenizer.get();
  node.engine.vocabulary = constrain::Vocabulary::from_tokenizer(*tokenizer);  // for requests with a grammar
  apply_speculation(o.speculation, *file, o.engine.threads, node.engine);
  cluster::ClusterNode cluster_node(file, [tok](engine::Token t) { return tok->is_end_of_generation(t); }, node);

  server.health = [&cluster_node] { return cluster_node.health(); };
  server.cluster_status = [&cluster_node] { return cluster_node.status(); };
  const metrics::Registry::Registration cluster_metrics = metrics::process_registry().add_collector(
      [&cluster_node](metrics::Exposition& out) { cluster_node.write_metrics(out); });
  server.on_stopping = [&cluster_node] { cluster_node.leave(); };
  server.drain = [&cluster_node](bool force) {
    std::string why = force ? std::string() : cluster_node.why_needed();
    if (why.empty()) api::request_stop();
    return why;
  };
  const engine::ModelLimits limits = cluster_node.limits();
  node.log("context " + std::to_string(limits.context_size) + " tokens, " + std::to_string(limits.max_parallel) +
           " parallel sequences, queue of " + std::to_string(limits.max_queued) + "; node port " +
           std::to_string(cluster_node.node_port()) + "; " + describe_speculation(node.engine, o.speculation));
  waiting.reset();  // its port, to the API server
  api::serve_until_signal(cluster_node, *tokenizer, *file, server);
  cluster_node.shutdown();
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible API, alone or as one node of a cluster");
  cmd->add_option("-m,--model", o->model,
                  "GGUF model file, or OWNER/REPO[:FILE] on Hugging Face (default: with --peers or a cluster "
                  "key, the cluster's model, its layers' weights fetched from peers; alone, the generated demo "
                  "model)");
  cmd->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' (also from STRATA_API_KEY)");
  cmd->add_option("--parallel", o->engine.max_parallel, "Sequences decoded together")
      ->check(positive_number())->capture_default_str();
  cmd->add_option("--queue", o->engine.max_queued, "Requests that may wait for a slot; more get HTTP 429")
      ->check(non_negative_number())->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->engine.context_size, "Context size per request (default: the model's)")
      ->check(non_negative_number());
  cmd->add_option("-t,--threads", o->engine.threads, "Threads (default: all cores)")->check(non_negative_number());
  cmd->add_option("--metrics-key", o->server.metrics_key,
                  "Require 'Authorization: Bearer KEY' for GET /metrics instead of the API key");
  cmd->add_option("--allowed-host", o->server.host_names,
                  "Host name clients may reach the server by, besides IP addresses and localhost (repeatable)");
  cmd->add_option("--cors-origin", o->server.cors_origins,
                  "Origin browsers may call the API from, or '*' (repeatable; default: none)");
  cmd->add_flag("--log-requests", o->server.log_requests,
                "Log one line per answered request of every endpoint, besides the one per generation");
  cmd->add_option("--log-format", o->log_format, "Log lines as text or as one JSON object a line")
      ->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  cmd->add_option("--log-level", o->log_level, "The least level logged: debug, info, warning or error")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}))->capture_default_str();
  cmd->add_option("--chat-template", o->chat_template_file,
                  "Jinja2 chat template to render chat prompts with, instead of the model's own")
      ->check(CLI::ExistingFile);
  cmd->add_option("--peers", o->peers, "Nodes to join, host:node-port (comma-separated)")->delimiter(',');
  cmd->add_option("--node-port", o->node_port,
                  "Port for other nodes (default: --port + 1, or any free port when that is taken; 0 with --port 0)")
      ->check(non_negative_number());
  cmd->add_option("--node-host", o->node_host,
                  "Address the node service listens on (default: 127.0.0.1, or 0.0.0.0 with a cluster key)");
  cmd->add_option("--node-id", o->node_id, "This node's id (default: generated once, kept in --state-dir)");
  cmd->add_option("--state-dir", o->state_dir, "Where the node id is kept (default: $XDG_STATE_HOME/strata or ~/.local/state/strata)");
  cmd->add_option("--cluster-key", o->cluster_key, "Secret every node of the cluster shares (also STRATA_CLUSTER_KEY)")
      ->envname("STRATA_CLUSTER_KEY");
  cmd->add_flag("--no-discovery", o->no_discovery, "Do not find nodes on the LAN by multicast (only --peers)");
  cmd->add_option("--discovery-port", o->discovery_port, "UDP port of the discovery multicast group")
      ->check(CLI::Range(1, 65535))->capture_default_str();
  cmd->add_option("--discovery-interface", o->discovery_interface,
                  "Announce and listen only on this interface (default: every one that can multicast)");
  cmd->add_option("--memory-limit", o->memory_limit, "Memory this node may use, e.g. 12GiB (default: detected)");
  cmd->add_option("--kv-type", o->kv_type, "How keys and values are stored: f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))->capture_default_str();
  cmd->add_option("--kv-memory", o->kv_memory,
                  "This node's KV pool, e.g. 512MiB (default: --ctx-size x --parallel positions of its layers)");
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "Compute every prompt in full, never reusing the cached keys and values of an earlier one");
  add_speculation_options(*cmd, o->speculation);
  cmd->add_option("--placement", o->placement, "How layers are split: speed (least time per token) or memory")
      ->check(CLI::IsMember({"speed", "memory"}))->capture_default_str();
  cmd->add_option("--stages", o->stages, "A placement fixed by hand: NODE:FIRST-LAST,... (layers inclusive) in pipeline order; NODE may be a tensor-parallel group, b+c (shares by speed) or b*3+c (by weight)");
  cmd->add_option("--startup-wait", o->startup_wait_seconds,
                  "Seconds a request waits for the cluster to form before a 503")
      ->check(non_negative_number())->capture_default_str();
  cmd->add_option("--cache-dir", o->cache_dir,
                  "Where models pulled with -m OWNER/REPO and weights fetched from peers are kept (default: "
                  "$STRATA_CACHE, $XDG_CACHE_HOME/strata or ~/.cache/strata)");
  cmd->add_option("--test-fetch-delay-ms", o->test_fetch_delay_ms, "Tests only: pause after every chunk of weights fetched")
      ->check(non_negative_number())->group("");
  cmd->add_option("--test-fetch-checkpoint-bytes", o->test_fetch_checkpoint_bytes,
                  "Tests only: record how far a tensor being fetched got every this many bytes")
      ->check(positive_number())->group("");
  cmd->add_option("--test-tensor-chunk-bytes", o->test_tensor_chunk_bytes,
                  "Tests only: send tensors to peers in chunks of this many bytes")
      ->check(positive_number())->group("");
  cmd->add_option("--test-weight-speed", o->test_weight_speed,
                  "Tests only: the weight speed (bytes/s) the node reports instead of the one it measures")
      ->check(positive_number())->group("");
  cmd->add_option("--test-exchange-delay-us", o->test_exchange_delay_us,
                  "Benchmarks only: delay added to every tensor-parallel gather, as a link's one-way delay")
      ->check(non_negative_number())->group("");
  cmd->add_option("--test-link-delay-ms", o->test_link_delay_ms, "Tests only: delay added to every stage call")
      ->check(non_negative_number())->group("");
  cmd->callback([&action, o] { action = [o] { return serve(*o); }; });
}

}  // namespace strata::cli
