// What a node with the model's file serves to nodes that fetch its weights, and what it
// refuses, without a network.
#include "cluster/node_weights.h"

#include <gtest/gtest.h>

#include "cluster/node.h"

namespace strata::cluster {
namespace {

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

class NodeWeightsTest : public ::testing::Test {
 protected:
  NodeWeightsTest()
      : file_(gguf::File::open(kDreams)),
        hash_(model_hash(*file_)),
        weights_(file_, std::make_shared<rpc::ClusterKey>("secret"), {.node_id = "a", .model_hash = hash_}) {}

  static cluster_types::TensorRequest request(uint32_t tensor, const std::string& model_hash) {
    return {model_hash, tensor};
  }

  std::shared_ptr<const gguf::File> file_;
  std::string hash_;
  NodeWeights weights_;
};

TEST_F(NodeWeightsTest, AWholeFileServesItsManifestAndEveryTensor) {
  std::string why;
  const std::optional<cluster_types::ModelManifest> manifest = weights_.manifest(hash_, why);
  ASSERT_TRUE(manifest) << why;
  EXPECT_EQ(manifest->model_hash, hash_);
  EXPECT_TRUE(weights_.manifest("", why)) << "any model will do";
  const gguf::TensorInfo& last = file_->tensors().back();
  const std::optional<rpc::TensorBytes> bytes = weights_.tensor(request(file_->tensors().size() - 1, hash_), why);
  ASSERT_TRUE(bytes) << why;
  EXPECT_EQ(bytes->bytes.size(), last.size_bytes);
  EXPECT_EQ(bytes->bytes.data(), file_->tensor_data(last));
  EXPECT_TRUE(weights_.held().whole_file);
  EXPECT_FALSE(weights_.held().fetching);
}

TEST_F(NodeWeightsTest, AnotherModelOrATensorOutOfTheTableIsRefusedSayingWhy) {
  std::string why;
  EXPECT_FALSE(weights_.manifest("0123456789abcdef", why));
  EXPECT_EQ(why, "node a runs another model (" + hash_.substr(0, 12) + ")");
  why.clear();
  EXPECT_FALSE(weights_.tensor(request(0, "0123456789abcdef"), why));
  EXPECT_EQ(why, "node a runs another model (" + hash_.substr(0, 12) + ")");
  const auto count = static_cast<uint32_t>(file_->tensors().size());
  EXPECT_FALSE(weights_.tensor(request(count, hash_), why));
  EXPECT_EQ(why, "the model has no tensor " + std::to_string(count));
}

}  // namespace
}  // namespace strata::cluster
