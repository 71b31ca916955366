// Bytes from the network as node-to-node messages: decoding and the batch check must reject
// anything malformed without crashing, whatever the bytes.
#include <cstddef>
#include <cstdint>

#include "rpc/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::rpc::ForwardRequest forward;
  if (forward.ParseFromArray(data, static_cast<int>(size))) (void)strata::rpc::malformed(forward);
  strata::rpc::WriteKvRequest handed_over;
  if (handed_over.ParseFromArray(data, static_cast<int>(size))) (void)strata::rpc::malformed(handed_over.kv());
  strata::rpc::HelloRequest hello;
  (void)hello.ParseFromArray(data, static_cast<int>(size));
  strata::rpc::GenerateRequest generate;
  (void)generate.ParseFromArray(data, static_cast<int>(size));
  strata::rpc::ModelManifestReply manifest;
  if (manifest.ParseFromArray(data, static_cast<int>(size))) (void)strata::rpc::malformed(manifest);
  strata::rpc::TensorChunk chunk;
  (void)chunk.ParseFromArray(data, static_cast<int>(size));
  return 0;
}
