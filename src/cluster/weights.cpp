#include "cluster/weights.h"

#include <openssl/sha.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "cluster/model_footprint.h"
#include "rpc/weights_client.h"

namespace strata::cluster {

namespace fs = std::filesystem;

std::vector<Sha256> hash_tensors(const gguf::File& file, int threads) {
  const std::vector<gguf::TensorInfo>& tensors = file.tensors();
  std::vector<Sha256> hashes(tensors.size());
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < tensors.size(); i = next++) {
      SHA256(file.tensor_data(tensors[i]), tensors[i].size_bytes, hashes[i].data());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int>(threads, static_cast<int>(tensors.size())); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return hashes;
}

cluster_types::ModelManifest make_manifest(const gguf::File& file, const std::string& model_hash, int threads) {
  cluster_types::ModelManifest manifest{model_hash, fs::path(file.path()).stem().string(),
                                        std::string(file.header_bytes().begin(), file.header_bytes().end()),
                                        file.file_size()};
  for (const Sha256& hash : hash_tensors(file, threads)) manifest.tensor_sha256.emplace_back(hash.begin(), hash.end());
  return manifest;
}

std::vector<size_t> tensors_for(const gguf::File& file, model::LayerRange range) {
  const model::Config config = model::Config::from_gguf(file);
  const bool tied_head = file.find_tensor("output.weight") == nullptr;
  std::vector<size_t> needed;
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const TensorRole role = role_of_tensor(file.tensors()[i].name, config.layer_count, config.skipped_layer_count);
    bool wanted = true;
    switch (role.kind) {
      case TensorRole::Layer: wanted = role.layer >= range.first && role.layer < range.last; break;
      case TensorRole::Embedding: wanted = range.has_embedding() || (range.has_head(config) && tied_head); break;
      case TensorRole::OutputMatrix:
      case TensorRole::OutputNorm: wanted = range.has_head(config); break;
      case TensorRole::Shared: break;
      case TensorRole::Unused: wanted = false; break;
    }
    if (wanted) needed.push_back(i);
  }
  return needed;
}

void TransferStats::begin(uint64_t wanted, uint64_t held) {
  std::lock_guard lock(mutex_);
  fetching_ = true;
  fetch_received_ = 0;
  wanted_ = wanted;
  held_at_start_ = held;
  began_ = std::chrono::steady_clock::now();
}

void TransferStats::add(uint64_t bytes) {
  std::lock_guard lock(mutex_);
  received_ += bytes;
  fetch_received_ += bytes;
}

void TransferStats::end() {
  std::lock_guard lock(mutex_);
  fetching_ = false;
  ended_ = std::chrono::steady_clock::now();
}

TransferStats::Snapshot TransferStats::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot s{fetching_, received_, fetch_received_, wanted_, held_at_start_, 0.0, 0.0};
  const auto until = fetching_ ? std::chrono::steady_clock::now() : ended_;
  const double seconds = std::chrono::duration<double>(until - began_).count();
  if (seconds > 0 && fetch_received_ > 0) s.bytes_per_second = static_cast<double>(fetch_received_) / seconds;
  if (fetching_ && s.bytes_per_second > 0 && wanted_ > fetch_received_) {
    s.eta_seconds = static_cast<double>(wanted_ - fetch_received_) / s.bytes_per_second;
  }
  return s;
}

void fetch_tensors(PartialModel& model, std::span<const size_t> tensors, const SourcesFor& sources,
                   const FetchOptions& options, TransferStats& stats) {
  std::vector<size_t> missing;
  for (size_t t : tensors) {
    if (!model.holds(t)) missing.push_back(t);
  }
  const auto stopped = [&] { return options.stop && options.stop(); };
  std::atomic<size_t> next{0};
  std::mutex failure_mutex;
  std::string failure;
  std::atomic<bool> failed{false};
  const auto fail = [&](const std::string& why) {
    std::lock_guard lock(failure_mutex);
    if (failure.empty()) failure = why;
    failed = true;
  };
  const auto work = [&] {
    for (size_t k = next++; k < missing.size() && !failed; k = next++) {
      const size_t tensor = missing[k];
      const std::string& name = model.file()->tensors()[tensor].name;
      const std::vector<std::shared_ptr<TensorSource>> from = sources(tensor);
      if (from.empty()) return fail("no peer holds tensor " + name);
      // One writer for every attempt: each asks its source for the bytes from where the last
      // left them.
      PartialModel::Writer writer = model.writer(tensor);
      bool done = false;
      for (size_t attempt = 0; !done && !stopped() && attempt < from.size() * static_cast<size_t>(options.rounds);
           ++attempt) {
        TensorSource& source = *from[(k + attempt) % from.size()];
        std::string why;
        const auto chunk = [&](uint64_t offset, std::span<const uint8_t> bytes) {
          stats.add(bytes.size());
          try {
            writer.write(offset, bytes);
          } catch (const std::exception& e) {
            why = e.what();
            return false;
          }
          if (options.test_delay.count() > 0) std::this_thread::sleep_for(options.test_delay);
          return !stopped();
        };
        const std::string fetch_error = source.fetch(static_cast<uint32_t>(tensor), writer.written(), chunk);
        if (why.empty()) why = fetch_error;
        if (why.empty()) {
          try {
            writer.commit();
            done = true;
          } catch (const std::exception& e) {
            why = e.what();
          }
        }
        if (!done && options.log && !stopped()) {
          options.log("tensor " + name + " from " + source.name() + " failed (" + why +
                      "); fetching it again from byte " + std::to_string(writer.written()));
        }
      }
      if (!done && stopped()) {
        try {
          writer.checkpoint();
        } catch (const std::exception& e) {
          return fail("the fetch was stopped, and where tensor " + name + " got to could not be recorded: " + e.what());
        }
        return fail("the fetch was stopped");
      }
      if (!done) return fail("tensor " + name + " could not be fetched from any of " + std::to_string(from.size()) +
                             " peer(s)");
    }
  };
  std::vector<std::thread> workers;
  const size_t streams = std::min<size_t>(static_cast<size_t>(std::max(1, options.streams)), missing.size());
  for (size_t i = 1; i < streams; ++i) workers.emplace_back(work);
  if (streams > 0) work();
  for (std::thread& t : workers) t.join();
  if (failed) throw std::runtime_error(failure);
}

namespace {

class PeerSource final : public TensorSource {
 public:
  PeerSource(std::string address, rpc::PeerChannel channel, std::string model_hash, std::string self_id,
             std::shared_ptr<const rpc::ClusterKey> key)
      : address_(std::move(address)),
        channel_(std::move(channel)),
        model_hash_(std::move(model_hash)),
        self_id_(std::move(self_id)),
        key_(std::move(key)) {}

  std::string name() const override { return address_; }

  std::string fetch(uint32_t tensor, uint64_t offset,
                    const std::function<bool(uint64_t, std::span<const uint8_t>)>& chunk) override {
    return rpc::fetch_tensor(channel_, {model_hash_, tensor, offset}, self_id_, *key_, chunk);
  }

 private:
  std::string address_;
  rpc::PeerChannel channel_;
  std::string model_hash_;
  std::string self_id_;
  std::shared_ptr<const rpc::ClusterKey> key_;
};

}  // namespace

std::shared_ptr<TensorSource> peer_source(const std::string& address, rpc::PeerChannel channel, std::string model_hash,
                                          std::string self_id, std::shared_ptr<const rpc::ClusterKey> key) {
  return std::make_shared<PeerSource>(address, std::move(channel), std::move(model_hash), std::move(self_id),
                                      std::move(key));
}

}  // namespace strata::cluster
