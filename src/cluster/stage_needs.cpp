#include "cluster/stage_needs.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace strata::cluster {

std::vector<uint64_t> prefix_sums(const std::vector<uint64_t>& values) {
  std::vector<uint64_t> prefix{0};
  for (uint64_t value : values) prefix.push_back(saturating_add(prefix.back(), value));
  return prefix;
}

StageNeeds::StageNeeds(const ModelFootprint& model, uint64_t kv_tokens)
    : model_(model),
      kv_per_layer_(saturating_mul(kv_tokens, model.kv_bytes_per_layer_per_token)),
      kv_per_window_layer_(saturating_mul(model.window_kv_tokens > 0 ? std::min(kv_tokens, model.window_kv_tokens) : kv_tokens,
                                          model.kv_bytes_per_layer_per_token)) {
  if (model.layer_count < 1) throw std::invalid_argument("the model has no layers to place");
  const auto check_count = [&](const std::vector<uint64_t>& sizes, const char* what) {
    if (sizes.size() != static_cast<size_t>(model.layer_count)) {
      throw std::invalid_argument("the footprint lists " + std::to_string(sizes.size()) + " " + what + " for " +
                                  std::to_string(model.layer_count) + " layers");
    }
  };
  check_count(model.layer_weight_bytes, "layer sizes");
  held_prefix_ = prefix_sums(model.layer_weight_bytes);
  if (model.layer_read_bytes.empty()) {
    read_prefix_ = held_prefix_;
  } else {
    check_count(model.layer_read_bytes, "sizes read per token");
    for (size_t layer = 0; layer < model.layer_read_bytes.size(); ++layer) {
      if (model.layer_read_bytes[layer] > model.layer_weight_bytes[layer]) {
        throw std::invalid_argument("layer " + std::to_string(layer) + " reads " +
                                    std::to_string(model.layer_read_bytes[layer]) + " bytes per token of the " +
                                    std::to_string(model.layer_weight_bytes[layer]) + " it holds");
      }
    }
    read_prefix_ = prefix_sums(model.layer_read_bytes);
  }
  const auto optional_prefix = [&](const std::vector<uint64_t>& values, const char* what) {
    if (values.empty()) return std::vector<uint64_t>(static_cast<size_t>(model.layer_count) + 1, 0);
    check_count(values, what);
    return prefix_sums(values);
  };
  gathered_prefix_ = optional_prefix(model.layer_gathered_bytes, "sizes gathered per token");
  gathers_prefix_ = optional_prefix(model.layer_gathers, "counts of gathers per token");
  if (!model.sliding_layers.empty() && model.sliding_layers.size() != static_cast<size_t>(model.layer_count)) {
    throw std::invalid_argument("the footprint says whether " + std::to_string(model.sliding_layers.size()) +
                                " layers slide, of " + std::to_string(model.layer_count));
  }
  std::vector<uint64_t> sliding;
  for (int layer = 0; layer < model.layer_count; ++layer) {
    const bool slides = !model.sliding_layers.empty() && model.sliding_layers[static_cast<size_t>(layer)];
    sliding.push_back(slides ? 1 : 0);
    uint64_t& smallest = slides ? smallest_window_layer_ : smallest_full_layer_;
    smallest = std::min(smallest, model.layer_weight_bytes[static_cast<size_t>(layer)]);
  }
  window_prefix_ = prefix_sums(sliding);
}

}  // namespace strata::cluster
