// Bytes from the network as node-to-node messages: decoding and every message's check must
// reject anything malformed without crashing, whatever the bytes.
#include <cstddef>
#include <cstdint>

#include "rpc/messages.h"

namespace {

template <typename Message>
void parse_and_check(const uint8_t* data, size_t size) {
  Message message;
  if (message.ParseFromArray(data, static_cast<int>(size))) (void)strata::rpc::malformed(message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::rpc;
  parse_and_check<HelloRequest>(data, size);
  parse_and_check<ForwardRequest>(data, size);
  parse_and_check<ReleaseRequest>(data, size);
  parse_and_check<HoldPrefixRequest>(data, size);
  parse_and_check<ReadKvRequest>(data, size);
  parse_and_check<WriteKvRequest>(data, size);
  parse_and_check<LayerKv>(data, size);
  parse_and_check<GenerateRequest>(data, size);
  parse_and_check<ModelManifestRequest>(data, size);
  parse_and_check<FetchTensorRequest>(data, size);
  parse_and_check<ModelManifestReply>(data, size);
  TensorChunk chunk;
  (void)chunk.ParseFromArray(data, static_cast<int>(size));
  return 0;
}
