// A pipeline stage on another node, reached over its node service. A failed or late call
// becomes an exception for the batch's requests, never a hang.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/stage.h"
#include "rpc/auth.h"
#include "node.grpc.pb.h"

namespace strata::rpc {

// Who calls, for which placement, and with which key.
struct Caller {
  std::string node_id;
  uint64_t epoch = 0;
  std::shared_ptr<ClusterKey> key;
  // Tests only: added before every call, as a LAN link's latency would be (netem, which
  // would add it on the wire, is not available everywhere).
  std::chrono::milliseconds link_delay{0};
};

class RemoteStage final : public engine::Stage {
 public:
  // `base_deadline` bounds a call; every input row adds `per_row` (prompt chunks take longer).
  RemoteStage(std::string peer_id, std::shared_ptr<grpc::Channel> channel, Caller caller,
              std::chrono::milliseconds base_deadline = std::chrono::seconds(5),
              std::chrono::milliseconds per_row = std::chrono::milliseconds(100));

  std::vector<float> forward(const engine::StageBatch& batch) override;
  void release(std::span<const engine::SequenceId> ids) override;

 private:
  std::string peer_id_;
  std::unique_ptr<Node::Stub> stub_;
  Caller caller_;
  std::chrono::milliseconds base_deadline_;
  std::chrono::milliseconds per_row_;
};

}  // namespace strata::rpc
