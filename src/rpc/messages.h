// Checks of what peers send, before any of it is used. Kept apart from the service so that a
// fuzzer can drive them with nothing but the generated message code.
#pragma once

#include <string>

#include "node.pb.h"

namespace strata::rpc {

// Why a batch cannot be run (no sequences, counts that do not add up, impossible positions or
// capacities, too many rows), or empty when it is well-formed.
std::string malformed(const ForwardRequest& request);
// Why handed-over state cannot be taken (impossible positions or capacity, keys and values
// that are not whole rows of the same size), or empty.
std::string malformed(const LayerKv& kv);

}  // namespace strata::rpc
