// The shared aidreams model's tokenizer, which the API tests render prompts and count tokens
// with. Loaded on first use, once per test binary.
#pragma once

#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::api::testing {

inline const tokenizer::Tokenizer& dreams_tokenizer() {
  static const std::unique_ptr<gguf::File> file =
      gguf::File::open(std::string(STRATA_SHARED_DIR) + "/models/aidreams260K.gguf");
  static const std::unique_ptr<tokenizer::Tokenizer> tokenizer = tokenizer::Tokenizer::from_gguf(*file);
  return *tokenizer;
}

}  // namespace strata::api::testing
