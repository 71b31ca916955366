// A model file filled tensor by tensor, for a node that fetches its weights from peers: the
// whole GGUF header and tensor table, with holes where tensors have not come, and beside it a
// list of the tensors written whole and verified and a record of how far the others got, so
// that a node stopped mid-way resumes where it was, inside a tensor.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cluster_types/model_manifest.h"
#include "cluster_types/node_info.h"
#include "gguf/gguf.h"

namespace strata::cluster {

using Sha256 = std::array<uint8_t, 32>;

// Parses the list of verified tensors (one "INDEX SHA256HEX" line each). A line counts only
// when it is whole (ends in a newline: a line cut short by a crash does not), names a tensor
// of the table, and repeats the manifest's hash for it; others are ignored, and the tensors
// they name fetched again.
std::vector<bool> parse_verified(std::string_view text, const cluster_types::ModelManifest& manifest);

// Parses the record of how far unfinished tensors got (one "INDEX BYTES" line per checkpoint):
// per tensor of the table, whose sizes are `tensor_bytes`, the bytes its last line that counts
// claims, 0 without one. Lines count as in parse_verified, and only with a number of bytes
// within the tensor.
std::vector<uint64_t> parse_progress(std::string_view text, std::span<const uint64_t> tensor_bytes);

// How often a writer records how far its tensor got: each record costs a sync of the file, and a
// node stopped mid-tensor fetches again at most this much of it.
inline constexpr uint64_t kProgressCheckpointBytes = 16 << 20;

// A model file in the cache directory (models/HASH/NAME.gguf), filled tensor by tensor. Thread-safe: tensors may be
// written concurrently, each by one writer.
class PartialModel {
 public:
  // Opens the model's directory under `cache_dir` (named by its hash), creating it from the
  // manifest the first time. Writers record how far their tensor got every `checkpoint_bytes`.
  // Throws std::runtime_error for a manifest that does not describe a GGUF file of its hash, or
  // files that cannot be written.
  static std::shared_ptr<PartialModel> open(const std::string& cache_dir, cluster_types::ModelManifest manifest,
                                            uint64_t checkpoint_bytes = kProgressCheckpointBytes);
  ~PartialModel();
  PartialModel(const PartialModel&) = delete;
  PartialModel& operator=(const PartialModel&) = delete;

  // Mapped read-only: tensors held read their bytes (the mapping shows what is written), the
  // others zeros.
  const std::shared_ptr<const gguf::File>& file() const { return file_; }
  const cluster_types::ModelManifest& manifest() const { return manifest_; }
  bool holds(size_t tensor) const;
  // The bytes of a tensor held: all of a verified one; of another, those on disk by its last
  // checkpoint, from which its writer resumes.
  uint64_t held_bytes(size_t tensor) const;
  bool complete() const;
  // Per layer, the bytes of its tensors held; whether the embedding, the head and the tensors
  // every stage reads (rope_freqs) are held.
  cluster_types::Weights held() const;

  // Receives one tensor's bytes in order, from where its last checkpoint got to (the bytes
  // before are read back from the file into the hash). Every checkpoint_bytes it syncs the file
  // and records how far the tensor got; commit() checks that all came and match the manifest's
  // hash, then records the tensor as held (after the bytes reach the disk, so that the record
  // never claims bytes a crash lost); a tensor not committed stays missing.
  class Writer {
   public:
    // Where the next bytes go: what a source is asked for.
    uint64_t written() const { return written_; }
    // Throws std::runtime_error for bytes out of order or past the tensor's end.
    void write(uint64_t offset, std::span<const uint8_t> bytes);
    // Records how far the tensor got now (syncing the file first), as a fetch stopped on
    // purpose does before it ends: a restart resumes from there, not from the last periodic
    // record.
    void checkpoint();
    // Throws std::runtime_error, naming the tensor, when bytes are missing or the hash differs.
    // Bytes that do not match may have been on disk before the writer began, so it then starts
    // over at byte 0, and so does the tensor's record: a restart does not resume past them.
    void commit();

   private:
    friend class PartialModel;
    Writer(PartialModel& model, size_t tensor);
    void start_hash();
    PartialModel& model_;
    size_t tensor_;
    uint64_t written_ = 0;
    uint64_t checkpointed_ = 0;   // what the tensor's last record claims
    std::shared_ptr<void> hash_;  // the running SHA-256 context
  };
  Writer writer(size_t tensor) { return Writer(*this, tensor); }

 private:
  PartialModel() = default;
  // Appends "TENSOR BYTES" to the progress record, after syncing the file when it claims bytes.
  void record_progress(size_t tensor, uint64_t bytes);
  std::string dir_;
  std::string path_;  // of the model file
  cluster_types::ModelManifest manifest_;
  std::shared_ptr<const gguf::File> file_;
  int fd_ = -1;           // model.gguf, for writing
  int verified_fd_ = -1;  // the list of verified tensors, appended to
  int progress_fd_ = -1;  // the record of how far the others got, appended to
  uint64_t checkpoint_bytes_ = kProgressCheckpointBytes;
  mutable std::mutex mutex_;
  std::vector<bool> held_;
  std::vector<uint64_t> progress_;  // per tensor not held, the bytes its last record claims
  // held()'s answer until a tensor is committed: every Hello a node sends or answers asks.
  mutable std::optional<cluster_types::Weights> held_weights_;
};

}  // namespace strata::cluster
