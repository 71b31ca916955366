// A copy of a GGUF file with metadata and float vectors added, and tensors rewritten: tests use
// it for model variants that no synthetic shape has (rope_freqs, rope scaling, tied experts).
#pragma once

#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::model::testing {

// `rewrite`, when given, may change each copied tensor's bytes in place.
using TensorRewrite = std::function<void(const gguf::TensorInfo&, std::vector<uint8_t>&)>;

inline void write_variant(const gguf::File& source, const std::string& path,
                          const std::vector<gguf::KeyValue>& extra_metadata,
                          const std::vector<std::pair<std::string, std::vector<float>>>& extra_vectors,
                          const TensorRewrite& rewrite = {}) {
  gguf::Writer w;
  for (const auto& kv : source.metadata()) w.set(kv.key, kv.value);
  for (const auto& kv : extra_metadata) w.set(kv.key, kv.value);
  for (const auto& t : source.tensors()) {
    const uint8_t* data = source.tensor_data(t);
    std::vector<uint8_t> bytes(data, data + t.size_bytes);
    if (rewrite) rewrite(t, bytes);
    w.add_tensor(t.name, t.dims, t.type, std::move(bytes));
  }
  for (const auto& [name, values] : extra_vectors) {
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    w.add_tensor(name, {values.size()}, static_cast<uint32_t>(tensor::DType::F32), std::move(bytes));
  }
  w.write(path);
}

}  // namespace strata::model::testing
