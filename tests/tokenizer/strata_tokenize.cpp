// Prints Strata's token ids for each text of a llama.cpp-style .inp file, one line per text in the
// .out format (no BOS; special-token text parsed), for scripts that put Strata beside other
// tokenizers. Usage: strata_tokenize VOCAB.gguf TEXTS.inp
#include <cstdio>
#include <exception>

#include "test_support.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s VOCAB.gguf TEXTS.inp\n", argv[0]);
    return 2;
  }
  try {
    using namespace strata::tokenizer;
    const test::LoadedTokenizer loaded = test::load(argv[1]);
    for (const std::string& text : test::read_inputs(argv[2])) {
      for (Token id : loaded.tokenizer->encode(text, false, true)) std::printf(" %d", id);
      std::printf("\n");
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
  return 0;
}
