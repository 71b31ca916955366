#include "rpc/node_service.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "metrics/metrics.h"
#include "rpc/channel.h"
#include "rpc/cluster_messages.h"

namespace strata::rpc {

namespace {

engine::GenerationRequest to_engine(const GenerateRequest& r) {
  engine::GenerationRequest out;
  out.prompt.assign(r.prompt().begin(), r.prompt().end());
  out.max_tokens = r.max_tokens();
  out.sampling = from_message(r.sampling());
  out.logprobs = r.logprobs();
  out.top_logprobs = r.top_logprobs();
  out.resumed_after = r.resumed_after();
  if (r.has_held()) out.held = from_message(r.held());
  out.request_id = r.request_id();
  out.grammar = r.grammar();
  out.embedding = static_cast<model::Pooling>(r.embedding());
  return out;
}

// Why host:port cannot be bound (an errno, or its text when the address does not resolve),
// which gRPC tells only its log; 0 when it can be bound now. Bound as gRPC binds, with
// SO_REUSEADDR.
struct BindRefusal {
  int error = 0;
  std::string text;
};
BindRefusal bind_refusal(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); error != 0) {
    return {EINVAL, ::gai_strerror(error)};
  }
  const int fd = ::socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  const int reuse = 1;
  int error = fd < 0 ? errno : 0;
  if (error == 0 && (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse) != 0 ||
                     ::bind(fd, found->ai_addr, found->ai_addrlen) != 0)) {
    error = errno;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return {error, error == 0 ? std::string() : std::strerror(error)};
}

// INVALID_ARGUMENT naming the field that breaks its rule, or nothing for a well-formed request.
template <typename Request>
std::optional<grpc::Status> refusal_of(const Request& request) {
  if (std::string why = malformed(request); !why.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
  return std::nullopt;
}

}  // namespace

namespace {

// Passes a stream's batches on to the next stage of a chain and writes its replies back up the
// stream, in order, from a thread of its own. The first failure down the chain goes up as the
// reply of the batch it failed (ChainFailure); the batches after it are dropped, since the
// node that sent them fails them all and ends the stream.
class Relay {
 public:
  Relay(std::shared_ptr<engine::Stage> next, std::string next_node,
        grpc::ServerReaderWriter<ForwardReply, ForwardRequest>& upstream)
      : next_(std::move(next)), next_node_(std::move(next_node)), upstream_(upstream), replies_([this] { reply(); }) {}
  ~Relay() { finish(true); }

  void pass_on(const engine::StageBatch& batch) {
    std::exception_ptr error;
    try {
      next_->send(batch);
    } catch (...) {
      error = std::current_exception();  // nothing went out: its reply is this
    }
    {
      std::lock_guard lock(mutex_);
      owed_.push_back(error);
    }
    wake_.notify_one();
  }
  // After the stream's last batch: waits for the replies still owed, or, `cancelled`, ends them.
  void finish(bool cancelled) {
    if (cancelled) next_->cancel();
    {
      std::lock_guard lock(mutex_);
      if (finishing_) return;
      finishing_ = true;
    }
    wake_.notify_one();
    replies_.join();
  }

 private:
  void reply() {
    bool failed = false;
    while (true) {
      std::exception_ptr error;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return finishing_ || !owed_.empty(); });
        if (owed_.empty()) return;
        error = owed_.front();
        owed_.pop_front();
      }
      if (failed) continue;
      ForwardReply reply;
      try {
        if (error) std::rethrow_exception(error);
        to_message(next_->receive(), reply);
      } catch (const engine::StageLost& e) {
        failure(reply, e.node.empty() ? next_node_ : e.node, e.what(), true, e.unreachable);
      } catch (const std::exception& e) {
        failure(reply, next_node_, e.what(), false, false);
      }
      const bool written = upstream_.Write(reply);
      failed = !written || reply.has_failure();
      if (failed) next_->cancel();
    }
  }
  static void failure(ForwardReply& reply, const std::string& node, const std::string& error, bool lost,
                      bool unreachable) {
    reply.Clear();
    ChainFailure& failure = *reply.mutable_failure();
    failure.set_node_id(node);
    failure.set_error(error);
    failure.set_lost(lost);
    failure.set_unreachable(unreachable);
  }

  std::shared_ptr<engine::Stage> next_;
  std::string next_node_;
  grpc::ServerReaderWriter<ForwardReply, ForwardRequest>& upstream_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::exception_ptr> owed_;  // per batch passed on: null, or why it could not be
  bool finishing_ = false;
  std::thread replies_;
};

}  // namespace

