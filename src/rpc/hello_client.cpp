#include "rpc/hello_client.h"

#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/cluster_messages.h"
#include "rpc/messages.h"
#include "node.grpc.pb.h"

namespace strata::rpc {
namespace {

HelloFailure failure_of(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK: return HelloFailure::None;
    case grpc::StatusCode::UNAVAILABLE:
      return is_handshake_failure(status.error_message()) ? HelloFailure::HandshakeRefused : HelloFailure::Unreachable;
    case grpc::StatusCode::ALREADY_EXISTS: return HelloFailure::IdTaken;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::FAILED_PRECONDITION: return HelloFailure::Refused;
    default: return HelloFailure::Other;
  }
}

}  // namespace

HelloOutcome say_hello(const PeerChannel& channel, const cluster_types::Hello& hello, const std::string& self_id,
                       const ClusterKey& key, std::chrono::milliseconds deadline) {
  auto stub = Node::NewStub(channel.transport());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  key.sign(context, self_id, "Hello");
  HelloOutcome outcome;
  HelloReply reply;
  const auto sent = std::chrono::steady_clock::now();
  const grpc::Status status = stub->Hello(&context, to_hello_request(hello), &reply);
  outcome.rtt_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent).count();
  outcome.failure = failure_of(status);
  outcome.message = status.error_message();
  if (outcome.failure != HelloFailure::None) return outcome;
  if (std::string why = malformed(reply); !why.empty()) {
    outcome.failure = HelloFailure::Malformed;
    outcome.message = std::move(why);
    return outcome;
  }
  outcome.reply = from_message(reply);
  return outcome;
}

}  // namespace strata::rpc
