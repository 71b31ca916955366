// A pipeline stage on another node, reached over its node service through one Forward stream
// that stays open between batches. A failed or late batch becomes an exception for its
// requests, never a hang: a watchdog cancels the stream when a reply is late, and the next
// batch opens a new one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "engine/stage.h"
#include "metrics/metrics.h"
#include "rpc/auth.h"
#include "node.grpc.pb.h"

namespace strata::rpc {

// Who calls, for which placement, and with which key.
struct Caller {
  std::string node_id;
  uint64_t epoch = 0;
  std::shared_ptr<ClusterKey> key;
  // Tests only: added before every call, as a LAN link's latency would be (netem, which
  // would add it on the wire, is not available everywhere).
  std::chrono::milliseconds link_delay{0};
  // Told when a stage is lost, before the batch's StageLost is thrown: `unreachable` when its
  // connection failed (a process gone), not when it was late or moved on.
  std::function<void(const std::string& peer_id, bool unreachable)> on_lost;
};

class RemoteStage final : public engine::Stage {
 public:
  static constexpr std::chrono::milliseconds kDefaultDeadline{5000};
  // `base_deadline` bounds a call; every input row adds `per_row` (prompt chunks take longer).
  RemoteStage(std::string peer_id, std::shared_ptr<grpc::Channel> channel, Caller caller,
              engine::StageLayers layers = {}, std::chrono::milliseconds base_deadline = kDefaultDeadline,
              std::chrono::milliseconds per_row = std::chrono::milliseconds(100));
  ~RemoteStage() override;

  // send, then receive: not beside them.
  engine::StageOutput forward(const engine::StageBatch& batch) override;
  std::string chain_node() const override { return peer_id_; }
  // Every batch sent and not yet received counts against its deadline, the oldest first; one
  // whose stream fails fails them all, in order.
  void send(const engine::StageBatch& batch) override;
  engine::StageOutput receive() override;
  void release(std::span<const engine::SequenceId> ids) override;
  // Cancels the open stream; later calls throw StageLost. Releases still go out, without
  // waiting for a reply: the node may be gone, and whoever released no longer needs it.
  void cancel() override;
  // Waits up to `limit` for the replies (or deadlines) of releases sent without waiting, by
  // every remote stage of the process: one that exits waits here, so that none is cut off
  // mid-way.
  static void wait_for_releases(std::chrono::milliseconds limit);
  engine::StageLayers layers() const override { return layers_; }
  engine::LayerKv read_kv(engine::SequenceId id, int layer) override;
  void write_kv(const engine::LayerKv& kv) override;
  // Unary calls beside the batch stream: safe while a batch is in flight.
  int hold_prefix(engine::SequenceId id, int capacity, std::span<const engine::Token> tokens) override;
  model::KvBlockCounts kv_blocks() override;

 private:
  // An open Forward stream: one thread writes on it, one reads.
  struct Stream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReaderWriter<ForwardRequest, ForwardReply>> calls;
  };
  struct Sent {
    std::chrono::steady_clock::time_point at;
    std::chrono::steady_clock::time_point due;
  };
  // A unary call's deadline and signature.
  void prepare_unary(grpc::ClientContext& context, const char* method) const;
  std::shared_ptr<Stream> open_stream();
  // Ends a stream that failed, or whose node said that a stage after it failed (`failure`),
  // and says why: the error of the batch received and of every other one sent on it.
  std::exception_ptr end_stream(const std::shared_ptr<Stream>& stream, const ChainFailure* failure);
  HoldPrefixReply hold(engine::SequenceId id, int capacity, std::span<const engine::Token> tokens);
  void watch();

  std::string peer_id_;
  std::shared_ptr<grpc::Channel> channel_;  // kept for releases still on their way after this stage is gone
  std::unique_ptr<Node::Stub> stub_;
  metrics::Histogram& round_trips_;  // in the process's metrics; the link's bytes are counted by rpc/link_metrics.h
  Caller caller_;
  engine::StageLayers layers_;
  std::chrono::milliseconds base_deadline_;
  std::chrono::milliseconds per_row_;

  std::mutex watch_mutex_;  // what follows
  std::condition_variable watch_wake_;
  std::shared_ptr<Stream> open_;
  std::deque<Sent> sent_;  // on open_, not yet received
  std::exception_ptr broken_;  // of the last stream that failed
  size_t owed_ = 0;  // batches sent on it, still to receive
  bool late_ = false;  // the watchdog cancelled the stream
  bool stopping_ = false;
  bool cancelled_ = false;
  std::set<grpc::ClientContext*> unary_calls_;  // releases under way, which cancel() ends
  std::mutex write_mutex_;  // a Write, or a stream's end, at a time
  std::thread watchdog_;
};

}  // namespace strata::rpc
