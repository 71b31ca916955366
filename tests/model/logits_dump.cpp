// Writes the logits for every position of a prompt, as the raw floats of this machine, on the
// fastest kernel path it has: of the shared model (the test prompt), then of small models of
// the newer architectures in Q4_0, written here from their seeds (the same files on every
// machine), over 40 tokens: qwen3moe-tiny (experts), gpt-oss-tiny (experts, sinks, a window of
// 12), gemma3-tiny (a window of 12, GeGLU) and deepseek2-tiny (latent attention, groups of experts).
// tests/cross compares the file written on one architecture with the one written on another,
// byte for byte.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "dreams.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "tensor/matmul.h"

namespace {

std::vector<float> prompt_logits(std::shared_ptr<const strata::gguf::File> file,
                                 const std::vector<strata::model::Token>& prompt) {
  using namespace strata;
  auto model = model::Model::load(std::move(file));
  tensor::ThreadPool pool(2);
  auto kv = model->new_sequence(static_cast<int>(prompt.size()));
  model::SequenceSlice slice{kv.get(), static_cast<int>(prompt.size()), model::SliceOutput::AllLogits};
  return model->forward({&slice, 1}, prompt, {}, pool);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUTPUT_FILE\n";
    return 2;
  }
  std::ofstream out(argv[1], std::ios::binary);
  const auto write = [&](const std::vector<float>& logits) {
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  };
  write(prompt_logits(gguf::File::open(model::testing::kDreams), model::testing::kOnceUponATime));
  std::vector<model::Token> long_prompt{1};
  for (int i = 1; i < 40; ++i) long_prompt.push_back((i * 131 + 5) % 2000 + 3);
  for (const char* shape : {"qwen3moe-tiny", "gpt-oss-tiny", "gemma3-tiny", "deepseek2-tiny"}) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("strata_logits_dump_" + std::to_string(::getpid()) + "_" + shape + ".gguf"))
                                 .string();
    model::write_synthetic_model(*model::find_synthetic_shape(shape), model::parse_weight_types("Q4_0"), path, 7);
    write(prompt_logits(gguf::File::open(path), long_prompt));
    std::filesystem::remove(path);
  }
  if (!out.flush()) {
    std::cerr << "cannot write " << argv[1] << "\n";
    return 1;
  }
  std::cout << "logits of the shared model, qwen3moe-tiny, gpt-oss-tiny, gemma3-tiny and deepseek2-tiny (Q4_0) on the "
            << tensor::isa_name(tensor::active_isa()) << " path\n";
}
