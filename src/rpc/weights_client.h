// The calling side of the weights' calls, for a node that has no model file: the model's
// manifest from whichever node has it, and a tensor's bytes from a peer that holds it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cluster_types/model_manifest.h"
#include "rpc/peer_channel.h"
#include "node.pb.h"

namespace strata::rpc {

// Streams the bytes of `request`'s tensor from its offset to `chunk` (offset within the
// tensor, bytes) in order until the end, or until `chunk` returns false, from the node behind
// `channel`, called as node `self_id` under `key`. Returns why it failed ("stopped" when
// `chunk` stopped it), or empty.
std::string fetch_tensor(const PeerChannel& channel, const cluster_types::TensorRequest& request,
                         const std::string& self_id, const ClusterKey& key,
                         const std::function<bool(uint64_t offset, std::span<const uint8_t>)>& chunk);

// Asks the nodes `addresses()` names, in turn, for the manifest of the model they run, every
// second until one answers; `log` hears whom it waits for now and then.
cluster_types::ModelManifest fetch_manifest(const std::function<std::vector<std::string>()>& addresses,
                                  const std::string& self_id, const ClusterKey& key,
                                  const std::function<void(const std::string&)>& log);

}  // namespace strata::rpc
