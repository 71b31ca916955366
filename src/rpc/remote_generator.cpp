#include "rpc/remote_generator.h"

#include <atomic>
#include <functional>
#include <optional>
#include <thread>

#include "rpc/messages.h"

namespace strata::rpc {

struct RemoteGenerator::Call {
  grpc::ClientContext context;
  std::unique_ptr<Node::Stub> stub;
  std::unique_ptr<grpc::ClientReader<GenerateEvent>> reader;
  // The caller's, until the call is cancelled or ends (under the generator's mutex); or empty.
  std::function<bool()> cancelled;
  std::thread thread;
  std::atomic<bool> ended{false};
};

namespace {

GenerateRequest to_wire(const std::string& sender, const engine::GenerationRequest& r) {
  GenerateRequest out;
  out.set_sender_id(sender);
  out.mutable_prompt()->Add(r.prompt.begin(), r.prompt.end());
  out.set_max_tokens(r.max_tokens);
  to_message(r.sampling, *out.mutable_sampling());
  out.set_logprobs(r.logprobs);
  out.set_top_logprobs(r.top_logprobs);
  out.set_resumed_after(r.resumed_after);
  if (r.held) to_message(*r.held, *out.mutable_held());
  out.set_request_id(r.request_id);
  out.set_grammar(r.grammar);
  out.set_embedding(static_cast<int32_t>(r.embedding));
  return out;
}

engine::GeneratedToken from_wire(const GenerateEvent& e) {
  engine::GeneratedToken t;
  t.token = e.token();
  t.logprob = e.logprob();
  t.end_of_generation = e.end_of_generation();
  t.cached_tokens = e.cached_tokens();
  t.drafts_accepted = e.drafts_accepted();
  t.drafts_rejected = e.drafts_rejected();
  for (const TokenLogprob& alt : e.top()) t.top.push_back({alt.token(), alt.logprob()});
  return t;
}

}  // namespace

RemoteGenerator::Ending RemoteGenerator::relay(Call& call, engine::RequestCallbacks& callbacks) {
  GenerateEvent event;
  bool cancelled = false;
  while (call.reader->Read(&event)) {
    if (event.kind() == GenerateEvent::FINISHED) {
      call.reader->Finish();
      if (event.has_passed_on()) return {from_message(event.passed_on())};
      return {std::nullopt, static_cast<engine::FinishReason>(event.finish_reason()), event.error()};
    }
    if (cancelled) continue;
    bool keep_going = true;
    try {
      if (event.kind() == GenerateEvent::STARTED && callbacks.on_started) callbacks.on_started();
      if (event.kind() == GenerateEvent::TOKEN && callbacks.on_token) keep_going = callbacks.on_token(from_wire(event));
      if (event.kind() == GenerateEvent::EMBEDDING && callbacks.on_embedding) {
        callbacks.on_embedding({event.embedding().begin(), event.embedding().end()});
      }
    } catch (const std::exception& e) {
      call.context.TryCancel();
      call.reader->Finish();
      return {std::nullopt, engine::FinishReason::Error, std::string("callback failed: ") + e.what()};
    }
    if (!keep_going) {
      cancelled = true;
      call.context.TryCancel();
    }
  }
  const grpc::Status status = call.reader->Finish();
  if (cancelled || status.error_code() == grpc::StatusCode::CANCELLED) return {std::nullopt, engine::FinishReason::Cancelled};
  return {std::nullopt, engine::FinishReason::Lost, std::string(kSchedulerLost) + status.error_message()};
}

void RemoteGenerator::end(Call& call, engine::RequestCallbacks& callbacks, const Ending& ending) {
  {
    // Its cancelled() is not asked once it has ended.
    std::lock_guard lock(mutex_);
    call.cancelled = nullptr;
  }
  if (ending.passed_on && callbacks.on_passed_on) {
    callbacks.on_passed_on(*ending.passed_on);
  } else if (ending.passed_on && callbacks.on_finish) {
    callbacks.on_finish(engine::FinishReason::Lost, std::string(kSchedulerLost) + "it no longer leads");
  } else if (callbacks.on_finish) {
    callbacks.on_finish(ending.reason, ending.error);
  }
}

RemoteGenerator::RemoteGenerator(Caller caller)
    : caller_(std::move(caller)), watcher_([this] { watch_cancellations(); }) {}

void RemoteGenerator::watch_cancellations() {
  std::unique_lock lock(mutex_);
  while (!stop_.wait_for(lock, engine::kCancelCheck, [&] { return stopping_; })) {
    for (const auto& call : calls_) {
      if (call->cancelled && call->cancelled()) {
        call->cancelled = nullptr;
        call->context.TryCancel();
      }
    }
  }
}

RemoteGenerator::~RemoteGenerator() { shutdown(); }

bool RemoteGenerator::submit(const PeerChannel& channel, engine::GenerationRequest request,
                             engine::RequestCallbacks callbacks) {
  reap();
  auto call = std::make_unique<Call>();
  call->cancelled = callbacks.cancelled;
  call->stub = Node::NewStub(channel.transport());
  caller_.key->sign(call->context, caller_.node_id, "Generate");
  // Waiting for the first event only: the leader queues the request or says why not.
  call->context.set_wait_for_ready(false);
  call->reader = call->stub->Generate(&call->context, to_wire(caller_.node_id, request));
  GenerateEvent first;
  if (!call->reader->Read(&first)) {
    const grpc::Status status = call->reader->Finish();
    switch (status.error_code()) {
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        return false;
      case grpc::StatusCode::INVALID_ARGUMENT:
        throw std::invalid_argument(status.error_message());
      default:
        throw engine::Unavailable("the cluster's scheduler cannot take the request: " + status.error_message());
    }
  }
  std::lock_guard lock(mutex_);
  if (stopping_) {
    call->context.TryCancel();
    call->reader->Finish();
    return false;
  }
  // Started under the lock, so that reap() never sees the call before its thread is stored.
  Call* raw = call.get();
  raw->thread = std::thread([this, raw, callbacks = std::move(callbacks)]() mutable {
    end(*raw, callbacks, relay(*raw, callbacks));
    raw->ended = true;
  });
  calls_.push_back(std::move(call));
  return true;
}

void RemoteGenerator::reap() {
  std::list<std::unique_ptr<Call>> ended;
  {
    std::lock_guard lock(mutex_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if ((*it)->ended) {
        ended.push_back(std::move(*it));
        it = calls_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& call : ended) call->thread.join();
}

void RemoteGenerator::shutdown() {
  std::list<std::unique_ptr<Call>> calls;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    calls.swap(calls_);
  }
  stop_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  for (auto& call : calls) call->context.TryCancel();
  for (auto& call : calls) {
    if (call->thread.joinable()) call->thread.join();
  }
}

}  // namespace strata::rpc
