// A node as the cluster tests' peers describe themselves in their Hellos: idle, of this build's
// protocol, running the model of hash `model` ("dreams"), with 1 GiB and 1 GB/s.
#pragma once

#include <string>

#include "cluster_types/node_info.h"
#include "rpc/messages.h"

namespace strata::cluster {

inline const std::string kFixtureModel(64, 'a');

inline cluster_types::NodeInfo node(const std::string& id, const std::string& address,
                                    const std::string& model = kFixtureModel) {
  cluster_types::NodeInfo info;
  info.node_id = id;
  info.node_address = address;
  info.api_address = "127.0.0.1:8080";
  info.instance = id + "-instance";
  info.started_unix_ms = 1000;
  info.protocol_version = rpc::kProtocolVersion;
  info.model_hash = model;
  info.model_name = "dreams";
  info.state = "idle";
  info.memory_bytes = uint64_t{1} << 30;
  info.weight_bytes_per_second = 1e9;
  return info;
}

}  // namespace strata::cluster
