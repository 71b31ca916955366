// A copy of a GGUF file with metadata and float vectors added: tests use it for model variants
// that no synthetic shape has (rope_freqs, rope scaling).
#pragma once

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::model::testing {

inline void write_variant(const gguf::File& source, const std::string& path,
                          const std::vector<gguf::KeyValue>& extra_metadata,
                          const std::vector<std::pair<std::string, std::vector<float>>>& extra_vectors) {
  gguf::Writer w;
  for (const auto& kv : source.metadata()) w.set(kv.key, kv.value);
  for (const auto& kv : extra_metadata) w.set(kv.key, kv.value);
  for (const auto& t : source.tensors()) {
    const uint8_t* data = source.tensor_data(t);
    w.add_tensor(t.name, t.dims, t.type, std::vector<uint8_t>(data, data + t.size_bytes));
  }
  for (const auto& [name, values] : extra_vectors) {
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    w.add_tensor(name, {values.size()}, static_cast<uint32_t>(tensor::DType::F32), std::move(bytes));
  }
  w.write(path);
}

}  // namespace strata::model::testing
