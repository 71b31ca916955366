// Embeddings: OpenAI's POST /v1/embeddings and Ollama's POST /api/embed, read into inputs, and
// their answers written from the vectors the engine pools.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/generator.h"

namespace strata::api {

enum class EmbeddingDialect { OpenAI, Ollama };

struct EmbeddingRequest {
  EmbeddingDialect dialect = EmbeddingDialect::OpenAI;
  std::optional<std::string> model;
  // Each input is text or (OpenAI) token ids, one vector each, in order.
  std::vector<std::variant<std::string, std::vector<engine::Token>>> inputs;
  bool base64 = false;              // OpenAI's encoding_format "base64": little-endian float32 bytes
  std::optional<int> dimensions;    // the leading dimensions to keep (Matryoshka models)
  bool truncate = false;            // Ollama's (its default): a long input loses its end instead of a 400
};

// Throws ApiError 400 naming the field for a body that is not such a request.
EmbeddingRequest parse_embedding_request(EmbeddingDialect dialect, std::string_view body);

// What a client gets of a pooled vector: its first `dimensions` values (all when unset),
// scaled to unit length (as OpenAI's and Ollama's embeddings are); a zero vector stays zero.
std::vector<float> unit_embedding(std::vector<float> pooled, std::optional<int> dimensions);

// The answer's body. `prompt_tokens`: the inputs' tokens together; `seconds`: how long it took
// (Ollama's total_duration).
std::string embedding_response_body(const EmbeddingRequest& request, const std::string& model_name,
                                    const std::vector<std::vector<float>>& embeddings, int prompt_tokens,
                                    double seconds);

// The vectors of one request's inputs, each its own engine request, as the engine finishes them.
class PendingEmbeddings : public std::enable_shared_from_this<PendingEmbeddings> {
 public:
  explicit PendingEmbeddings(size_t inputs);
  // Input `input`'s callbacks; they keep this alive for as long as the engine holds them.
  engine::RequestCallbacks callbacks(size_t input);
  // The inputs not yet done end (Cancelled) at their next step, or leave the queue.
  void cancel();

  struct Outcome {
    std::vector<std::vector<float>> vectors;  // pooled, one per input, when all are done
    std::string error;                        // else why one failed
  };
  // Until every input has its vector or one has failed. `give_up` is asked every 100 ms: true
  // (the client went away, the server stops) cancels the rest and returns that error.
  Outcome wait(const std::function<std::optional<std::string>()>& give_up);

 private:
  void finished(size_t input, engine::FinishReason reason, const std::string& error);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::vector<float>> vectors_;
  size_t done_ = 0;
  std::string error_;
  bool cancelled_ = false;
};

}  // namespace strata::api
