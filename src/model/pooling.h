// How a model that makes embeddings (GGUF's `<arch>.pooling_type`) turns the output-normed
// hidden rows of a text's inputs into one vector.
#pragma once

namespace strata::model {

enum class Pooling {
  None,  // the model declares none: it is not an embedding model
  Mean,  // the average of every input's row
  Cls,   // the first input's row
  Last,  // the last input's row (Qwen3-Embedding)
  Rank,  // a reranker's score: not an embedding
};

// "none", "mean", "cls", "last" or "rank", as llama.cpp names them.
inline const char* pooling_name(Pooling pooling) {
  switch (pooling) {
    case Pooling::Mean:
      return "mean";
    case Pooling::Cls:
      return "cls";
    case Pooling::Last:
      return "last";
    case Pooling::Rank:
      return "rank";
    case Pooling::None:
      break;
  }
  return "none";
}

}  // namespace strata::model
