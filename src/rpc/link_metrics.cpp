#include "rpc/link_metrics.h"

#include <google/protobuf/message_lite.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "metrics/metrics.h"

namespace strata::rpc {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::InterceptorBatchMethods;

// Where a server names its node to its callers; callers name theirs in their signature.
constexpr char kServerNodeKey[] = "x-strata-node";
constexpr char kCallerNodeKey[] = "x-strata-sender";

std::string_view value_of(const std::multimap<grpc::string_ref, grpc::string_ref>* metadata, std::string_view key) {
  if (metadata == nullptr) return {};
  const auto found = metadata->find(grpc::string_ref(key.data(), key.size()));
  if (found == metadata->end()) return {};
  return {found->second.data(), found->second.size()};
}

// "/strata.rpc.Node/Forward" -> "Forward".
std::string method_name(const char* full_name) {
  const std::string_view name(full_name == nullptr ? "" : full_name);
  return std::string(name.substr(name.rfind('/') + 1));
}

// One way of one call: counted, or tallied until the other end is known.
class Direction {
 public:
  void count(uint64_t bytes) {
    if (bytes_ != nullptr) {
      bytes_->add(static_cast<double>(bytes));
      messages_->add();
    } else {
      unnamed_bytes_ += bytes;
      ++unnamed_messages_;
    }
  }
  void counted_in(metrics::Counter& bytes, metrics::Counter& messages) {
    bytes_ = &bytes;
    messages_ = &messages;
    if (unnamed_messages_ == 0) return;
    bytes.add(static_cast<double>(unnamed_bytes_));
    messages.add(static_cast<double>(unnamed_messages_));
  }
  bool named() const { return bytes_ != nullptr; }

 private:
  metrics::Counter* bytes_ = nullptr;
  metrics::Counter* messages_ = nullptr;
  uint64_t unnamed_bytes_ = 0;
  uint64_t unnamed_messages_ = 0;
};

// One end's counts of one call. Its hooks may run on several threads at once (a stream read
// on one and written on another).
class LinkCounts {
 public:
  explicit LinkCounts(std::string method) : method_(std::move(method)) {}

  void name_peer(std::string_view peer) {
    std::lock_guard lock(mutex_);
    if (sent_.named() || peer.empty()) return;
    metrics::Registry& r = metrics::process_registry();
    const metrics::Labels labels{{"peer", std::string(peer)}, {"rpc", method_}};
    sent_.counted_in(
        r.counter("strata_link_sent_bytes_total",
                  "Bytes (protobuf-encoded) of the messages this node sent to a peer node, by their call's method.",
                  labels),
        r.counter("strata_link_sent_messages_total", "Messages this node sent to a peer node, by their call's method.",
                  labels));
    received_.counted_in(
        r.counter("strata_link_received_bytes_total",
                  "Bytes (protobuf-encoded) of the messages this node received from a peer node, by their call's "
                  "method.",
                  labels),
        r.counter("strata_link_received_messages_total",
                  "Messages this node received from a peer node, by their call's method.", labels));
  }

  void sent(uint64_t bytes) {
    std::lock_guard lock(mutex_);
    sent_.count(bytes);
  }
  void received(uint64_t bytes) {
    std::lock_guard lock(mutex_);
    received_.count(bytes);
  }

 private:
  const std::string method_;
  std::mutex mutex_;
  Direction sent_;
  Direction received_;
};

// The same hooks at either end; they differ in where the other end's name is read, and in the
// name a server gives its own.
class CountingInterceptor final : public grpc::experimental::Interceptor {
 public:
  CountingInterceptor(const char* method, const char* peer_key, const std::string* own_name)
      : counts_(method_name(method)), peer_key_(peer_key), own_name_(own_name) {}

  void Intercept(InterceptorBatchMethods* call) override {
    if (own_name_ != nullptr && call->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      call->GetSendInitialMetadata()->emplace(kServerNodeKey, *own_name_);
    }
    if (call->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      counts_.name_peer(value_of(call->GetRecvInitialMetadata(), peer_key_));
    }
    if (call->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      // Serialized here rather than later, once either way: its size is the bytes sent.
      counts_.sent(call->GetSerializedSendMessage()->Length());
    }
    if (call->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      // Received messages come already parsed. Every message of the node protocol is a
      // generated protobuf class, whose MessageLite base sits at its start.
      if (const void* message = call->GetRecvMessage(); message != nullptr) {
        counts_.received(static_cast<const google::protobuf::MessageLite*>(message)->ByteSizeLong());
      }
    }
    if (call->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_STATUS)) {
      // A server that answers with a status alone sends its initial metadata among the trailers.
      counts_.name_peer(value_of(call->GetRecvTrailingMetadata(), peer_key_));
    }
    call->Proceed();
  }

 private:
  LinkCounts counts_;
  const char* const peer_key_;
  const std::string* const own_name_;  // the server's node id; null for a caller
};

class CallsMade final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo* info) override {
    return new CountingInterceptor(info->method(), kServerNodeKey, nullptr);
  }
};

class CallsServed final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallsServed(std::string node_id) : node_id_(std::move(node_id)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new CountingInterceptor(info->method(), kCallerNodeKey, &node_id_);
  }

 private:
  const std::string node_id_;
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> count_calls_made() {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<CallsMade>());
  return factories;
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> count_calls_served(
    std::string node_id) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<CallsServed>(std::move(node_id)));
  return factories;
}

}  // namespace strata::rpc
