#include "cluster/model_footprint.h"

#include <charconv>
#include <stdexcept>
#include <string>

#include "model/config.h"
#include "model/kv_pool.h"

namespace strata::cluster {

TensorRole role_of_tensor(std::string_view name, int layer_count, int skipped_layer_count) {
  if (name == "token_embd.weight") return {TensorRole::Embedding};
  if (name == "output.weight") return {TensorRole::OutputMatrix};
  if (name == "output_norm.weight") return {TensorRole::OutputNorm};
  if (!name.starts_with("blk.")) return {TensorRole::Shared};
  int layer = -1;
  const auto [end, error] = std::from_chars(name.data() + 4, name.data() + name.size(), layer);
  if (error != std::errc{} || end == name.data() + name.size() || *end != '.' || layer < 0 ||
      layer >= layer_count + skipped_layer_count) {
    const std::string skipped =
        skipped_layer_count > 0 ? " and " + std::to_string(skipped_layer_count) + " skipped" : "";
    throw std::runtime_error("tensor '" + std::string(name) + "' names no layer of the model's " +
                             std::to_string(layer_count) + skipped);
  }
  if (layer >= layer_count) return {TensorRole::Unused, layer};
  // llama.cpp names a layer's tensors of experts "<part>_exps.weight" (and ".bias"); a shared
  // expert ("_shexp") is read by every token, as the router ("ffn_gate_inp") is.
  const std::string_view part = name.substr(static_cast<size_t>(end - name.data()) + 1);
  return {TensorRole::Layer, layer, part.substr(0, part.find('.')).ends_with("_exps")};
}

ModelFootprint footprint_of(const gguf::File& file) {
  const model::Config config = model::Config::from_gguf(file);
  ModelFootprint footprint;
  footprint.layer_count = config.layer_count;
  footprint.layer_weight_bytes.assign(static_cast<size_t>(config.layer_count), 0);
  footprint.layer_read_bytes.assign(static_cast<size_t>(config.layer_count), 0);
  // As the KV pool lays a position out (latent attention keeps one latent row and no values).
  const model::KvLayout one_layer(config, 1, model::KvType::F32);
  footprint.kv_bytes_per_layer_per_token =
      (one_layer.key_row_elements() + one_layer.value_row_elements()) * one_layer.element_bytes;
  if (config.sliding_window > 0) {
    for (int l = 0; l < config.layer_count; ++l) footprint.sliding_layers.push_back(config.is_sliding(l));
  }
  // What a token reads of a tensor of experts: the experts it runs, each of the same size.
  const auto read_of_experts = [&](const gguf::TensorInfo& t) {
    if (!config.has_experts()) {
      throw std::runtime_error("tensor '" + t.name + "' holds experts, but the model's metadata counts none");
    }
    if (t.dims.empty() || t.dims.back() != static_cast<uint64_t>(config.expert_count)) {
      throw std::runtime_error("tensor '" + t.name + "' holds experts, but its last dimension is not the model's " +
                               std::to_string(config.expert_count) + " experts");
    }
    return config.expert_bytes_read(t.size_bytes);
  };
  // The reader sized every tensor from its dtype's block layout. Tensors outside the layers,
  // embedding and head (rope_freqs) are a few kilobytes and ignored.
  const gguf::TensorInfo* output = nullptr;
  const gguf::TensorInfo* embedding = nullptr;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const TensorRole role = role_of_tensor(t.name, config.layer_count, config.skipped_layer_count);
    switch (role.kind) {
      case TensorRole::Layer:
        footprint.layer_weight_bytes[static_cast<size_t>(role.layer)] += t.size_bytes;
        footprint.layer_read_bytes[static_cast<size_t>(role.layer)] += role.experts ? read_of_experts(t) : t.size_bytes;
        break;
      case TensorRole::Embedding:
        embedding = &t;
        break;
      case TensorRole::OutputMatrix:
        output = &t;
        break;
      case TensorRole::OutputNorm:
        footprint.head_bytes += t.size_bytes;
        break;
      case TensorRole::Shared:
      case TensorRole::Unused:
        break;
    }
  }
  if (embedding == nullptr) throw std::runtime_error("model lacks tensor 'token_embd.weight'");
  footprint.embedding_bytes = embedding->size_bytes;
  // A tied head reads token_embd as its output matrix: the last stage holds it too.
  footprint.head_bytes += (output != nullptr ? output : embedding)->size_bytes;
  for (int layer = 0; layer < config.layer_count; ++layer) {
    if (footprint.layer_weight_bytes[static_cast<size_t>(layer)] == 0) {
      throw std::runtime_error("model lacks the tensors of layer " + std::to_string(layer));
    }
  }
  // A group (tensor_groups.h) adds up o's leaves, and every down's (a dense FFN's, the experts'
  // and the shared expert's), in sums of rows of the embedding that its members swap: one sum
  // each in a group of two, a few more in larger ones; taken here as two rows a gather (so
  // larger groups are under-counted), and two more for a shared expert's beside the experts'.
  const uint64_t sums = 2 * static_cast<uint64_t>(config.embedding_dim) * sizeof(float);
  for (int l = 0; l < config.layer_count; ++l) {
    const bool shared = config.layer_has_experts(l) && config.shared_expert_ffn_dim > 0;
    footprint.layer_gathered_bytes.push_back((shared ? 3 : 2) * sums);
    footprint.layer_gathers.push_back(2);
  }
  footprint.head_gathered_bytes = static_cast<uint64_t>(config.vocab_size) * sizeof(float);
  return footprint;
}

}  // namespace strata::cluster
