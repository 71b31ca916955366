// Arbitrary bytes as a partial model's list of verified tensors and as its record of how far the
// others got (files a crash or a disk may have damaged): parsing must mark only tensors of the
// table and claim no byte past a tensor's end, never crash or throw.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "cluster/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const strata::rpc::ModelManifestReply manifest = [] {
    strata::rpc::ModelManifestReply m;
    for (int i = 0; i < 40; ++i) m.add_tensor_sha256(std::string(32, static_cast<char>(i)));
    return m;
  }();
  static const std::vector<uint64_t> tensor_bytes = [] {
    std::vector<uint64_t> sizes;
    for (uint64_t i = 0; i < 40; ++i) sizes.push_back(i * i * 1000);
    return sizes;
  }();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<bool> held = strata::cluster::parse_verified(text, manifest);
  if (held.size() != 40) __builtin_trap();
  const std::vector<uint64_t> progress = strata::cluster::parse_progress(text, tensor_bytes);
  if (progress.size() != 40) __builtin_trap();
  for (size_t i = 0; i < progress.size(); ++i) {
    if (progress[i] > tensor_bytes[i]) __builtin_trap();
  }
  return 0;
}
