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
  if (open_) {
    open_->context->TryCancel();
    open_->calls->Finish();
  }
}

void RemoteStage::watch() {
  std::unique_lock lock(watch_mutex_);
  while (!stopping_) {
    const auto due = sent_.empty() || late_ ? std::chrono::steady_clock::time_point::max() : sent_.front().due;
    if (std::chrono::steady_clock::now() >= due) {
      late_ = true;
      if (open_) open_->context->TryCancel();
      continue;
    }
    if (due == std::chrono::steady_clock::time_point::max()) {
      watch_wake_.wait(lock);
    } else {
      watch_wake_.wait_until(lock, due);
    }
  }
}

void RemoteStage::cancel() {
  std::lock_guard lock(watch_mutex_);
  cancelled_ = true;
  if (open_) open_->context->TryCancel();
  for (grpc::ClientContext* call : unary_calls_) call->TryCancel();
}

std::shared_ptr<RemoteStage::Stream> RemoteStage::open_stream() {
  auto stream = std::make_shared<Stream>();
  stream->context = std::make_unique<grpc::ClientContext>();
  caller_.key->sign(*stream->context, caller_.node_id, "Forward");
  // Opening the stream waits while the channel connects: outside the lock, so that cancel()
  // (whose TryCancel also ends a stream not yet open) never waits for an unreachable node.
  {
    std::lock_guard lock(watch_mutex_);
    if (cancelled_) throw engine::StageLost("node " + peer_id_ + "'s stage was replaced by a new placement");
    open_ = stream;
  }
  stream->calls = stub_->Forward(stream->context.get());
  return stream;
}

std::exception_ptr RemoteStage::end_stream(const std::shared_ptr<Stream>& stream, const ChainFailure* failure) {
  bool late = false;
  bool cancelled = false;
  {
    std::lock_guard lock(watch_mutex_);
    late = late_;
    late_ = false;
    cancelled = cancelled_;
    owed_ = sent_.empty() ? 0 : sent_.size() - 1;
    sent_.clear();
    if (open_ == stream) open_.reset();
  }
  grpc::Status status;
  {
    std::lock_guard lock(write_mutex_);
    stream->calls->WritesDone();
    ForwardReply unread;
    while (stream->calls->Read(&unread)) {
    }
    status = stream->calls->Finish();
  }
  const auto lost = [&](const std::string& why, const std::string& node, bool unreachable) {
    if (caller_.on_lost) caller_.on_lost(node, unreachable);
    return std::make_exception_ptr(engine::StageLost(why, node, unreachable));
  };
  std::exception_ptr error;
  if (cancelled) {
    error = std::make_exception_ptr(engine::StageLost("node " + peer_id_ + "'s stage was replaced by a new placement"));
  } else if (failure != nullptr) {
    // A stage further down the chain: the node that failed it is the one to blame.
    error = failure->lost() ? lost(failure->error(), failure->node_id(), failure->unreachable())
                            : std::make_exception_ptr(std::runtime_error(failure->error()));
  } else {
    const std::string why = late ? "no reply within its deadline" : status.ok() ? "the stream closed" : status.error_message();
    const std::string message = "node " + peer_id_ + " failed the batch: " + why;
    // A batch the stage refused as malformed, or failed computing, would fail anywhere; any
    // other end of the stream (a peer gone, late, or moved to another placement) loses only
    // the state the stage held.
    if (!late && (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                  status.error_code() == grpc::StatusCode::INTERNAL)) {
      error = std::make_exception_ptr(std::runtime_error(message));
    } else {
      error = lost(message, peer_id_, !late && status.error_code() == grpc::StatusCode::UNAVAILABLE);
    }
  }
  std::lock_guard lock(watch_mutex_);
  broken_ = error;
  return error;
}

engine::StageOutput RemoteStage::forward(const engine::StageBatch& batch) {
  send(batch);
  return receive();
}

void RemoteStage::send(const engine::StageBatch& batch) {
  ForwardRequest request;
  request.set_sender_id(caller_.node_id);
  request.set_epoch(caller_.epoch);
  to_message(batch, request);
  // A chain's batch passes through every stage of it, each with its own deadline to the next:
  // theirs end first, so that the stage that is late is the one blamed.
  const auto stages = static_cast<int64_t>(1 + batch.then.size());
  const auto deadline = (base_deadline_ + per_row_ * static_cast<int64_t>(batch.tokens.size())) * stages;

  if (caller_.link_delay.count() > 0) std::this_thread::sleep_for(caller_.link_delay);
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard lock(watch_mutex_);
    if (cancelled_) throw engine::StageLost("node " + peer_id_ + "'s stage was replaced by a new placement");
    stream = open_;
  }
  if (!stream) stream = open_stream();
  {
    // Counted on the stream it goes out on, unless that one ended meanwhile: then its receive
    // fails with the others.
    std::lock_guard lock(watch_mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (open_ == stream) {
      sent_.push_back({now, now + deadline});
    } else {
      ++owed_;
      return;
    }
  }
  watch_wake_.notify_all();
  std::lock_guard lock(write_mutex_);
  stream->calls->Write(request);  // a stream that failed fails the batch's receive
}

engine::StageOutput RemoteStage::receive() {
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard lock(watch_mutex_);
    if (owed_ > 0) {
      --owed_;
      std::rethrow_exception(broken_);
    }
    stream = open_;
  }
  if (!stream) throw std::logic_error("a batch is received before it was sent");
  ForwardReply reply;
  const bool read = stream->calls->Read(&reply);
  const std::string why = read ? malformed(reply) : std::string();
  if (!read || (why.empty() && reply.has_failure())) {
    std::rethrow_exception(end_stream(stream, read ? &reply.failure() : nullptr));
  }
  {
    std::lock_guard lock(watch_mutex_);
    round_trips_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - sent_.front().at).count());
    sent_.pop_front();
  }
  watch_wake_.notify_all();
  if (!why.empty()) throw std::runtime_error("node " + peer_id_ + " sent a malformed reply: " + why);
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
  const int positions = hold(id, capacity, tokens).positions();
  if (positions < 0 || static_cast<size_t>(positions) > tokens.size() || positions % model::kKvBlock != 0) {
    throw std::runtime_error("node " + peer_id_ + " says it holds " + std::to_string(positions) + " positions of a prefix of " +
                             std::to_string(tokens.size()));
  }
  return positions;
}

model::KvBlockCounts RemoteStage::kv_blocks() {
  const HoldPrefixReply reply = hold(0, 0, {});
  if (reply.pool_blocks() < 0 || reply.window_pool_blocks() < 0) {
    throw std::runtime_error("node " + peer_id_ + " says its KV pools have a negative size");
  }
  return {reply.pool_blocks(), reply.window_pool_blocks()};
}

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
