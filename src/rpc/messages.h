// Checks of what peers send, before any of it is used. Kept apart from the service so that a
// fuzzer can drive them with nothing but the generated message code.
#pragma once

#include <string>

#include "node.pb.h"

namespace strata::rpc {

// Why a batch cannot be run (no sequences, counts that do not add up, impossible positions or
// capacities, too many rows), or empty when it is well-formed.
std::string malformed(const ForwardRequest& request);
// The same for a HoldPrefix call.
std::string malformed(const HoldPrefixRequest& request);

}  // namespace strata::rpc
