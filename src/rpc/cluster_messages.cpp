#include "rpc/cluster_messages.h"

namespace strata::rpc {
namespace {

void write_pool(const cluster_types::KvPoolStats& pool, KvCacheStats& out) {
  out.set_type(pool.type);
  out.set_block_bytes(pool.block_bytes);
  out.set_pool_blocks(pool.pool_blocks);
  out.set_used_blocks(pool.used_blocks);
  out.set_pinned_blocks(pool.pinned_blocks);
  out.set_hits(pool.hits);
  out.set_misses(pool.misses);
  out.set_evictions(pool.evictions);
}

cluster_types::KvPoolStats read_pool(const KvCacheStats& kv) {
  return {kv.type(),          kv.block_bytes(), kv.pool_blocks(), kv.used_blocks(),
          kv.pinned_blocks(), kv.hits(),        kv.misses(),      kv.evictions()};
}

void write_weights(const cluster_types::Weights& w, Weights& out) {
  out.set_whole_file(w.whole_file);
  out.mutable_layer_bytes()->Assign(w.layer_bytes.begin(), w.layer_bytes.end());
  out.set_embedding(w.embedding);
  out.set_head(w.head);
  out.set_shared(w.shared);
  out.set_fetching(w.fetching);
  out.set_received_bytes(w.received_bytes);
  out.set_fetch_received_bytes(w.fetch_received_bytes);
  out.set_wanted_bytes(w.wanted_bytes);
  out.set_held_at_start_bytes(w.held_at_start_bytes);
  out.set_bytes_per_second(w.bytes_per_second);
  out.set_eta_seconds(w.eta_seconds);
}

cluster_types::Weights read_weights(const Weights& w) {
  cluster_types::Weights weights;
  weights.whole_file = w.whole_file();
  weights.layer_bytes.assign(w.layer_bytes().begin(), w.layer_bytes().end());
  weights.embedding = w.embedding();
  weights.head = w.head();
  weights.shared = w.shared();
  weights.fetching = w.fetching();
  weights.received_bytes = w.received_bytes();
  weights.fetch_received_bytes = w.fetch_received_bytes();
  weights.wanted_bytes = w.wanted_bytes();
  weights.held_at_start_bytes = w.held_at_start_bytes();
  weights.bytes_per_second = w.bytes_per_second();
  weights.eta_seconds = w.eta_seconds();
  return weights;
}

void write_stage(const cluster_types::Stage& stage, Stage& out) {
  out.set_node_id(stage.node_id);
  out.set_node_address(stage.node_address);
  out.set_first_layer(stage.first_layer);
  out.set_last_layer(stage.last_layer);
  for (const cluster_types::StageMember& m : stage.group) {
    StageMember& member = *out.add_group();
    member.set_node_id(m.node_id);
    member.set_node_address(m.node_address);
    member.set_exchange_address(m.exchange_address);
    member.set_weight(m.weight);
  }
}

// Both Hello messages: `Message` is HelloRequest (whose node is its sender) or HelloReply.
template <typename Message>
void write_hello_parts(const cluster_types::Hello& hello, Message& out) {
  for (const cluster_types::NodeInfo& info : hello.known) *out.add_known() = to_message(info);
  *out.mutable_placement() = to_message(hello.placement);
}

template <typename Message>
cluster_types::Hello read_hello(const NodeInfo& sender, const Message& message) {
  cluster_types::Hello hello{from_message(sender), {}, from_message(message.placement())};
  for (const NodeInfo& info : message.known()) hello.known.push_back(from_message(info));
  return hello;
}

}  // namespace

NodeInfo to_message(const cluster_types::NodeInfo& info) {
  NodeInfo out;
  out.set_node_id(info.node_id);
  out.set_node_address(info.node_address);
  out.set_exchange_address(info.exchange_address);
  out.set_api_address(info.api_address);
  out.set_model_hash(info.model_hash);
  out.set_model_name(info.model_name);
  out.set_protocol_version(info.protocol_version);
  out.set_memory_bytes(info.memory_bytes);
  out.set_weight_bytes_per_second(info.weight_bytes_per_second);
  out.set_state(info.state);
  out.set_ready_epoch(info.ready_epoch);
  out.set_held_sequences(info.held_sequences);
  out.set_load_progress(info.load_progress);
  out.set_leaving(info.leaving);
  if (info.kv_cache) {
    write_pool(*info.kv_cache, *out.mutable_kv_cache());
    if (info.kv_cache->window) write_pool(*info.kv_cache->window, *out.mutable_kv_cache()->mutable_window());
  }
  out.set_kv_memory_bytes(info.kv_memory_bytes);
  out.set_kv_bytes_per_layer(info.kv_bytes_per_layer);
  out.set_kv_bytes_per_window_layer(info.kv_bytes_per_window_layer);
  out.set_instance(info.instance);
  out.set_started_unix_ms(info.started_unix_ms);
  out.set_stage_inputs(info.stage_inputs);
  out.set_described_unix_ms(info.described_unix_ms);
  for (const cluster_types::LinkMeasure& link : info.links) {
    LinkMeasure& measured = *out.add_links();
    measured.set_peer_id(link.peer_id);
    measured.set_latency_seconds(link.latency_seconds);
    measured.set_bytes_per_second(link.bytes_per_second);
  }
  if (info.weights) write_weights(*info.weights, *out.mutable_weights());
  return out;
}

cluster_types::NodeInfo from_message(const NodeInfo& info) {
  cluster_types::NodeInfo out;
  out.node_id = info.node_id();
  out.node_address = info.node_address();
  out.exchange_address = info.exchange_address();
  out.api_address = info.api_address();
  out.model_hash = info.model_hash();
  out.model_name = info.model_name();
  out.protocol_version = info.protocol_version();
  out.memory_bytes = info.memory_bytes();
  out.weight_bytes_per_second = info.weight_bytes_per_second();
  out.state = info.state();
  out.ready_epoch = info.ready_epoch();
  out.held_sequences = info.held_sequences();
  out.load_progress = info.load_progress();
  out.leaving = info.leaving();
  if (info.has_kv_cache()) {
    out.kv_cache.emplace(cluster_types::KvCacheStats{read_pool(info.kv_cache())});
    if (info.kv_cache().has_window()) out.kv_cache->window = read_pool(info.kv_cache().window());
  }
  out.kv_memory_bytes = info.kv_memory_bytes();
  out.kv_bytes_per_layer = info.kv_bytes_per_layer();
  out.kv_bytes_per_window_layer = info.kv_bytes_per_window_layer();
  out.instance = info.instance();
  out.started_unix_ms = info.started_unix_ms();
  out.stage_inputs = info.stage_inputs();
  out.described_unix_ms = info.described_unix_ms();
  for (const LinkMeasure& link : info.links()) {
    out.links.push_back({link.peer_id(), link.latency_seconds(), link.bytes_per_second()});
  }
  if (info.has_weights()) out.weights = read_weights(info.weights());
  return out;
}

Placement to_message(const cluster_types::Placement& placement) {
  Placement out;
  out.set_epoch(placement.epoch);
  out.set_leader_id(placement.leader_id);
  for (const cluster_types::Stage& stage : placement.stages) write_stage(stage, *out.add_stages());
  out.set_reason(placement.reason);
  out.set_strategy(placement.strategy);
  out.set_error(placement.error);
  return out;
}

cluster_types::Placement from_message(const Placement& placement) {
  cluster_types::Placement out;
  out.epoch = placement.epoch();
  out.leader_id = placement.leader_id();
  for (const Stage& s : placement.stages()) {
    cluster_types::Stage& stage = out.stages.emplace_back(
        cluster_types::Stage{s.node_id(), s.node_address(), s.first_layer(), s.last_layer(), {}});
    for (const StageMember& m : s.group()) {
      stage.group.push_back({m.node_id(), m.node_address(), m.exchange_address(), m.weight()});
    }
  }
  out.reason = placement.reason();
  out.strategy = placement.strategy();
  out.error = placement.error();
  return out;
}

ModelManifestReply to_message(const cluster_types::ModelManifest& manifest) {
  ModelManifestReply out;
  out.set_model_hash(manifest.model_hash);
  out.set_model_name(manifest.model_name);
  out.set_header(manifest.header);
  out.set_file_size(manifest.file_size);
  out.mutable_tensor_sha256()->Assign(manifest.tensor_sha256.begin(), manifest.tensor_sha256.end());
  return out;
}

cluster_types::ModelManifest from_message(const ModelManifestReply& manifest) {
  return {manifest.model_hash(), manifest.model_name(), manifest.header(), manifest.file_size(),
          {manifest.tensor_sha256().begin(), manifest.tensor_sha256().end()}};
}

FetchTensorRequest to_message(const cluster_types::TensorRequest& request) {
  FetchTensorRequest out;
  out.set_model_hash(request.model_hash);
  out.set_tensor(request.tensor);
  out.set_offset(request.offset);
  return out;
}

cluster_types::TensorRequest from_message(const FetchTensorRequest& request) {
  return {request.model_hash(), request.tensor(), request.offset()};
}

HelloRequest to_hello_request(const cluster_types::Hello& hello) {
  HelloRequest out;
  *out.mutable_sender() = to_message(hello.sender);
  write_hello_parts(hello, out);
  return out;
}

HelloReply to_hello_reply(const cluster_types::Hello& hello) {
  HelloReply out;
  *out.mutable_node() = to_message(hello.sender);
  write_hello_parts(hello, out);
  return out;
}

cluster_types::Hello from_message(const HelloRequest& request) { return read_hello(request.sender(), request); }
cluster_types::Hello from_message(const HelloReply& reply) { return read_hello(reply.node(), reply); }

}  // namespace strata::rpc
