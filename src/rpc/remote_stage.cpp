#include "rpc/remote_stage.h"

#include <chrono>
#include <stdexcept>
#include <thread>

#include "metrics/metrics.h"
#include "rpc/messages.h"

namespace strata::rpc {
namespace {

metrics::Histogram& round_trips_to(const std::string& peer) {
  return metrics::process_registry().histogram(
      "strata_link_round_trip_seconds",
      "From sending a batch's activations to a peer's stage to its reply, the stage's compute included.",
      metrics::seconds_buckets(), {{"peer", peer}});
}

// Releases sent without waiting, by every remote stage of the process, not yet answered. Never
// destroyed: a release thread may still end after the process began to exit.
struct PendingReleases {
  std::mutex mutex;
  std::condition_variable done;
  int count = 0;
};
PendingReleases& pending_releases() {
  static auto* pending = new PendingReleases;
  return *pending;
}

}  // namespace

RemoteStage::RemoteStage(std::string peer_id, std::shared_ptr<grpc::Channel> channel, Caller caller,
                         engine::StageLayers layers, std::chrono::milliseconds base_deadline,
                         std::chrono::milliseconds per_row)
    : peer_id_(std::move(peer_id)),
      channel_(std::move(channel)),
      stub_(Node::NewStub(channel_)),
      round_trips_(round_trips_to(peer_id_)),
      caller_(std::move(caller)),
      layers_(layers),
      base_deadline_(base_deadline),
      per_row_(per_row),
      watchdog_([this] { watch(); }) {}

RemoteStage::~RemoteStage() {
  {
    std::lock_guard lock(watch_mutex_);
    stopping_ = true;
  }
  watch_wake_.notify_all();
  watchdog_.join();
  if (stream_) {
    context_->TryCancel();
    stream_->Finish();
  }
}

void RemoteStage::watch() {
  std::unique_lock lock(watch_mutex_);
  while (!stopping_) {
    if (std::chrono::steady_clock::now() >= reply_due_) {
      late_ = true;
      reply_due_ = std::chrono::steady_clock::time_point::max();
      context_->TryCancel();
      continue;
    }
    if (reply_due_ == std::chrono::steady_clock::time_point::max()) {
      watch_wake_.wait(lock);
    } else {
      watch_wake_.wait_until(lock, reply_due_);
    }
  }
}

void RemoteStage::cancel() {
  std::lock_guard lock(watch_mutex_);
  cancelled_ = true;
  if (context_) context_->TryCancel();
  for (grpc::ClientContext* call : unary_calls_) call->TryCancel();
}

void RemoteStage::fail(const std::string& what) {
  bool late = false;
  bool cancelled = false;
  {
    std::lock_guard lock(watch_mutex_);
    reply_due_ = std::chrono::steady_clock::time_point::max();
    late = late_;
    late_ = false;
    cancelled = cancelled_;
  }
  stream_->WritesDone();
  const grpc::Status status = stream_->Finish();
  {
    std::lock_guard lock(watch_mutex_);
    stream_.reset();
    context_.reset();
  }
  if (cancelled) throw engine::StageLost("node " + peer_id_ + "'s stage was replaced by a new placement");
  std::string why = status.ok() ? what : status.error_message();
  if (late) why = "no reply within its deadline";
  const std::string message = "node " + peer_id_ + " failed the batch: " + why;
  // A batch the stage refused as malformed, or failed computing, would fail anywhere; any
  // other end of the stream (a peer gone, late, or moved to another placement) loses only
  // the state the stage held.
  if (!late && (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                status.error_code() == grpc::StatusCode::INTERNAL)) {
    throw std::runtime_error(message);
  }
  if (caller_.on_lost) caller_.on_lost(peer_id_, !late && status.error_code() == grpc::StatusCode::UNAVAILABLE);
  throw engine::StageLost(message);
}

engine::StageOutput RemoteStage::forward(const engine::StageBatch& batch) {
  ForwardRequest request;
  request.set_sender_id(caller_.node_id);
  request.set_epoch(caller_.epoch);
  to_message(batch, request);
  const auto rows = static_cast<int64_t>(batch.tokens.size());

  if (caller_.link_delay.count() > 0) std::this_thread::sleep_for(caller_.link_delay);
  if (!stream_) {
    auto context = std::make_unique<grpc::ClientContext>();
    caller_.key->sign(*context, caller_.node_id, "Forward");
    {
      std::lock_guard lock(watch_mutex_);  // the watchdog and cancel() read context_
      if (cancelled_) throw engine::StageLost("node " + peer_id_ + "'s stage was replaced by a new placement");
      context_ = std::move(context);
    }
    // Opening the stream waits while the channel connects: outside the lock, so that cancel()
    // (whose TryCancel also ends a stream not yet open) never waits for an unreachable node.
    auto stream = stub_->Forward(context_.get());
    std::lock_guard lock(watch_mutex_);
    stream_ = std::move(stream);
  }
  {
    std::lock_guard lock(watch_mutex_);
    reply_due_ = std::chrono::steady_clock::now() + base_deadline_ + per_row_ * rows;
  }
  watch_wake_.notify_all();
  ForwardReply reply;
  const auto sent = std::chrono::steady_clock::now();
  if (!stream_->Write(request)) fail("the stream closed");
  if (!stream_->Read(&reply)) fail("the stream closed");
  round_trips_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count());
  {
    std::lock_guard lock(watch_mutex_);
    reply_due_ = std::chrono::steady_clock::time_point::max();
  }
  if (const std::string why = malformed(reply); !why.empty()) {
    throw std::runtime_error("node " + peer_id_ + " sent a malformed reply: " + why);
  }
  return from_message(reply);
}

