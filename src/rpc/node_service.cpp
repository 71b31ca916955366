#include "rpc/node_service.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>

#include "metrics/metrics.h"
#include "rpc/channel.h"

namespace strata::rpc {

static_assert(std::endian::native == std::endian::little, "activations travel as little-endian floats");

namespace {

engine::GenerationRequest to_engine(const GenerateRequest& r) {
  engine::GenerationRequest out;
  out.prompt.assign(r.prompt().begin(), r.prompt().end());
  out.max_tokens = r.max_tokens();
  const SamplingParams& s = r.sampling();
  out.sampling = {s.temperature(), s.top_k(), s.top_p(), s.min_p(), s.repetition_penalty(),
                  s.presence_penalty(), s.frequency_penalty(), s.penalty_last_n(), s.seed()};
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
    if (std::string refused = handler_.hello(*request, context->peer(), *reply); !refused.empty()) {
      return {grpc::StatusCode::ALREADY_EXISTS, refused};
    }
    return grpc::Status::OK;
  }

  grpc::Status Forward(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<ForwardReply, ForwardRequest>* stream) override {
    if (auto refused = check(*context, "Forward")) return *refused;
    ForwardRequest request;
    while (stream->Read(&request)) {
      ForwardReply reply;
      if (grpc::Status status = forward(request, reply); !status.ok()) return status;
      if (!stream->Write(reply)) break;
    }
    return grpc::Status::OK;
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
      reply->set_pool_blocks(stage->kv_blocks());
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

    struct Events {
      std::mutex mutex;
      std::condition_variable ready;
      std::deque<GenerateEvent> queue;
      bool finished = false;
      bool cancelled = false;
    };
    auto events = std::make_shared<Events>();
    const auto push = [events](GenerateEvent event, bool last) {
      {
        std::lock_guard lock(events->mutex);
        events->queue.push_back(std::move(event));
        events->finished = events->finished || last;
      }
      events->ready.notify_one();
    };
    engine::RequestCallbacks callbacks;
    callbacks.on_token = [events, push](const engine::GeneratedToken& t) {
      GenerateEvent event;
      event.set_kind(GenerateEvent::TOKEN);
      event.set_token(t.token);
      event.set_logprob(t.logprob);
      event.set_end_of_generation(t.end_of_generation);
      event.set_cached_tokens(t.cached_tokens);
      for (const engine::TokenLogprob& alt : t.top) {
        TokenLogprob* out = event.add_top();
        out->set_token(alt.token);
        out->set_logprob(alt.logprob);
      }
      push(std::move(event), false);
      std::lock_guard lock(events->mutex);
      return !events->cancelled;
    };
    callbacks.on_started = [push] {
      GenerateEvent event;
      event.set_kind(GenerateEvent::STARTED);
      push(std::move(event), false);
    };
    callbacks.on_embedding = [push](std::vector<float> embedding) {
      GenerateEvent event;
      event.set_kind(GenerateEvent::EMBEDDING);
      event.mutable_embedding()->Add(embedding.begin(), embedding.end());
      push(std::move(event), false);
    };
    callbacks.cancelled = [events] {
      std::lock_guard lock(events->mutex);
      return events->cancelled;
    };
    // Every line about a request starts "request ID:", on whichever node it is written.
    const std::string about = "request " + request->request_id() + ": ";
    // The engine may finish the request after this call has ended: the callback holds the log.
    callbacks.on_finish = [log = log_, push, about](engine::FinishReason reason, const std::string& error) {
      if (log) log(about + "the scheduler here finished it (" + engine::finish_reason_name(reason) + ")");
      GenerateEvent event;
      event.set_kind(GenerateEvent::FINISHED);
      event.set_finish_reason(static_cast<int32_t>(reason));
      event.set_error(error);
      push(std::move(event), true);
    };
    callbacks.on_passed_on = [push](const engine::HeldState& held) {
      GenerateEvent event;
      event.set_kind(GenerateEvent::FINISHED);
      to_message(held, *event.mutable_passed_on());
      push(std::move(event), true);
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
      std::deque<GenerateEvent> batch;
      bool done = false;
      {
        std::unique_lock lock(events->mutex);
        events->ready.wait_for(lock, std::chrono::milliseconds(200), [&] { return !events->queue.empty(); });
        batch.swap(events->queue);
        done = events->finished;
        // The entry node or its client went away: the scheduler ends the request between its steps.
        if (!writable || context->IsCancelled()) events->cancelled = true;
      }
      for (const GenerateEvent& event : batch) writable = writable && writer->Write(event);
      if (done) return grpc::Status::OK;
    }
  }

  grpc::Status ModelManifest(grpc::ServerContext* context, const ModelManifestRequest* request,
                             ModelManifestReply* reply) override {
    if (auto refused = check(*context, "ModelManifest")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    std::optional<ModelManifestReply> manifest = handler_.manifest(request->model_hash(), why);
    if (!manifest) return {grpc::StatusCode::NOT_FOUND, why};
    *reply = std::move(*manifest);
    return grpc::Status::OK;
  }

  grpc::Status FetchTensor(grpc::ServerContext* context, const FetchTensorRequest* request,
                           grpc::ServerWriter<TensorChunk>* writer) override {
    if (auto refused = check(*context, "FetchTensor")) return *refused;
    if (auto refused = refusal_of(*request)) return *refused;
    std::string why;
    const std::optional<TensorBytes> tensor = handler_.tensor(*request, why);
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
  grpc::Status forward(const ForwardRequest& request, ForwardReply& reply) {
    if (auto refused = refusal_of(request)) return *refused;
    std::string why;
    const std::shared_ptr<engine::Stage> stage = handler_.stage(request.epoch(), why);
    if (!stage) return {grpc::StatusCode::FAILED_PRECONDITION, why};
    engine::StageBatch batch;
    for (const SequenceWork& w : request.sequences()) {
      batch.sequences.push_back({w.sequence_id(), w.first_position(), w.token_count(), w.capacity(), w.embeddings()});
    }
    batch.tokens.assign(request.tokens().begin(), request.tokens().end());
    batch.hidden.resize(request.hidden().size() / sizeof(float));
    std::memcpy(batch.hidden.data(), request.hidden().data(), request.hidden().size());
    try {
      const std::vector<float> rows = stage->forward(batch);
      reply.set_rows(rows.data(), rows.size() * sizeof(float));
    } catch (const std::invalid_argument& e) {
      return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
    } catch (const std::exception& e) {
      return {grpc::StatusCode::INTERNAL, e.what()};
    }
    return grpc::Status::OK;
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
