// A node's setup from its options and the shared model: the options resolved, a keyless node
// kept to this machine, what it says of itself, the KV its placements reserve, and discovery
// left off where it could reach no other machine.
#include "cluster/node_setup.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "model/kv_pool.h"
#include "model/synthetic.h"
#include "rpc/messages.h"

namespace strata::cluster {
namespace {

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

class NodeSetupTest : public ::testing::Test {
 protected:
  NodeSetupTest() : file_(gguf::File::open(kDreams)), config_(model::Config::from_gguf(*file_)) {
    options_.node_id = "a";
    options_.engine.threads = 1;
    options_.engine.max_parallel = 2;
    options_.memory_limit = uint64_t{1} << 30;
    options_.log = [this](const std::string& line) { lines_.push_back(line); };
  }

  std::shared_ptr<const gguf::File> file_;
  model::Config config_;
  NodeOptions options_;
  std::vector<std::string> lines_;
};

TEST_F(NodeSetupTest, TheOptionsAreResolvedAndAKeylessNodeKeptToThisMachine) {
  NodeOptions given = options_;
  given.engine.threads = 0;
  const NodeOptions usable = usable_options(given, config_);
  EXPECT_GE(usable.engine.threads, 1);
  EXPECT_EQ(usable.engine.context_size, config_.context_length);

  given.peers = {"127.0.0.1:7001", "localhost:7002"};
  EXPECT_NO_THROW(usable_options(given, config_));
  given.peers = {"10.0.0.2:7001"};
  EXPECT_THROW(usable_options(given, config_), std::runtime_error);
  given.cluster_key = "key";
  EXPECT_NO_THROW(usable_options(given, config_));
  given = options_;
  given.host = "0.0.0.0";
  EXPECT_THROW(usable_options(given, config_), std::runtime_error);
}

TEST_F(NodeSetupTest, ItSaysWhatItIsAndReservesKvAsItStoresIt) {
  const NodeOptions options = usable_options(options_, config_);
  const cluster_types::NodeInfo self = describe_node(options, *file_, config_);
  EXPECT_EQ(self.node_id, "a");
  EXPECT_EQ(self.model_hash, model_hash(*file_));
  EXPECT_EQ(self.model_name, "aidreams260K");
  EXPECT_EQ(self.memory_bytes, uint64_t{1} << 30);
  EXPECT_EQ(self.protocol_version, rpc::kProtocolVersion);
  EXPECT_EQ(self.state, "starting");
  EXPECT_GT(self.weight_bytes_per_second, 0.0);
  EXPECT_GT(self.kv_bytes_per_layer, 0u) << "without --kv-memory its pool is sized per layer";
  EXPECT_NE(describe_node(options, *file_, config_).instance, self.instance) << "one instance per process";

  const PlacementRules rules = placement_rules(options, *file_, config_);
  EXPECT_EQ(rules.leader_id, "a");
  EXPECT_EQ(rules.kv_reserve_tokens, static_cast<uint64_t>(config_.context_length) * 2);
  EXPECT_EQ(rules.footprint.layer_count, config_.layer_count);
  EXPECT_GT(rules.footprint.kv_bytes_per_layer_per_token, 0u);
  EXPECT_GT(kv_options(options.engine, config_, {0, 2}).blocks.full, 0);
}

// A model with sliding-window layers: each keeps its --parallel sequences' windows and steps,
// which the node says and its placements reserve, not its whole context.
TEST(NodeSetup, ASlidingWindowLayersKvIsItsWindows) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("strata_node_setup_test_" + std::to_string(::getpid()) + ".gguf");
  model::write_synthetic_model(*model::find_synthetic_shape("gemma3-tiny"), model::parse_weight_types("F32"),
                               path.string(), 3);
  const auto file = gguf::File::open(path.string());
  std::filesystem::remove(path);
  const model::Config config = model::Config::from_gguf(*file);
  NodeOptions options;
  options.node_id = "a";
  options.engine.threads = 1;
  options.engine.max_parallel = 2;
  options.engine.context_size = 512;
  options.engine.prefill_chunk = 32;
  options.memory_limit = uint64_t{1} << 30;
  const cluster_types::NodeInfo self = describe_node(options, *file, config);
  const uint64_t per_position = model::KvLayout(config, 1, options.engine.kv_type).block_bytes / model::kKvBlock;
  // A window of 12 and steps of 32: (12 - 1 + 32 - 1) / 16 + 2 = 4 blocks of 16 a sequence.
  EXPECT_EQ(self.kv_bytes_per_layer, 2u * 512 * per_position);
  EXPECT_EQ(self.kv_bytes_per_window_layer, 2u * 4 * 16 * per_position);
  const PlacementRules rules = placement_rules(options, *file, config);
  EXPECT_EQ(rules.footprint.window_kv_tokens, 2u * 4 * 16);
  ASSERT_EQ(rules.footprint.sliding_layers.size(), static_cast<size_t>(config.layer_count));
  for (int l = 0; l < config.layer_count; ++l) EXPECT_EQ(rules.footprint.sliding_layers[static_cast<size_t>(l)], config.is_sliding(l));
}

TEST_F(NodeSetupTest, DiscoveryIsOffWhereItCouldReachNoOtherMachine) {
  DiscoveredNodes found;
  const NodeOptions options = usable_options(options_, config_);
  EXPECT_EQ(start_discovery(options, describe_node(options, *file_, config_), 7001, std::make_shared<rpc::ClusterKey>("k"),
                            found),
            nullptr);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_TRUE(lines_[0].starts_with("discovery is off: without --cluster-key")) << lines_[0];
  NodeOptions keyed = options;
  keyed.cluster_key = "key";
  EXPECT_EQ(start_discovery(keyed, describe_node(keyed, *file_, config_), 7001, std::make_shared<rpc::ClusterKey>("k"),
                            found),
            nullptr);
  EXPECT_TRUE(lines_.back().starts_with("discovery is off: the node service listens on 127.0.0.1 only")) << lines_.back();
  keyed.discovery = false;
  lines_.clear();
  EXPECT_EQ(start_discovery(keyed, describe_node(keyed, *file_, config_), 7001, std::make_shared<rpc::ClusterKey>("k"),
                            found),
            nullptr);
  EXPECT_TRUE(lines_.empty()) << "off as asked, nothing to say";
}

}  // namespace
}  // namespace strata::cluster
