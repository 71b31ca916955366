// Arbitrary bytes as a request body: parsing must either succeed or throw ApiError, never crash,
// hang or throw anything else.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "api/anthropic.h"
#include "api/api_error.h"
#include "api/embeddings.h"
#include "api/request.h"
#include "api/responses_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::api;
  if (size == 0) return 0;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] % 10) {
      case 0:
        parse_completion_request(Endpoint::ChatCompletions, body);
        break;
      case 1:
        parse_completion_request(Endpoint::Completions, body);
        break;
      case 2:
        parse_ollama_request(OllamaEndpoint::Chat, body);
        break;
      case 3:
        parse_drain_force(body);
        break;
      case 4:
        parse_completion_request(Endpoint::ChatCompletions,
                                 chat_body_from_anthropic(AnthropicEndpoint::Messages, body));
        break;
      case 6:
        parse_completion_request(Endpoint::ChatCompletions, read_responses_request(body).chat_body);
        break;
      case 5:
        parse_completion_request(Endpoint::ChatCompletions,
                                 chat_body_from_anthropic(AnthropicEndpoint::CountTokens, body));
        break;
      case 8:
        parse_embedding_request(EmbeddingDialect::OpenAI, body);
        break;
      case 9:
        parse_embedding_request(EmbeddingDialect::Ollama, body);
        break;
      default:
        parse_ollama_request(OllamaEndpoint::Generate, body);
        break;
    }
  } catch (const ApiError&) {
  }
  return 0;
}
