// A node's model weights as peers see them: the manifest and the tensors it serves to nodes
// that have no file, what it says it holds, and, for a node started without a file, the
// fetch of its layers' tensors from the peers that hold them (cluster/weights.h).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cluster/weights.h"
#include "cluster_types/model_manifest.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "rpc/auth.h"
#include "rpc/node_service.h"

namespace strata::cluster {

struct NodeWeightsOptions {
  std::string node_id;
  std::string model_hash;
  int hash_threads = 1;  // for the manifest, hashed when a peer first asks
  std::shared_ptr<PartialModel> partial;  // set when the node has no model file of its own
  int fetch_streams = 4;
  std::chrono::milliseconds test_fetch_delay{0};
  std::function<void(const TransferStats::Snapshot&)> on_transfer;  // see NodeOptions
  std::function<void(const std::string&)> log;
};

// A live peer of this model, at `address`, that says it holds `weights`.
struct WeightsHolder {
  std::string address;
  cluster_types::Weights weights;
};

class NodeWeights {
 public:
  NodeWeights(std::shared_ptr<const gguf::File> file, std::shared_ptr<rpc::ClusterKey> key, NodeWeightsOptions options);

  // rpc::NodeHandler's: the manifest of this node's model when it is `model_hash` (or that is
  // empty), and a tensor this node holds whole and verified; otherwise nullopt with `why`.
  std::optional<cluster_types::ModelManifest> manifest(const std::string& model_hash, std::string& why);
  std::optional<rpc::TensorBytes> tensor(const cluster_types::TensorRequest& request, std::string& why) const;

  // What this node holds of the weights, and its fetch's progress.
  cluster_types::Weights held() const;

  // Before a partial model loads `range`: fetches the tensors it lacks from `holders()`,
  // asked for each tensor. Stops when `moved()` says a new placement moved this node's layers
  // (the tensors verified so far stay), or at stop(). Throws std::runtime_error when the
  // tensors cannot be had.
  void fetch_layers(model::LayerRange range, const std::function<std::vector<WeightsHolder>()>& holders,
                    const std::function<bool()>& moved);
  // Stops a fetch in flight, for good: the node shuts down.
  void stop() { stopped_ = true; }

 private:
  // Whether a peer that says `w` about itself holds tensor `index` whole and verified.
  bool holds(const cluster_types::Weights& w, size_t index) const;
  std::vector<std::shared_ptr<TensorSource>> sources_for(size_t index, const std::vector<WeightsHolder>& holders);
  void log(const std::string& line) const;

  std::shared_ptr<const gguf::File> file_;
  std::shared_ptr<rpc::ClusterKey> key_;
  NodeWeightsOptions options_;
  model::Config config_;
  std::vector<uint64_t> layer_weight_bytes_;  // what a layer held whole has
  TransferStats transfer_;
  std::atomic<bool> stopped_{false};
  std::mutex sources_mutex_;
  std::map<std::string, std::shared_ptr<TensorSource>> sources_;  // by address
  std::mutex manifest_mutex_;  // its own: hashing a large file must not hold up anything else
  std::optional<cluster_types::ModelManifest> manifest_;
};

}  // namespace strata::cluster
