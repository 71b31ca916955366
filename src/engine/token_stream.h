// One request's output on its way from a scheduler, which calls a request's callbacks on its
// own thread, to one reader on another thread that waits for it: the items in the order they
// came, an end, the reader's cancellation (which the scheduler hears at the request's next
// token, or between its steps), and waiting with a deadline, so that the reader can look at
// other things meanwhile (its client's connection). The node service forwards the TokenEvents of
// a request another node relayed to it, and that node hands the same events to its own
// callbacks (deliver); the API turns each token into text on the scheduler's thread, so that a
// stop string ends the request at the token that completes it, and queues the text.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "engine/generator.h"

namespace strata::engine {

template <typename Item>
class TokenStream {
 public:
  // Queues `item`, unless the stream has ended; `last`: the stream ends with it.
  void push(Item item, bool last = false) {
    {
      std::lock_guard lock(mutex_);
      if (ended_) return;
      items_.push_back(std::move(item));
      ended_ = last;
    }
    changed_.notify_all();
  }

  struct Taken {
    std::vector<Item> items;  // in the order they were pushed
    bool ended = false;       // the last of them ends the stream (or it had ended before)
  };
  // Waits until items are queued or the stream has ended, at most until `deadline`, and takes
  // every item queued.
  Taken take(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    changed_.wait_until(lock, deadline, [&] { return !items_.empty() || ended_; });
    return {std::exchange(items_, {}), ended_};
  }

  // The reader wants no more: the request's callbacks say so to the scheduler.
  void cancel() {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
  }
  bool cancelled() const {
    std::lock_guard lock(mutex_);
    return cancelled_;
  }
  bool ended() const {
    std::lock_guard lock(mutex_);
    return ended_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Item> items_;
  bool ended_ = false;
  bool cancelled_ = false;
};

// What a scheduler tells of a request, one event per callback of RequestCallbacks.
struct RequestStarted {};  // on_started
struct PooledEmbedding {   // on_embedding
  std::vector<float> vector;
};
struct RequestFinished {  // on_finish: the last event
  FinishReason reason = FinishReason::Stop;
  std::string error;
};
struct RequestPassedOn {  // on_passed_on: the last event, instead of RequestFinished
  HeldState held;
};
using TokenEvent = std::variant<RequestStarted, GeneratedToken, PooledEmbedding, RequestFinished, RequestPassedOn>;

// The event is a request's last.
bool ends_request(const TokenEvent& event);

// Callbacks that push what the scheduler says of a request onto `stream` as TokenEvents, the
// stream ending with the request; on_token and cancelled() tell the scheduler once the
// stream's reader has cancelled.
RequestCallbacks queue_events(std::shared_ptr<TokenStream<TokenEvent>> stream);

// Calls the callback of `callbacks` that `event` stands for, where one is set; returns
// on_token's answer for a token (whether the request goes on), true for the others. A
// RequestPassedOn, to callbacks without on_passed_on to take it, finishes the request as Lost
// with `passed_on_error`.
bool deliver(const TokenEvent& event, RequestCallbacks& callbacks, const std::string& passed_on_error);

}  // namespace strata::engine
