// Writes the logits for every position of the test prompt, as the raw floats of this machine,
// on the fastest kernel path it has: of the shared model, then of a small Mixture-of-Experts
// model (qwen3moe-tiny in Q4_0, written here from its seed, the same file on every machine).
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

std::vector<float> prompt_logits(std::shared_ptr<const strata::gguf::File> file) {
  using namespace strata;
  const auto& prompt = model::testing::kOnceUponATime;
  auto model = model::Model::load(std::move(file));
  tensor::ThreadPool pool(2);
  auto kv = model->new_sequence(static_cast<int>(prompt.size()));
  model::SequenceSlice slice{kv.get(), static_cast<int>(prompt.size()), true};
  return model->forward({&slice, 1}, prompt, {}, pool);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUTPUT_FILE\n";
    return 2;
  }
  const std::vector<float> dreams = prompt_logits(gguf::File::open(model::testing::kDreams));
  const std::string experts_path = (std::filesystem::temp_directory_path() /
                                    ("strata_logits_dump_" + std::to_string(::getpid()) + "_qwen3moe-tiny.gguf"))
                                       .string();
  model::write_synthetic_model(*model::find_synthetic_shape("qwen3moe-tiny"), model::parse_weight_types("Q4_0"),
                               experts_path, 7);
  const std::vector<float> experts = prompt_logits(gguf::File::open(experts_path));
  std::filesystem::remove(experts_path);

  std::ofstream out(argv[1], std::ios::binary);
  for (const std::vector<float>* logits : {&dreams, &experts}) {
    out.write(reinterpret_cast<const char*>(logits->data()), static_cast<std::streamsize>(logits->size() * sizeof(float)));
  }
  if (!out.flush()) {
    std::cerr << "cannot write " << argv[1] << "\n";
    return 1;
  }
  std::cout << dreams.size() << " logits of the shared model and " << experts.size()
            << " of qwen3moe-tiny Q4_0 on the " << tensor::isa_name(tensor::active_isa()) << " path\n";
}
