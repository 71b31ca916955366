// The cluster's plain values (src/cluster_types) to and from the node protocol's messages, one
// function each way, so that the cluster holds no protobuf and a field added to both is
// converted in one place (tests/rpc/cluster_messages_test.cpp round-trips every field).
// Checking a message (rpc/messages.h) comes before converting it.
#pragma once

#include "cluster_types/hello.h"
#include "cluster_types/model_manifest.h"
#include "cluster_types/node_info.h"
#include "cluster_types/placement.h"
#include "node.pb.h"

namespace strata::rpc {

NodeInfo to_message(const cluster_types::NodeInfo& info);
cluster_types::NodeInfo from_message(const NodeInfo& info);

Placement to_message(const cluster_types::Placement& placement);
cluster_types::Placement from_message(const Placement& placement);

ModelManifestReply to_message(const cluster_types::ModelManifest& manifest);
cluster_types::ModelManifest from_message(const ModelManifestReply& manifest);

FetchTensorRequest to_message(const cluster_types::TensorRequest& request);
cluster_types::TensorRequest from_message(const FetchTensorRequest& request);

// A Hello's two messages have the same parts: the request's sender is the reply's node.
HelloRequest to_hello_request(const cluster_types::Hello& hello);
HelloReply to_hello_reply(const cluster_types::Hello& hello);
cluster_types::Hello from_message(const HelloRequest& request);
cluster_types::Hello from_message(const HelloReply& reply);

}  // namespace strata::rpc
