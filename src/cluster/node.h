// One Strata node of a cluster: it finds its peers, agrees with them on a placement of the
// model's layers, loads its own layers, and answers requests from its API whichever node
// they entered at. The node with the lowest id among the live members that run the same model
// leads: it decides the placement (a new epoch each time the members change) and schedules
// every request through the pipeline; the others run their stage and forward their API's
// requests to it. A node alone is a cluster of one.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cluster/discovery.h"
#include "cluster/placement.h"
#include "cluster/weights.h"
#include "cluster_types/cluster_status.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "metrics/metrics.h"
#include "rpc/node_service.h"

namespace strata::cluster {

struct NodeOptions {
  std::string node_id;             // see resolve_node_id
  std::string host = "127.0.0.1";  // where the node service listens
  int node_port = 0;               // 0: any free port
  bool any_port_if_taken = false;  // node_port is only a default: when it is taken, any free port
  std::string api_address;         // shown to peers and in /cluster
  std::vector<std::string> peers;  // host:node-port of nodes to join
  // The secret of a cluster across machines; empty: a cluster on this machine only, of the
  // nodes of this user, under `local_secret`.
  std::string cluster_key;
  std::string local_secret;        // see read_or_create_local_secret()
  const std::string& secret() const { return cluster_key.empty() ? local_secret : cluster_key; }
  bool discovery = true;           // find nodes on the LAN by multicast (needs a cluster key)
  int discovery_port = kDefaultDiscoveryPort;
  std::string discovery_interface;  // empty: every interface that can multicast
  uint64_t memory_limit = 0;       // 0: detected
  Strategy strategy = Strategy::Speed;
  std::vector<Stage> fixed_stages;  // a placement fixed by hand, validated like a computed one
  std::chrono::milliseconds startup_wait{60'000};
  engine::EngineOptions engine;
  std::chrono::milliseconds test_link_delay{0};  // tests only: latency added to every stage call
  double test_weight_speed = 0.0;  // tests only: the weight speed it reports, bytes/s; 0: measured
  std::chrono::microseconds test_exchange_delay{0};  // benchmarks only: added to every group gather
  // Set when the node has no model file of its own: the node's file is this partial model's,
  // and the tensors of the layers placed on it are fetched from peers before they load.
  std::shared_ptr<PartialModel> partial;
  int fetch_streams = 4;  // tensors fetched at once
  std::chrono::milliseconds test_fetch_delay{0};  // tests only: a pause after every chunk fetched
  uint64_t test_tensor_chunk_bytes = rpc::kTensorChunkBytes;  // tests only: of the tensors this node serves
  // A few times a second while tensors are fetched, and once when the fetch ends.
  std::function<void(const TransferStats::Snapshot&)> on_transfer;
  std::function<void(const std::string&)> log;  // one line per event (joins, placements, refusals)
};

class ClusterNode final : public engine::Generator {
 public:
  // Measures this machine, starts the node service and begins to look for peers. Throws
  // std::runtime_error when the options cannot work (a peer off this machine without a key).
  ClusterNode(std::shared_ptr<const gguf::File> file, std::function<bool(engine::Token)> is_end_of_generation,
              NodeOptions options);
  ~ClusterNode() override;

  int node_port() const;

  // Waits up to the startup wait for the cluster to serve; throws engine::Unavailable then.
  engine::ModelLimits limits() const override;
  bool submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) override;
  void shutdown() override;
  std::string waiting_for() const override;
  // Leaves the cluster on purpose (SIGTERM): the leader places the model over the other
  // nodes, and the state of the sequences this node holds moves to the nodes that take its
  // layers over, so that no request is computed again. A leader that leaves goes on scheduling
  // until the next leader serves, then passes its requests on to it with their state. Requests
  // that entered at this node finish (at the next leader); new ones are refused. Returns when
  // all that is done, or after a minute; at once when no other node can take over.
  void leave();
  // Why this node should not leave now, or empty: no other node runs, or the others cannot
  // hold the model without it (its requests would end).
  std::string why_needed() const;

  // GET /health: whether requests can run now, else what this node waits for.
  cluster_types::NodeHealth health() const;
  // GET /cluster: nodes, placement, links and model hash.
  cluster_types::ClusterStatus status() const;
  // GET /metrics: the cluster as this node sees it (members, placement, KV pool, scheduler).
  void write_metrics(metrics::Exposition& out) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// SHA-256 of the GGUF's header, metadata and tensor table, as hex: nodes with the same model
// file, whatever its name, have the same hash.
std::string model_hash(const gguf::File& file);

}  // namespace strata::cluster
