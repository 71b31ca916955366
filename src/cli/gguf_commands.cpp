#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/option_checks.h"
#include "gguf/gguf.h"
#include "hub/progress.h"
#include "model/synthetic.h"
#include "tensor/dtype.h"

namespace strata::cli {
namespace {

int inspect(const std::string& given, bool all_tensors) {
  const std::string path = model_path(given);
  const auto file = gguf::File::open(path);
  std::printf("%s: GGUF v%u, %.1f MB, alignment %llu\n", path.c_str(), file->version(),
              static_cast<double>(file->file_size()) / 1e6,
              static_cast<unsigned long long>(file->alignment()));
  std::printf("\nmetadata (%zu keys):\n", file->metadata().size());
  for (const gguf::KeyValue& kv : file->metadata()) {
    std::printf("  %-44s %-8s %s\n", kv.key.c_str(), gguf::value_type_name(kv.value.type),
                kv.value.to_display().c_str());
  }
  uint64_t total_bytes = 0, total_elements = 0;
  for (const gguf::TensorInfo& t : file->tensors()) {
    total_bytes += t.size_bytes;
    total_elements += t.elements();
  }
  std::printf("\ntensors (%zu, %.3f billion parameters, %.1f MB):\n", file->tensors().size(),
              static_cast<double>(total_elements) / 1e9, static_cast<double>(total_bytes) / 1e6);
  constexpr size_t kShown = 24;
  size_t shown = 0;
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (!all_tensors && shown++ == kShown) {
      std::printf("  ... %zu more (--all to list them)\n", file->tensors().size() - kShown);
      break;
    }
    std::string dims;
    for (uint64_t d : t.dims) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
    std::printf("  %-32s %-6s %-20s %10.3f MB\n", t.name.c_str(), tensor::dtype_info(t.type)->name,
                dims.c_str(), static_cast<double>(t.size_bytes) / 1e6);
  }
  return 0;
}

int synth(const std::string& shape_name, const std::string& type_name, const std::string& out,
          uint64_t seed, int layers, model::SyntheticWeights weights) {
  const model::SyntheticShape* shape = model::find_synthetic_shape(shape_name);
  if (shape == nullptr) {
    std::string names;
    for (const auto& s : model::synthetic_shapes()) names += (names.empty() ? "" : ", ") + std::string(s.name);
    throw std::invalid_argument("unknown shape '" + shape_name + "' (choose " + names + ")");
  }
  const model::WeightTypes types = model::parse_weight_types(type_name);
  const std::string partial = out + ".partial";
  std::optional<hub::Progress> progress;  // once the size is known
  model::write_synthetic_model(*shape, types, partial, seed, [&](uint64_t written, uint64_t total) {
    if (!progress) {
      progress.emplace(stderr, std::filesystem::path(out).filename().string(), total);
      progress->start(0);
    }
    if (written < total) {
      progress->update(written);
    } else {
      progress->finish(written);
    }
  }, layers, weights);
  std::filesystem::rename(partial, out);
  std::fprintf(stderr, "wrote %s: %s, %s, %s weights\n", out.c_str(), shape->description, types.name.c_str(),
               weights == model::SyntheticWeights::Copying ? "copying" : "random");
  return 0;
}

}  // namespace

void add_gguf_commands(CLI::App& app, Action& action) {
  CLI::App* gguf_cmd = app.add_subcommand("gguf", "Inspect or create GGUF files");
  gguf_cmd->require_subcommand(1);

  auto inspect_path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  CLI::App* inspect_cmd = gguf_cmd->add_subcommand("inspect", "Print a GGUF file's metadata and tensors");
  inspect_cmd->add_option("file", *inspect_path, "GGUF file, or OWNER/REPO[:FILE] on Hugging Face")->required();
  inspect_cmd->add_flag("--all", *all, "List every tensor");
  inspect_cmd->callback([&action, inspect_path, all] { action = [=] { return inspect(*inspect_path, *all); }; });

  struct SynthOptions {
    std::string shape, type = "Q4_0", out;
    uint64_t seed = 1;
    int layers = 0;
    model::SyntheticWeights weights = model::SyntheticWeights::Random;
  };
  auto o = std::make_shared<SynthOptions>();
  std::string shapes_help = "Model shape:";
  for (const auto& s : model::synthetic_shapes()) shapes_help += std::string("\n  ") + s.name + ": " + s.description;
  CLI::App* synth_cmd = gguf_cmd->add_subcommand("synth", "Write a random-weight model of a real shape (for benchmarks)");
  synth_cmd->add_option("--shape", o->shape, shapes_help)->required();
  synth_cmd->add_option("--type", o->type, "Weight type: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS "
                           "Q3_K_M Q4_K_M Q5_K_M MXFP4 (FFN and experts; the rest Q8_0)");
  synth_cmd->add_option("-o,--output", o->out, "Output file")->required();
  synth_cmd->add_option("--seed", o->seed, "Seed for the random weights");
  synth_cmd->add_option("--layers", o->layers, "Write only the first N layers of the shape (default: all)")
      ->check(positive_number());
  synth_cmd->add_option("--weights", o->weights,
                        "random (default), or copying: hand-set weights of a Llama shape that repeat what the "
                        "model has read (an induction head over three tokens; a third layer edits cat to dog and red "
                        "to tan), to measure speculative decoding on a copying task")
      ->transform(CLI::CheckedTransformer(std::map<std::string, model::SyntheticWeights>{
          {"random", model::SyntheticWeights::Random}, {"copying", model::SyntheticWeights::Copying}}));
  synth_cmd->callback([&action, o] {
    action = [o] { return synth(o->shape, o->type, o->out, o->seed, o->layers, o->weights); };
  });
}

}  // namespace strata::cli
