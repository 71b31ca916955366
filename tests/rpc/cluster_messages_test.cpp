// The cluster's plain values round-trip through the protocol's messages with every field set
// to a value other than its default, so that a field one conversion forgets fails; and every
// field of each message is written, so that a field added to the protocol and not to the
// plain value fails too.
#include "rpc/cluster_messages.h"

#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace strata::rpc {
namespace {

cluster_types::KvPoolStats pool(uint64_t seed) {
  return {"f16", 4096 + seed, 30 + static_cast<int32_t>(seed), 20, 10, 7 + seed, 8 + seed, 9 + seed};
}

cluster_types::NodeInfo every_field_set(const std::string& id) {
  cluster_types::NodeInfo info;
  info.node_id = id;
  info.node_address = "10.0.0.2:50051";
  info.exchange_address = "10.0.0.2:50052";
  info.api_address = "10.0.0.2:8080";
  info.model_hash = "ab12";
  info.model_name = "llama";
  info.protocol_version = 9;
  info.memory_bytes = 1ULL << 33;
  info.weight_bytes_per_second = 2.5e9;
  info.state = "ready";
  info.ready_epoch = 4;
  info.held_sequences = 3;
  info.load_progress = 0.5;
  info.leaving = true;
  info.kv_cache.emplace(cluster_types::KvCacheStats{pool(1)});
  info.kv_cache->window = pool(2);
  info.kv_memory_bytes = 1ULL << 30;
  info.kv_bytes_per_layer = 1ULL << 20;
  info.kv_bytes_per_window_layer = 1ULL << 18;
  info.instance = "c0ffee";
  info.started_unix_ms = 1700000000000;
  info.stage_inputs = 12345;
  info.described_unix_ms = 1700000001000;
  info.links = {{"b", 2.5e-5, 8e8}, {"c", 1e-4, 1.2e8}};
  info.weights = cluster_types::Weights{true, {100, 200}, true, true, true, true, 11, 12, 13, 14, 1.5, 2.5};
  return info;
}

// Its first stage starts at layer 1, not 0, so that no field is its default; both are
// tensor-parallel groups, so that every stage's group is written.
cluster_types::Placement every_field_set_placement() {
  return {7,
          "a",
          {{"a", "10.0.0.1:50051", 1, 3,
            {{"a", "10.0.0.1:50051", "10.0.0.1:50052", 1.0}, {"d", "10.0.0.4:50051", "10.0.0.4:50052", 3.0}}},
           {"b", "10.0.0.2:50051", 3, 5,
            {{"b", "10.0.0.2:50051", "10.0.0.2:50052", 2.5}, {"c", "10.0.0.3:50051", "10.0.0.3:50052", 1.5}}}},
          "a: 3 layers, b: 2 layers",
          "memory",
          "no error, but set"};
}

// Every field of `message` and of the messages it holds has a value other than its default.
void expect_every_field_set(const google::protobuf::Message& message, const std::string& path) {
  const google::protobuf::Descriptor& type = *message.GetDescriptor();
  const google::protobuf::Reflection& reflection = *message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> set;
  reflection.ListFields(message, &set);
  for (int i = 0; i < type.field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = type.field(i);
    EXPECT_NE(std::find(set.begin(), set.end(), field), set.end()) << path << field->name() << " is not written";
    if (field->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      for (int k = 0; k < reflection.FieldSize(message, field); ++k) {
        expect_every_field_set(reflection.GetRepeatedMessage(message, field, k),
                               path + field->name() + "[" + std::to_string(k) + "].");
      }
    } else if (reflection.HasField(message, field) && field->message_type() != &type) {
      // A message of its own type (KvCacheStats.window) holds none again: only the outer one is
      // written whole.
      expect_every_field_set(reflection.GetMessage(message, field), path + field->name() + ".");
    }
  }
}

TEST(ClusterMessages, NodeInfoRoundTripsEveryField) {
  const cluster_types::NodeInfo info = every_field_set("a");
  const NodeInfo message = to_message(info);
  expect_every_field_set(message, "");
  EXPECT_EQ(from_message(message), info);
}

TEST(ClusterMessages, NodeInfoWithoutKvCacheWindowOrWeightsStaysWithout) {
  cluster_types::NodeInfo info = every_field_set("a");
  info.kv_cache->window.reset();
  EXPECT_EQ(from_message(to_message(info)), info);
  EXPECT_FALSE(to_message(info).kv_cache().has_window());
  info.kv_cache.reset();
  info.weights.reset();  // a node of an older version says nothing of its weights
  const NodeInfo message = to_message(info);
  EXPECT_FALSE(message.has_kv_cache());
  EXPECT_FALSE(message.has_weights());
  EXPECT_EQ(from_message(message), info);
}

TEST(ClusterMessages, PlacementRoundTripsEveryField) {
  const cluster_types::Placement placement = every_field_set_placement();
  const Placement message = to_message(placement);
  expect_every_field_set(message, "");
  EXPECT_EQ(from_message(message), placement);
}

TEST(ClusterMessages, ModelManifestRoundTripsEveryField) {
  const cluster_types::ModelManifest manifest{"ab12", "llama", std::string("GGUF\0\x03", 6), 1ULL << 32,
                                              {std::string(32, '\x01'), std::string(32, '\0')}};
  const ModelManifestReply message = to_message(manifest);
  expect_every_field_set(message, "");
  EXPECT_EQ(from_message(message), manifest);
}

TEST(ClusterMessages, TensorRequestRoundTripsEveryField) {
  const cluster_types::TensorRequest request{"ab12", 7, 1ULL << 33};
  const FetchTensorRequest message = to_message(request);
  expect_every_field_set(message, "");
  EXPECT_EQ(from_message(message), request);
}

TEST(ClusterMessages, HelloRoundTripsBothWays) {
  const cluster_types::Hello hello{every_field_set("a"), {every_field_set("b"), every_field_set("c")},
                                   every_field_set_placement()};
  const HelloRequest request = to_hello_request(hello);
  expect_every_field_set(request, "");
  EXPECT_EQ(from_message(request), hello);
  const HelloReply reply = to_hello_reply(hello);
  expect_every_field_set(reply, "");
  EXPECT_EQ(from_message(reply), hello);
}

}  // namespace
}  // namespace strata::rpc
