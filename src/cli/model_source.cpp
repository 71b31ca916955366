#include "cli/model_source.h"

#include <cstdio>
#include <filesystem>
#include <optional>

#include "cli/speculation.h"
#include "hub/hub.h"
#include "model/synthetic.h"

namespace strata::cli {

namespace fs = std::filesystem;

std::string cache_dir_or_default(const std::string& given) {
  return given.empty() ? hub::default_cache_dir().string() : given;
}

std::string model_path(const std::string& given, const std::string& cache_dir) {
  std::error_code ec;
  if (fs::exists(given, ec)) return given;
  const std::optional<hub::ModelRef> ref = hub::parse_model_ref(given);
  if (!ref) return given;
  hub::PullOptions options = hub::options_from_environment();
  if (!cache_dir.empty()) options.cache_dir = cache_dir;
  if (const std::optional<fs::path> cached = hub::find_cached(options.cache_dir, *ref)) return cached->string();
  return hub::pull(*ref, options).string();
}

std::string model_path_or_demo(const std::string& given, const std::string& cache_dir) {
  if (!given.empty()) return model_path(given, cache_dir);
  const fs::path dir = cache_dir_or_default(cache_dir);
  const fs::path path = dir / "demo-random-weights-Q8_0.gguf";
  std::fprintf(stderr,
               "strata: no model given (-m): using a generated demo model with RANDOM weights;\n"
               "        its text is noise. Pass -m FILE.gguf or -m OWNER/REPO to run a real model.\n");
  if (!fs::exists(path)) {
    fs::create_directories(dir);
    const fs::path partial = path.string() + ".partial";
    model::write_synthetic_model(*model::find_synthetic_shape("demo"),
                                 model::parse_weight_types("Q8_0"), partial.string(), 1);
    fs::rename(partial, path);
    std::fprintf(stderr, "strata: wrote the demo model to %s\n", path.c_str());
  }
  return path.string();
}

LoadedModel load_for_generation(const std::string& given_path, engine::EngineOptions options,
                                const SpeculationOptions* speculation) {
  LoadedModel loaded;
  loaded.file = gguf::File::open(model_path_or_demo(given_path));
  if (speculation) apply_speculation(*speculation, *loaded.file, options.threads, options);
  std::shared_ptr<model::Model> model = model::Model::load(loaded.file);
  loaded.tokenizer = tokenizer::Tokenizer::from_gguf(*loaded.file);
  const tokenizer::Tokenizer* tokenizer = loaded.tokenizer.get();
  loaded.engine = std::make_unique<engine::Engine>(
      std::move(model), [tokenizer](engine::Token t) { return tokenizer->is_end_of_generation(t); }, options);
  return loaded;
}

}  // namespace strata::cli
