// Where a request runs: on this node's scheduler when it leads, else on the leader's, over its
// node service; either way as a request that outlives its scheduler (resumable_request.h),
// which goes on at the next one when that is lost. It waits up to the startup wait for the
// cluster to serve. The requests of the node's own API are counted until they end, so that a
// node that leaves lets them finish first, and refused once it leaves.
//
// Its own lock guards the count; it calls its node without it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "cluster/resumable_request.h"
#include "engine/generator.h"
#include "rpc/peer_channel.h"
#include "rpc/remote_generator.h"

namespace strata::cluster {

using RouteClock = std::chrono::steady_clock;

// Where a request goes now: this node's scheduler, or else the leader's node service.
struct Route {
  std::shared_ptr<engine::Generator> local;
  rpc::PeerChannel leader;
};

struct RouterOptions {
  std::string node_id;
  std::chrono::milliseconds startup_wait{60'000};
  // Waits until `deadline` for the cluster to serve; throws engine::Unavailable when it cannot
  // now (the node stops, takes no part, the model does not fit) or by the deadline.
  std::function<Route(RouteClock::time_point deadline)> route;
  // Waits until the node's state changes, or `deadline`; false at the deadline.
  std::function<bool(RouteClock::time_point deadline)> wait_for_change;
  // The count of the API's requests fell.
  std::function<void()> on_client_done;
  std::function<void(const std::string&)> log;
};

class RequestRouter {
 public:
  // `caller`: how this node calls the leader's scheduler.
  RequestRouter(rpc::Caller caller, RouterOptions options);

  // A request of this node's API: counted until it ends; refused (engine::Unavailable) once
  // the node leaves.
  bool submit_for_client(engine::GenerationRequest request, engine::RequestCallbacks callbacks);
  // Generator::submit's contract, at the scheduler the route names.
  bool submit(engine::GenerationRequest request, engine::RequestCallbacks callbacks);
  // The node leaves: its API's requests are refused from now on.
  void close_to_clients();
  // The API's requests in flight.
  int client_requests() const;
  // Ends the requests relayed to the leader; returns once each has finished.
  void shutdown();

 private:
  RouterOptions options_;
  rpc::RemoteGenerator remote_;
  // Where a request whose scheduler was lost goes on: to whichever scheduler serves next.
  const Resubmit resubmit_;
  mutable std::mutex mutex_;
  bool closed_ = false;
  int client_requests_ = 0;
};

}  // namespace strata::cluster
