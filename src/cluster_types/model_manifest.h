// A model's weights between nodes: what a node that holds the model tells a node without the
// file (the protocol's ModelManifestReply, rpc/node.proto), enough to lay the file out and check
// every tensor fetched from peers; and what that node asks a peer for (FetchTensorRequest).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::cluster_types {

struct ModelManifest {
  std::string model_hash;  // SHA-256 of `header`, hex
  std::string model_name;
  std::string header;  // the GGUF file up to its tensor data (header, metadata, tensor table)
  uint64_t file_size = 0;
  std::vector<std::string> tensor_sha256;  // one per tensor of the table, in its order, 32 bytes each
  bool operator==(const ModelManifest&) const = default;
};

// A tensor's bytes from `offset` on: a fetch cut short resumes there.
struct TensorRequest {
  std::string model_hash;
  uint32_t tensor = 0;  // index in the tensor table
  uint64_t offset = 0;
  bool operator==(const TensorRequest&) const = default;
};

}  // namespace strata::cluster_types
