// The shared model, and the prompt that both the model tests and the cross-architecture
// logits comparison (tests/cross) run it on.
#pragma once

#include <string>
#include <vector>

#include "model/model.h"

namespace strata::model::testing {

inline const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

// "Once upon a time" after BOS, as the tokenizer encodes it.
inline const std::vector<Token> kOnceUponATime{1, 429, 491, 433, 295, 429, 444, 445, 265, 262, 263, 342, 430};

}  // namespace strata::model::testing
