// Where a command's model comes from: the file or hub model given with -m, or a generated demo
// model.
#pragma once

#include <memory>
#include <string>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

// `given` itself when it names a file, else, when it is shaped like OWNER/REPO[:FILE], that
// model from the cache, pulled from the hub first when it is not there (see hub/hub.h).
// Anything else is returned as it is, for opening it to report. An empty `cache_dir` is the
// user's (hub::default_cache_dir).
std::string model_path(const std::string& given, const std::string& cache_dir = {});

// model_path(given, cache_dir) when set. Otherwise writes (once, into the cache folder) a small
// random-weight demo model, says so on stderr, and returns its path.
std::string model_path_or_demo(const std::string& given, const std::string& cache_dir = {});

// `given`, or the user's cache folder when it is empty.
std::string cache_dir_or_default(const std::string& given);

// A model file opened for generation: its weights, tokenizer and an engine over them.
struct LoadedModel {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<engine::Engine> engine;
};
// With `speculation`, its drafter for this model (apply_speculation).
struct SpeculationOptions;
LoadedModel load_for_generation(const std::string& given_path, engine::EngineOptions options,
                                const SpeculationOptions* speculation = nullptr);

}  // namespace strata::cli
