// Weights from peers. A node started without a model file takes the model's description (its
// manifest: the GGUF header and tensor table, and each tensor's SHA-256) from a peer that has
// the file, and fetches from peers only the tensors its layers need, into a partial GGUF file
// in its cache directory (cluster/partial_model.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cluster/partial_model.h"
#include "cluster_types/model_manifest.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "rpc/auth.h"
#include "rpc/peer_channel.h"

namespace strata::cluster {

// SHA-256 of every tensor's bytes, in the file's table order, on `threads` threads. It reads
// the whole file: about a second per GB and thread.
std::vector<Sha256> hash_tensors(const gguf::File& file, int threads);

// The manifest of a whole model file, hashing its tensors.
cluster_types::ModelManifest make_manifest(const gguf::File& file, const std::string& model_hash, int threads);

// The tensors `Model::load` reads for `range`, as indices into the file's table: the range's
// layers, the embedding on the first range, the output norm and matrix (the embedding when
// the head is tied) on the last, and every tensor that belongs to no layer (rope_freqs).
std::vector<size_t> tensors_for(const gguf::File& file, model::LayerRange range);

// Where a tensor can come from: a peer that holds it.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual std::string name() const = 0;
  // Streams the tensor's bytes from `offset` to `chunk` (offset within the tensor, bytes) in
  // order until the end, or until `chunk` returns false. Returns why it failed, or empty.
  virtual std::string fetch(uint32_t tensor, uint64_t offset,
                            const std::function<bool(uint64_t offset, std::span<const uint8_t>)>& chunk) = 0;
};

// How a fetch goes, readable from any thread while it runs.
class TransferStats {
 public:
  struct Snapshot {
    bool fetching = false;
    uint64_t received_bytes = 0;       // since the node started, every fetch
    uint64_t fetch_received_bytes = 0;  // in the current (or last) fetch
    uint64_t wanted_bytes = 0;          // what the current fetch lacked at its start
    uint64_t held_at_start_bytes = 0;   // what it already held of its tensors, parts resumed from too
    double bytes_per_second = 0.0;
    double eta_seconds = 0.0;  // 0 when unknown or done
  };
  void begin(uint64_t wanted, uint64_t held);
  void add(uint64_t bytes);
  void end();
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  bool fetching_ = false;
  uint64_t received_ = 0;
  uint64_t fetch_received_ = 0;
  uint64_t wanted_ = 0;
  uint64_t held_at_start_ = 0;
  std::chrono::steady_clock::time_point began_;
  std::chrono::steady_clock::time_point ended_;
};

struct FetchOptions {
  int streams = 4;  // tensors in flight at once
  int rounds = 3;   // a tensor is tried this many times on each of its sources before giving up
  std::chrono::milliseconds test_delay{0};  // tests only: a pause after every chunk
  std::function<bool()> stop;               // true: give up at the next chunk
  std::function<void(const std::string&)> log;
};

// For a tensor, the sources that hold it, in a fixed order.
using SourcesFor = std::function<std::vector<std::shared_ptr<TensorSource>>(size_t tensor)>;

// Fetches the `tensors` that `model` lacks, `options.streams` at once, the i-th of them from
// its sources round-robin from the i-th, so that several peers send at the same time. A tensor
// resumes where its last checkpoint got to; one whose transfer fails goes on from its next
// source where the bytes got to, and one whose bytes do not match its hash is fetched again
// from byte 0. Throws std::runtime_error when a tensor has no source, fails every round, or the
// fetch was stopped.
void fetch_tensors(PartialModel& model, std::span<const size_t> tensors, const SourcesFor& sources,
                   const FetchOptions& options, TransferStats& stats);

// The node service behind `channel` (at `address`) as a source of the tensors of the model
// `model_hash`, called as node `self_id` under `key`.
std::shared_ptr<TensorSource> peer_source(const std::string& address, rpc::PeerChannel channel, std::string model_hash,
                                          std::string self_id, std::shared_ptr<const rpc::ClusterKey> key);

}  // namespace strata::cluster
