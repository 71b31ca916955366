// What the API tells about the served model beyond its name (Ollama's /api/tags, /api/show and
// /api/ps), read once from its GGUF.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata::gguf {
class File;
}

namespace strata::api {

// Strata's version, as `strata --version` and Ollama's /api/version give it.
inline constexpr std::string_view kVersion = "0.1.0";

struct ModelFacts {
  std::string digest;              // hex; the cluster's model hash (header, metadata, tensor table)
  uint64_t size_bytes = 0;         // header and tensor data, as the file holds them
  std::string architecture;        // general.architecture
  int64_t parameter_count = 0;     // general.parameter_count, else the tensors' elements
  std::string parameter_size;      // the count as Ollama writes it: "7.6B", "260.0K"
  std::string quantization_level;  // general.file_type's name, else the type holding most bytes
  int64_t context_length = 0;      // what the model was trained for (ARCH.context_length)
  std::string model_info_json;     // the metadata's scalar values as a JSON object; arrays null
};

// Everything but the digest, which the caller knows. Throws gguf::Error for metadata of the
// wrong type.
ModelFacts read_model_facts(const gguf::File& file);

// "260.0K", "7.6B": the count in its largest unit with one decimal, as Ollama shows it.
std::string parameter_size_text(int64_t count);

}  // namespace strata::api
