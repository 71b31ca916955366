// Checks of what peers send, before any of it is used. Kept apart from the service so that a
// fuzzer can drive them with nothing but the generated message code.
#pragma once

#include <string>

#include "engine/generator.h"
#include "engine/stage.h"
#include "node.pb.h"

namespace strata::rpc {

// Why a batch cannot be run (no sequences, counts that do not add up, impossible positions or
// capacities, too many rows), or empty when it is well-formed.
std::string malformed(const ForwardRequest& request);
// Why handed-over state cannot be taken (impossible positions or capacity, keys and values
// that are not whole rows of the same size), or empty.
std::string malformed(const LayerKv& kv);
// A sequence's handed-over state as a message and back (check it with malformed first): its
// rows in the element type they have (`half` for an f16 pool's), the same bytes back.
void to_message(const engine::LayerKv& kv, LayerKv& out);
engine::LayerKv from_message(const LayerKv& message);
// Where a passed-on request left its state, as a message and back.
void to_message(const engine::HeldState& held, HeldState& out);
engine::HeldState from_message(const HeldState& message);

// Why a model manifest cannot describe a GGUF file (no header, a file smaller than its header,
// a hash that is not 64 hex digits, tensor hashes that are not 32 bytes), or empty. Whether the
// header parses, and holds as many tensors as hashes, is the GGUF reader's to say.
std::string malformed(const ModelManifestReply& manifest);
// The same for a HoldPrefix call.
std::string malformed(const HoldPrefixRequest& request);

}  // namespace strata::rpc
