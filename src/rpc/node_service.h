// The gRPC service every node runs on its node port: membership (Hello), its pipeline stage
// (Forward, which passes a batch's output on to the next stages itself when asked, and Release), on the leader, the scheduler that runs requests entering at other
// nodes (Generate), and the model's weights for nodes that have no file (ModelManifest,
// FetchTensor). Every call must pass the cluster key's check; refused calls are logged.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "cluster_types/hello.h"
#include "cluster_types/model_manifest.h"
#include "engine/generator.h"
#include "engine/stage.h"
#include "rpc/auth.h"
#include "rpc/messages.h"
#include "node.grpc.pb.h"

namespace strata::rpc {

// FetchTensor sends a tensor in chunks of this size: large enough that per-message costs
// vanish at 10 Gbit/s, small enough to keep memory flat and progress visible.
inline constexpr uint64_t kTensorChunkBytes = 1 << 20;

// A tensor's bytes, valid while `owner` lives.
struct TensorBytes {
  std::shared_ptr<const void> owner;
  std::span<const uint8_t> bytes;
};

// What the service asks of the node behind it, in the cluster's plain values: the service
// checks and converts the messages (rpc/cluster_messages.h), so that the node holds no protobuf.
class NodeHandler {
 public:
  virtual ~NodeHandler() = default;
  // `peer` is the caller's transport address ("ipv4:10.0.0.2:43122"). Fills `reply`, or returns
  // why the caller is refused (its node id is another node's); empty when answered.
  virtual std::string hello(const cluster_types::Hello& request, const std::string& peer,
                            cluster_types::Hello& reply) = 0;
  // The stage this node runs in placement `epoch`, or null with the reason in `why`.
  virtual std::shared_ptr<engine::Stage> stage(uint64_t epoch, std::string& why) = 0;
  // The stage of node `node_id` in placement `epoch`, as this node reaches it to pass a batch's
  // output on (ForwardRequest.then), or null with `why`. The default passes nothing on.
  virtual std::shared_ptr<engine::Stage> chain_stage(uint64_t epoch, const std::string& node_id, std::string& why) {
    why = "this node passes no batch on (asked for node " + node_id + " of placement " + std::to_string(epoch) + ")";
    return nullptr;
  }
  // The scheduler for requests from other nodes (this node leads), or null with `why`.
  virtual std::shared_ptr<engine::Generator> scheduler(std::string& why) = 0;
  // The description of the model this node runs, when it is `model_hash` (or that is empty);
  // otherwise nullopt with `why`.
  virtual std::optional<cluster_types::ModelManifest> manifest(const std::string& model_hash, std::string& why) = 0;
  // A tensor this node holds whole and verified, or nullopt with `why`. The service sends its
  // bytes from `request.offset` on.
  virtual std::optional<TensorBytes> tensor(const cluster_types::TensorRequest& request, std::string& why) = 0;
};

// The port asked for is another process's.
struct PortTaken : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class NodeServer {
 public:
  // Listens on host:port (0: any free port). Throws PortTaken when another process has the
  // port, std::runtime_error when it cannot bind for another reason.
  // `node_id` names it to its callers. `tensor_chunk_bytes` other than kTensorChunkBytes is for
  // tests that cut a fetch mid-tensor.
  NodeServer(NodeHandler& handler, const std::string& node_id, std::shared_ptr<ClusterKey> key,
             const std::string& host, int port, std::function<void(const std::string&)> log,
             uint64_t tensor_chunk_bytes = kTensorChunkBytes);
  ~NodeServer();
  int port() const { return port_; }
  // Ends open calls and stops listening.
  void stop();

 private:
  class Service;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace strata::rpc
