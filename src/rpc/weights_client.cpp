#include "rpc/weights_client.h"

#include <map>
#include <thread>

#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/cluster_messages.h"
#include "rpc/messages.h"
#include "node.grpc.pb.h"

namespace strata::rpc {

std::string fetch_tensor(const PeerChannel& channel, const cluster_types::TensorRequest& request,
                         const std::string& self_id, const ClusterKey& key,
                         const std::function<bool(uint64_t offset, std::span<const uint8_t>)>& chunk) {
  const auto stub = Node::NewStub(channel.transport());
  // No deadline: a tensor may take minutes on a slow link; the channel's keepalive ends the
  // call within seconds when the peer stops answering.
  grpc::ClientContext context;
  key.sign(context, self_id, "FetchTensor");
  const std::unique_ptr<grpc::ClientReader<TensorChunk>> reader = stub->FetchTensor(&context, to_message(request));
  TensorChunk message;
  while (reader->Read(&message)) {
    const std::string& data = message.data();
    if (!chunk(message.offset(), {reinterpret_cast<const uint8_t*>(data.data()), data.size()})) {
      context.TryCancel();
      while (reader->Read(&message)) {
      }
      reader->Finish();
      return "stopped";
    }
  }
  const grpc::Status status = reader->Finish();
  return status.ok() ? std::string() : status.error_message();
}

cluster_types::ModelManifest fetch_manifest(const std::function<std::vector<std::string>()>& addresses,
                                  const std::string& self_id, const ClusterKey& key,
                                  const std::function<void(const std::string&)>& log) {
  // Hashing a large model's tensors takes its holder a while the first time.
  constexpr auto kManifestDeadline = std::chrono::minutes(10);
  constexpr auto kRetry = std::chrono::seconds(1);
  constexpr int kLogEvery = 15;  // retries
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels;
  for (int round = 0;; ++round) {
    std::string problems;
    const std::vector<std::string> list = addresses();
    for (const std::string& address : list) {
      auto& channel = channels[address];
      if (!channel) channel = make_channel(address, key);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + kManifestDeadline);
      key.sign(context, self_id, "ModelManifest");
      ModelManifestReply reply;
      const grpc::Status status = Node::NewStub(channel)->ModelManifest(&context, {}, &reply);
      if (status.ok()) {
        if (const std::string why = malformed(reply); !why.empty()) {
          problems += "; " + address + ": " + why;
          continue;
        }
        log("node at " + address + " runs " + reply.model_name() + " (" + reply.model_hash().substr(0, 12) +
            "): fetching the weights of this node's layers from the cluster");
        return from_message(reply);
      }
      problems += "; " + address + ": " + status.error_message();
    }
    if (round % kLogEvery == 0) {
      log(list.empty() ? "waiting for a node that has a model (none known yet)"
                       : "waiting for a node that has a model" + problems);
    }
    // Waiting on the channels, not asleep: gRPC connects (and completes a TLS handshake) only
    // while someone polls it, and otherwise only at its backup poll, every 5 s, too seldom for
    // a connection's keepalive pings.
    const auto retry_at = std::chrono::system_clock::now() + kRetry;
    for (const auto& [address, channel] : channels) channel->WaitForConnected(retry_at);
    std::this_thread::sleep_until(retry_at);
  }
}

}  // namespace strata::rpc