HoldPrefixReply RemoteStage::hold(engine::SequenceId id, int capacity, std::span<const engine::Token> tokens) {
  HoldPrefixRequest request;
  request.set_sender_id(caller_.node_id);
  request.set_epoch(caller_.epoch);
  request.set_sequence_id(id);
  request.set_capacity(capacity);
  request.mutable_tokens()->Add(tokens.begin(), tokens.end());
  grpc::ClientContext context;
  prepare_unary(context, "HoldPrefix");
  HoldPrefixReply reply;
  const grpc::Status status = stub_->HoldPrefix(&context, request, &reply);
  if (!status.ok()) throw engine::StageLost("node " + peer_id_ + " did not answer: " + status.error_message());
  return reply;
}

int RemoteStage::hold_prefix(engine::SequenceId id, int capacity, std::span<const engine::Token> tokens) {
  return hold(id, capacity, tokens).positions();
}

int RemoteStage::kv_blocks() { return hold(0, 0, {}).pool_blocks(); }

void RemoteStage::release(std::span<const engine::SequenceId> ids) {
  if (ids.empty()) return;  // no call, which a silent node would hold until its deadline
  ReleaseRequest request;
  request.set_sender_id(caller_.node_id);
  request.set_epoch(caller_.epoch);
  request.mutable_sequence_ids()->Add(ids.begin(), ids.end());
  auto context = std::make_unique<grpc::ClientContext>();
  prepare_unary(*context, "Release");
  bool cancelled = false;
  {
    // Checked and entered at once: a release started before cancel() is ended by it rather
    // than left to wait out its deadline.
    std::lock_guard lock(watch_mutex_);
    cancelled = cancelled_;
    if (!cancelled) unary_calls_.insert(context.get());
  }
  if (!cancelled) {
    ReleaseReply reply;
    const grpc::Status status = stub_->Release(context.get(), request, &reply);
    {
      std::lock_guard lock(watch_mutex_);
      unary_calls_.erase(context.get());
    }
    if (!status.ok()) throw std::runtime_error("node " + peer_id_ + " did not release: " + status.error_message());
    return;
  }
  // A replaced pipeline's stage: its state is of no more use, and a node that is gone must not
  // hold the pipeline's end for a deadline. The call goes on a thread of its own (gRPC's
  // callback API crashed at exit in Debian's 1.51), with its own stub on the same channel.
  PendingReleases& pending = pending_releases();
  std::lock_guard lock(pending.mutex);  // counted once the thread exists, which it waits for
  std::thread([channel = channel_, context = std::move(context), request = std::move(request), &pending]() mutable {
    {
      ReleaseReply reply;
      Node::NewStub(channel)->Release(context.get(), request, &reply);
    }
    // gRPC is let go before the count says so: a process that exits once it is 0 finds no
    // call still tearing down.
    context.reset();
    channel.reset();
    std::lock_guard lock(pending.mutex);
    --pending.count;
    pending.done.notify_all();
  }).detach();
  ++pending.count;
}

void RemoteStage::wait_for_releases(std::chrono::milliseconds limit) {
  PendingReleases& pending = pending_releases();
  std::unique_lock lock(pending.mutex);
  pending.done.wait_for(lock, limit, [&] { return pending.count == 0; });
}

void RemoteStage::prepare_unary(grpc::ClientContext& context, const char* method) const {
  context.set_deadline(std::chrono::system_clock::now() + base_deadline_);
  caller_.key->sign(context, caller_.node_id, method);
}

namespace {

// A call that moves state fails as a lost stage when the node cannot be reached, so that the
// engine computes the sequence again, and as a plain error when the node refused it.
[[noreturn]] void kv_call_failed(const std::string& peer_id, const char* what, const grpc::Status& status) {
  const std::string message = "node " + peer_id + " " + what + ": " + status.error_message();
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) throw std::runtime_error(message);
  throw engine::StageLost(message);
}

}  // namespace

engine::LayerKv RemoteStage::read_kv(engine::SequenceId id, int layer) {
  ReadKvRequest request;
  request.set_sender_id(caller_.node_id);
  request.set_epoch(caller_.epoch);
  request.set_sequence_id(id);
  request.set_layer(layer);
  grpc::ClientContext context;
  prepare_unary(context, "ReadKv");
  LayerKv reply;
  const grpc::Status status = stub_->ReadKv(&context, request, &reply);
  if (!status.ok()) kv_call_failed(peer_id_, "did not hand over state", status);
  if (const std::string why = malformed(reply); !why.empty() || reply.sequence_id() != id || reply.layer() != layer) {
    throw std::runtime_error("node " + peer_id_ + " handed over malformed state: " + (why.empty() ? "another sequence's" : why));
  }
  return from_message(reply);
}

void RemoteStage::write_kv(const engine::LayerKv& kv) {
  WriteKvRequest request;
  request.set_sender_id(caller_.node_id);
  request.set_epoch(caller_.epoch);
  to_message(kv, *request.mutable_kv());
  grpc::ClientContext context;
  prepare_unary(context, "WriteKv");
  WriteKvReply reply;
  const grpc::Status status = stub_->WriteKv(&context, request, &reply);
  if (!status.ok()) kv_call_failed(peer_id_, "did not take over state", status);
}

}  // namespace strata::rpc
