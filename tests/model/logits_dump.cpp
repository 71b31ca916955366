// Writes the shared model's logits for every position of the test prompt, as the raw floats
// of this machine, on the fastest kernel path it has: tests/cross compares the file written on
// one architecture with the one written on another, byte for byte.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "dreams.h"
#include "model/model.h"
#include "tensor/matmul.h"

int main(int argc, char** argv) {
  using namespace strata;
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUTPUT_FILE\n";
    return 2;
  }
  const auto& prompt = model::testing::kOnceUponATime;
  auto model = model::Model::load(gguf::File::open(model::testing::kDreams));
  tensor::ThreadPool pool(2);
  auto kv = model->new_sequence(static_cast<int>(prompt.size()));
  model::SequenceSlice slice{kv.get(), static_cast<int>(prompt.size()), true};
  const std::vector<float> logits = model->forward({&slice, 1}, prompt, {}, pool);
  std::ofstream out(argv[1], std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out.flush()) {
    std::cerr << "cannot write " << argv[1] << "\n";
    return 1;
  }
  std::cout << logits.size() << " logits on the " << tensor::isa_name(tensor::active_isa()) << " path\n";
}
