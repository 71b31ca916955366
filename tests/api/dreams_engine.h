// The real engine on the shared aidreams model, for the HTTP tests that run a Server over it.
#pragma once

#include <memory>
#include <string>

#include "dreams_tokenizer.h"
#include "engine/engine.h"

namespace strata::api::testing {

inline std::unique_ptr<engine::Engine> dreams_engine(engine::EngineOptions options) {
  std::shared_ptr<const gguf::File> file = gguf::File::open(std::string(STRATA_SHARED_DIR) + "/models/aidreams260K.gguf");
  return std::make_unique<engine::Engine>(
      model::Model::load(file), [](engine::Token t) { return dreams_tokenizer().is_end_of_generation(t); }, options);
}

}  // namespace strata::api::testing
