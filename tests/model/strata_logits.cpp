// Prints Strata's last-position logits for a GGUF file and a list of token ids, one per line,
// as ../shared/reference/llama_logits prints llama.cpp's: the two side by side check a new
// architecture or weight type against an independent implementation (tests/model/llama_cpp_check.py).
//
// usage: strata_logits MODEL.gguf ID,ID,... [f32|f16]   (the KV cache's type; f32 by default)
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "model/model.h"

int main(int argc, char** argv) {
  using namespace strata;
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " MODEL.gguf ID,ID,... [f32|f16]\n";
    return 2;
  }
  try {
    std::vector<model::Token> ids;
    std::stringstream list(argv[2]);
    for (std::string id; std::getline(list, id, ',');) ids.push_back(std::stoi(id));
    const auto kv_type = argc > 3 ? model::parse_kv_type(argv[3]) : model::KvType::F32;
    if (ids.empty() || !kv_type) throw std::invalid_argument("no token ids, or a KV type other than f32 and f16");
    auto model = model::Model::load(gguf::File::open(argv[1]));
    tensor::ThreadPool pool(2);
    auto kv = model->new_sequence(static_cast<int>(ids.size()), *kv_type);
    model::SequenceSlice slice{kv.get(), static_cast<int>(ids.size())};
    for (float logit : model->forward({&slice, 1}, ids, {}, pool)) std::printf("%.6f\n", logit);
  } catch (const std::exception& e) {
    std::cerr << "strata_logits: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
