// Bytes from the network as node-to-node messages: decoding and every message's check must
// reject anything malformed without crashing, whatever the bytes, and what the check passes
// must convert without reading past its fields.
#include <cstddef>
#include <cstdint>

#include "rpc/messages.h"

namespace {

template <typename Message>
void parse_and_check(const uint8_t* data, size_t size) {
  Message message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return;
  // What passes the check is converted as the service converts it.
  if constexpr (requires { strata::rpc::from_message(message); }) {
    if (strata::rpc::malformed(message).empty()) (void)strata::rpc::from_message(message);
  } else {
    (void)strata::rpc::malformed(message);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::rpc;
  parse_and_check<HelloRequest>(data, size);
  parse_and_check<ForwardRequest>(data, size);
  parse_and_check<ForwardReply>(data, size);
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
