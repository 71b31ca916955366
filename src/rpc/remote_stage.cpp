#include "rpc/remote_stage.h"

#include <cstring>
#include <stdexcept>
#include <thread>

namespace strata::rpc {

RemoteStage::RemoteStage(std::string peer_id, std::shared_ptr<grpc::Channel> channel, Caller caller,
                         std::chrono::milliseconds base_deadline, std::chrono::milliseconds per_row)
    : peer_id_(std::move(peer_id)),
      stub_(Node::NewStub(std::move(channel))),
      caller_(std::move(caller)),
      base_deadline_(base_deadline),
      per_row_(per_row) {}

std::vector<float> RemoteStage::forward(const engine::StageBatch& batch) {
  ForwardRequest request;
  request.set_sender_id(caller_.node_id);
  request.set_epoch(caller_.epoch);
  int rows = 0;
  for (const engine::SequenceWork& work : batch.sequences) {
    SequenceWork* w = request.add_sequences();
    w->set_sequence_id(work.id);
    w->set_first_position(work.first_position);
    w->set_token_count(work.token_count);
    w->set_capacity(work.capacity);
    rows += work.token_count;
  }
  request.mutable_tokens()->Add(batch.tokens.begin(), batch.tokens.end());
  request.set_hidden(batch.hidden.data(), batch.hidden.size() * sizeof(float));

  if (caller_.link_delay.count() > 0) std::this_thread::sleep_for(caller_.link_delay);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + base_deadline_ + per_row_ * rows);
  caller_.key->sign(context, caller_.node_id, "Forward");
  ForwardReply reply;
  const grpc::Status status = stub_->Forward(&context, request, &reply);
  if (!status.ok()) {
    throw std::runtime_error("node " + peer_id_ + " failed the batch: " + status.error_message());
  }
  const std::string& bytes = reply.rows();
  if (bytes.size() % sizeof(float) != 0) throw std::runtime_error("node " + peer_id_ + " sent a malformed reply");
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

void RemoteStage::release(std::span<const engine::SequenceId> ids) {
  ReleaseRequest request;
  request.set_sender_id(caller_.node_id);
  request.set_epoch(caller_.epoch);
  request.mutable_sequence_ids()->Add(ids.begin(), ids.end());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + base_deadline_);
  caller_.key->sign(context, caller_.node_id, "Release");
  ReleaseReply reply;
  const grpc::Status status = stub_->Release(&context, request, &reply);
  if (!status.ok()) throw std::runtime_error("node " + peer_id_ + " did not release: " + status.error_message());
}

}  // namespace strata::rpc
