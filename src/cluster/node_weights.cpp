#include "cluster/node_weights.h"

#include <condition_variable>
#include <stdexcept>
#include <stop_token>
#include <thread>

#include "cluster/placement.h"
#include "units/byte_size.h"

namespace strata::cluster {

NodeWeights::NodeWeights(std::shared_ptr<const gguf::File> file, std::shared_ptr<rpc::ClusterKey> key,
                         NodeWeightsOptions options)
    : file_(std::move(file)),
      key_(std::move(key)),
      options_(std::move(options)),
      config_(model::Config::from_gguf(*file_)),
      layer_weight_bytes_(footprint_of(*file_).layer_weight_bytes) {}

void NodeWeights::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

std::optional<cluster_types::ModelManifest> NodeWeights::manifest(const std::string& model_hash, std::string& why) {
  if (!model_hash.empty() && model_hash != options_.model_hash) {
    why = "node " + options_.node_id + " runs another model (" + options_.model_hash.substr(0, 12) + ")";
    return std::nullopt;
  }
  if (options_.partial) return options_.partial->manifest();
  // Hashed on the first request only: nodes that are never asked never read their whole file.
  std::lock_guard lock(manifest_mutex_);
  if (!manifest_) {
    log("hashing the model's tensors for a node that fetches them");
    manifest_ = make_manifest(*file_, options_.model_hash, options_.hash_threads);
  }
  return manifest_;
}

std::optional<rpc::TensorBytes> NodeWeights::tensor(const cluster_types::TensorRequest& request,
                                                    std::string& why) const {
  if (request.model_hash != options_.model_hash) {
    why = "node " + options_.node_id + " runs another model (" + options_.model_hash.substr(0, 12) + ")";
    return std::nullopt;
  }
  if (request.tensor >= file_->tensors().size()) {
    why = "the model has no tensor " + std::to_string(request.tensor);
    return std::nullopt;
  }
  const gguf::TensorInfo& t = file_->tensors()[request.tensor];
  if (options_.partial && !options_.partial->holds(request.tensor)) {
    why = "node " + options_.node_id + " does not hold tensor " + t.name;
    return std::nullopt;
  }
  return rpc::TensorBytes{file_, {file_->tensor_data(t), t.size_bytes}};
}

cluster_types::Weights NodeWeights::held() const {
  cluster_types::Weights weights;
  if (options_.partial) {
    weights = options_.partial->held();
  } else {
    weights.whole_file = true;
  }
  const TransferStats::Snapshot s = transfer_.snapshot();
  weights.fetching = s.fetching;
  weights.received_bytes = s.received_bytes;
  weights.fetch_received_bytes = s.fetch_received_bytes;
  weights.wanted_bytes = s.wanted_bytes;
  weights.held_at_start_bytes = s.held_at_start_bytes;
  weights.bytes_per_second = s.bytes_per_second;
  weights.eta_seconds = s.eta_seconds;
  return weights;
}

bool NodeWeights::holds(const cluster_types::Weights& w, size_t index) const {
  if (w.whole_file) return true;
  const TensorRole role = role_of_tensor(file_->tensors()[index].name, config_.layer_count, config_.skipped_layer_count);
  switch (role.kind) {
    case TensorRole::Layer:
      return static_cast<size_t>(role.layer) < w.layer_bytes.size() &&
             w.layer_bytes[static_cast<size_t>(role.layer)] == layer_weight_bytes_[static_cast<size_t>(role.layer)];
    case TensorRole::Embedding: return w.embedding;
    case TensorRole::OutputMatrix:
    case TensorRole::OutputNorm: return w.head;
    case TensorRole::Shared: return w.shared;
    case TensorRole::Unused: return false;  // no node fetches it
  }
  return false;
}

// The holders of tensor `index`, in the holders' order.
std::vector<std::shared_ptr<TensorSource>> NodeWeights::sources_for(size_t index,
                                                                    const std::vector<WeightsHolder>& holders) {
  std::lock_guard lock(sources_mutex_);
  std::vector<std::shared_ptr<TensorSource>> sources;
  for (const WeightsHolder& holder : holders) {
    if (!holds(holder.weights, index)) continue;
    auto& source = sources_[holder.address];
    if (!source) {
      source = peer_source(holder.address, rpc::PeerChannel::bulk_to(holder.address, *key_), options_.model_hash,
                           options_.node_id, key_);
    }
    sources.push_back(source);
  }
  return sources;
}

void NodeWeights::fetch_layers(model::LayerRange range, const std::function<std::vector<WeightsHolder>()>& holders,
                               const std::function<bool()>& moved) {
  PartialModel& partial = *options_.partial;
  const std::vector<size_t> needed = tensors_for(*file_, range);
  uint64_t wanted = 0, held = 0;
  for (size_t t : needed) {
    const uint64_t had = partial.held_bytes(t);  // the part a fetch resumes from, too
    held += had;
    wanted += file_->tensors()[t].size_bytes - had;
  }
  if (wanted == 0) return;
  log("fetching " + units::describe_bytes(wanted) + " of weights for layers [" + std::to_string(range.first) + ", " +
      std::to_string(range.last) + ") from peers (" + units::describe_bytes(held) + " of them held already)");
  transfer_.begin(wanted, held);
  std::jthread reporter;
  if (options_.on_transfer) {
    reporter = std::jthread([this](std::stop_token stop) {
      std::mutex m;
      std::condition_variable_any tick;
      std::unique_lock lock(m);
      while (!stop.stop_requested()) {
        options_.on_transfer(transfer_.snapshot());
        tick.wait_for(lock, stop, std::chrono::milliseconds(200), [] { return false; });
      }
    });
  }
  const FetchOptions fetch{options_.fetch_streams, 3, options_.test_fetch_delay,
                           [this, &moved] { return stopped_.load() || moved(); }, [this](const std::string& line) { log(line); }};
  std::string error;
  try {
    fetch_tensors(partial, needed, [&](size_t t) { return sources_for(t, holders()); }, fetch, transfer_);
  } catch (const std::exception& e) {
    error = !stopped_ && moved() ? "a new placement moved this node's layers; the fetch stopped" : e.what();
  }
  transfer_.end();
  if (reporter.joinable()) {
    reporter.request_stop();
    reporter.join();
    options_.on_transfer(transfer_.snapshot());
  }
  if (!error.empty()) throw std::runtime_error(error);
  const TransferStats::Snapshot s = transfer_.snapshot();
  log("fetched " + units::describe_bytes(s.fetch_received_bytes) + " of weights at " +
      units::describe_bytes(static_cast<uint64_t>(s.bytes_per_second)) + "/s");
}

}  // namespace strata::cluster
