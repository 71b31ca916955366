// Runs requests that entered at this node on the leader's scheduler, over the leader's node
// service: tokens stream back as the leader samples them. When the caller's on_token returns
// false, or its cancelled() says so (looked at every engine::kCancelCheck, as tokens may not flow: the
// request waits for a new placement), the call is cancelled, and the leader drops the request.
#pragma once

#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "engine/generator.h"
#include "engine/token_stream.h"
#include "rpc/peer_channel.h"
#include "rpc/remote_stage.h"

namespace strata::rpc {

// How the error of a request whose scheduler was lost mid-way (FinishReason::Lost) begins.
inline constexpr std::string_view kSchedulerLost = "the node running the request was lost: ";

class RemoteGenerator {
 public:
  explicit RemoteGenerator(Caller caller);
  ~RemoteGenerator();  // shutdown()

  // Generator::submit's contract, on the scheduler behind `channel`; throws
  // engine::Unavailable when it cannot be reached or has no placement.
  bool submit(const PeerChannel& channel, engine::GenerationRequest request,
              engine::RequestCallbacks callbacks);
  // Cancels the calls in flight and waits until each has called its on_finish.
  void shutdown();

 private:
  struct Call;
  // Reads the rest of an accepted call's stream into its callbacks; returns its end: the
  // request's last event, or how the stream broke.
  static engine::TokenEvent relay(Call& call, engine::RequestCallbacks& callbacks);
  // Stops watching the call, then tells its callbacks how it ended.
  void end(Call& call, engine::RequestCallbacks& callbacks, const engine::TokenEvent& ending);
  void reap();  // joins the threads of calls that have ended
  void watch_cancellations();

  Caller caller_;
  std::mutex mutex_;
  std::condition_variable stop_;
  std::list<std::unique_ptr<Call>> calls_;
  bool stopping_ = false;
  std::thread watcher_;  // last: it uses everything above
};

}  // namespace strata::rpc
