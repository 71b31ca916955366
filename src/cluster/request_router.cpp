#include "cluster/request_router.h"

namespace strata::cluster {

RequestRouter::RequestRouter(rpc::Caller caller, RouterOptions options)
    : options_(std::move(options)),
      remote_(std::move(caller)),
      resubmit_([this](engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
        return submit(std::move(request), std::move(callbacks));
      }) {}

bool RequestRouter::submit_for_client(engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) {
      throw engine::Unavailable("node " + options_.node_id + " is leaving the cluster: send requests to another node",
                                1);
    }
    ++client_requests_;
  }
  const auto ended = [this] {
    {
      std::lock_guard lock(mutex_);
      --client_requests_;
    }
    if (options_.on_client_done) options_.on_client_done();
  };
  callbacks.on_finish = [ended, on_finish = std::move(callbacks.on_finish)](engine::FinishReason reason,
                                                                            const std::string& error) {
    if (on_finish) on_finish(reason, error);
    ended();
  };
  try {
    if (submit(std::move(request), std::move(callbacks))) return true;
  } catch (const std::exception&) {
    ended();
    throw;
  }
  ended();  // refused: its callbacks are never called
  return false;
}

bool RequestRouter::submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks) {
  const auto deadline = RouteClock::now() + options_.startup_wait;
  while (true) {
    const Route route = options_.route(deadline);
    if (route.local)
      return route.local->submit(request, resumable(request, std::move(callbacks), resubmit_, options_.log));
    try {
      return remote_.submit(route.leader, request, resumable(request, callbacks, resubmit_, options_.log));
    } catch (const engine::Unavailable&) {
      // The leader is between placements: wait for the next one, up to the startup wait.
      if (!options_.wait_for_change(deadline)) throw;
    }
  }
}

void RequestRouter::close_to_clients() {
  std::lock_guard lock(mutex_);
  closed_ = true;
}

int RequestRouter::client_requests() const {
  std::lock_guard lock(mutex_);
  return client_requests_;
}

void RequestRouter::shutdown() { remote_.shutdown(); }

}  // namespace strata::cluster