class NodeServer::Service final : public Node::Service {
 public:
  Service(NodeHandler& handler, std::shared_ptr<ClusterKey> key, std::function<void(const std::string&)> log,
          uint64_t tensor_chunk_bytes)
      : handler_(handler), key_(std::move(key)), log_(std::move(log)), tensor_chunk_bytes_(tensor_chunk_bytes) {}

  const ClusterKey& key() const { return *key_; }

  grpc::Status Hello(grpc::ServerContext* context, const HelloRequest* request, HelloReply* reply) override {
    if (auto refused = check(*context, "Hello")) return *refused;
    if (request->sender().protocol_version() != kProtocolVersion) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "protocol version " + std::to_string(request->sender().protocol_version()) + " is not this node's " +
                  std::to_string(kProtocolVersion)};
    }
    if (auto refused = refusal_of(*request)) return *refused;
    cluster_types::Hello answer;
    if (std::string refused = handler_.hello(from_message(*request), context->peer(), answer); !refused.empty()) {
      return {grpc::StatusCode::ALREADY_EXISTS, refused};
    }
    *reply = to_hello_reply(answer);
    return grpc::Status::OK;
  }

  // A stream's first batch says whether its batches pass on (ForwardRequest.then) and to which
  // stages; every later one must say the same. Passed on, they go out as they are computed, and
  // the replies come back on another thread, so that this stage computes the next batch while
  // the next stages compute this one.
  grpc::Status Forward(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<ForwardReply, ForwardRequest>* stream) override {
    if (auto refused = check(*context, "Forward")) return *refused;
    ForwardRequest request;
    std::optional<std::vector<std::string>> chain;  // the stream's `then`, from its first batch
    std::unique_ptr<Relay> relay;
    grpc::Status status = grpc::Status::OK;
    while (status.ok() && stream->Read(&request)) {
      if (!chain) {
        chain.emplace(request.then().begin(), request.then().end());
      } else if (!std::equal(chain->begin(), chain->end(), request.then().begin(), request.then().end())) {
        status = {grpc::StatusCode::INVALID_ARGUMENT, "field 'then' is not the stream's first batch's"};
        break;
      }
      if (chain->empty()) {
        ForwardReply reply;
        status = forward(request, reply);
        if (status.ok() && !stream->Write(reply)) break;
        continue;
      }
      if (!relay) {
        std::string why;
        std::shared_ptr<engine::Stage> next = handler_.chain_stage(request.epoch(), chain->front(), why);
        if (!next) {
          status = {grpc::StatusCode::FAILED_PRECONDITION, why};
          break;
        }
        relay = std::make_unique<Relay>(std::move(next), chain->front(), *stream);
      }
      std::optional<engine::StageBatch> passed;
      status = compute(request, passed);
      if (passed) relay->pass_on(*passed);
    }
    if (relay) relay->finish(context->IsCancelled());
    return status;
  }

  grpc::Status Release(grpc::ServerContext* context, const ReleaseRequest* request, ReleaseReply*) override {
    if (auto refused = check(*context, "Release")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    const std::shared_ptr<engine::Stage> stage = handler_.stage(request->epoch(), why);
    if (!stage) return {grpc::StatusCode::FAILED_PRECONDITION, why};
    const std::vector<engine::SequenceId> ids(request->sequence_ids().begin(), request->sequence_ids().end());
    stage->release(ids);
    return grpc::Status::OK;
  }

  grpc::Status HoldPrefix(grpc::ServerContext* context, const HoldPrefixRequest* request,
                          HoldPrefixReply* reply) override {
    if (auto refused = check(*context, "HoldPrefix")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    const std::shared_ptr<engine::Stage> stage = handler_.stage(request->epoch(), why);
    if (!stage) return {grpc::StatusCode::FAILED_PRECONDITION, why};
    try {
      const model::KvBlockCounts pools = stage->kv_blocks();
      reply->set_pool_blocks(pools.full);
      reply->set_window_pool_blocks(pools.window);
      if (request->sequence_id() != 0) {
        const std::vector<engine::Token> tokens(request->tokens().begin(), request->tokens().end());
        reply->set_positions(stage->hold_prefix(request->sequence_id(), request->capacity(), tokens));
      }
    } catch (const std::invalid_argument& e) {
      return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
    } catch (const std::exception& e) {
      return {grpc::StatusCode::INTERNAL, e.what()};
    }
    return grpc::Status::OK;
  }

  grpc::Status ReadKv(grpc::ServerContext* context, const ReadKvRequest* request, LayerKv* reply) override {
    if (auto refused = check(*context, "ReadKv")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    const std::shared_ptr<engine::Stage> stage = handler_.stage(request->epoch(), why);
    if (!stage) return {grpc::StatusCode::FAILED_PRECONDITION, why};
    try {
      to_message(stage->read_kv(request->sequence_id(), request->layer()), *reply);
    } catch (const std::exception& e) {
      return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
    }
    return grpc::Status::OK;
  }

  grpc::Status WriteKv(grpc::ServerContext* context, const WriteKvRequest* request, WriteKvReply*) override {
    if (auto refused = check(*context, "WriteKv")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    const std::shared_ptr<engine::Stage> stage = handler_.stage(request->epoch(), why);
    if (!stage) return {grpc::StatusCode::FAILED_PRECONDITION, why};
    try {
      stage->write_kv(from_message(request->kv()));
    } catch (const std::exception& e) {
      return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
    }
    return grpc::Status::OK;
  }

  grpc::Status Generate(grpc::ServerContext* context, const GenerateRequest* request,
                        grpc::ServerWriter<GenerateEvent>* writer) override {
    if (auto refused = check(*context, "Generate")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    const std::shared_ptr<engine::Generator> scheduler = handler_.scheduler(why);
    if (!scheduler) return {grpc::StatusCode::UNAVAILABLE, why};

    auto events = std::make_shared<engine::TokenStream<engine::TokenEvent>>();
    engine::RequestCallbacks callbacks = engine::queue_events(events);
    // Every line about a request starts "request ID:", on whichever node it is written.
    const std::string about = "request " + request->request_id() + ": ";
    // The engine may finish the request after this call has ended: the callback holds the log.
    callbacks.on_finish = [log = log_, about, queue = std::move(callbacks.on_finish)](engine::FinishReason reason,
                                                                                     const std::string& error) {
      if (log) log(about + "the scheduler here finished it (" + engine::finish_reason_name(reason) + ")");
      queue(reason, error);
    };
    try {
      if (!scheduler->submit(to_engine(*request), std::move(callbacks))) {
        return {grpc::StatusCode::RESOURCE_EXHAUSTED, "too many requests are waiting for the model"};
      }
    } catch (const engine::Unavailable& e) {
      return {grpc::StatusCode::UNAVAILABLE, e.what()};
    } catch (const std::invalid_argument& e) {
      return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
    }
    if (log_) log_(about + "node " + request->sender_id() + " relayed it to the scheduler here");
    GenerateEvent accepted;
    accepted.set_kind(GenerateEvent::ACCEPTED);
    bool writable = writer->Write(accepted);
    while (true) {
      const auto taken = events->take(std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
      // The entry node or its client went away: the scheduler ends the request between its steps.
      if (!writable || context->IsCancelled()) events->cancel();
      for (const engine::TokenEvent& event : taken.items) {
        GenerateEvent message;
        to_message(event, message);
        writable = writable && writer->Write(message);
      }
      if (taken.ended) return grpc::Status::OK;
    }
  }

  grpc::Status ModelManifest(grpc::ServerContext* context, const ModelManifestRequest* request,
                             ModelManifestReply* reply) override {
    if (auto refused = check(*context, "ModelManifest")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    const std::optional<cluster_types::ModelManifest> manifest = handler_.manifest(request->model_hash(), why);
    if (!manifest) return {grpc::StatusCode::NOT_FOUND, why};
    *reply = to_message(*manifest);
    return grpc::Status::OK;
  }

  grpc::Status FetchTensor(grpc::ServerContext* context, const FetchTensorRequest* request,
                           grpc::ServerWriter<TensorChunk>* writer) override {
    if (auto refused = check(*context, "FetchTensor")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    const std::optional<TensorBytes> tensor = handler_.tensor(from_message(*request), why);
    if (!tensor) return {grpc::StatusCode::NOT_FOUND, why};
    if (request->offset() > tensor->bytes.size()) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "offset " + std::to_string(request->offset()) + " is past the end of tensor " +
                  std::to_string(request->tensor()) + " (" + std::to_string(tensor->bytes.size()) + " bytes)"};
    }
    metrics::Counter& weights_sent = metrics::process_registry().counter(
        "strata_weights_sent_bytes_total", "Bytes of weights this node sent to peers that fetch them.");
    TensorChunk chunk;
    for (uint64_t offset = request->offset(); offset < tensor->bytes.size(); offset += tensor_chunk_bytes_) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      const uint64_t length = std::min<uint64_t>(tensor_chunk_bytes_, tensor->bytes.size() - offset);
      chunk.set_offset(offset);
      chunk.set_data(tensor->bytes.data() + offset, length);
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
      weights_sent.add(static_cast<double>(length));
    }
    return grpc::Status::OK;
  }

 private:
  // Runs a batch through this node's stage.
  template <typename Use>
  grpc::Status run(const ForwardRequest& request, const Use& use) {
    if (auto refused = refusal_of(request)) return *refused;
    std::string why;
    const std::shared_ptr<engine::Stage> stage = handler_.stage(request.epoch(), why);
    if (!stage) return {grpc::StatusCode::FAILED_PRECONDITION, why};
    try {
      engine::StageBatch batch = from_message(request);
      use(batch, stage->forward(batch));
    } catch (const std::invalid_argument& e) {
      return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
    } catch (const std::exception& e) {
      return {grpc::StatusCode::INTERNAL, e.what()};
    }
    return grpc::Status::OK;
  }

  grpc::Status forward(const ForwardRequest& request, ForwardReply& reply) {
    return run(request, [&](engine::StageBatch&, engine::StageOutput output) { to_message(output, reply); });
  }

  // The batch that goes on from here: this stage's output rows, to the rest of the chain.
  grpc::Status compute(const ForwardRequest& request, std::optional<engine::StageBatch>& passed) {
    return run(request, [&](engine::StageBatch& batch, engine::StageOutput output) {
      batch.hidden = std::move(output.rows);
      batch.then.erase(batch.then.begin());
      passed = std::move(batch);
    });
  }

  std::optional<grpc::Status> check(grpc::ServerContext& context, std::string_view method) {
    if (auto refusal = key_->refusal(context, method)) {
      if (log_) log_("refused a " + std::string(method) + " call from " + context.peer() + " (node '" +
                     metadata(context, "x-strata-sender") + "'): " + *refusal);
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, *refusal);
    }
    return std::nullopt;
  }

  NodeHandler& handler_;
  std::shared_ptr<ClusterKey> key_;
  std::function<void(const std::string&)> log_;
  uint64_t tensor_chunk_bytes_;
};

NodeServer::NodeServer(NodeHandler& handler, const std::string& node_id, std::shared_ptr<ClusterKey> key,
                       const std::string& host, int port, std::function<void(const std::string&)> log,
                       uint64_t tensor_chunk_bytes)
    : service_(std::make_unique<Service>(handler, std::move(key), std::move(log), tensor_chunk_bytes)) {
  grpc::ServerBuilder builder;
  configure_server(builder, node_id);
  builder.AddListeningPort(host + ":" + std::to_string(port), service_->key().links().server_credentials(), &port_);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    const BindRefusal why = bind_refusal(host, port);
    const std::string what = "cannot listen for nodes on " + host + ":" + std::to_string(port) +
                             (why.text.empty() ? "" : ": " + why.text);
    if (why.error == EADDRINUSE) throw PortTaken(what);
    throw std::runtime_error(what);
  }
}

NodeServer::~NodeServer() { stop(); }

void NodeServer::stop() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
  }
}

}  // namespace strata::rpc
