// The placement's choice of tensor-parallel groups, against times worked out here from the cost
// model's definition: a group reads its stage's weights at the sum of its members' speeds, and
// waits per exchange for its slowest link and per gathered byte for the member that receives the
// most through its port.
#include "cluster/tensor_groups.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

namespace strata::cluster {
namespace {

constexpr uint64_t kGB = 1'000'000'000;
constexpr uint64_t kContext4096 = 4096;
constexpr LinkCost kGigabit{0.0002, 125e6};
constexpr LinkCost kTenGigabit{0.00005, 1.25e9};

// A 70B model in Q4_K_M as Llama 3 shapes it: 80 layers of 490 MB, embedding and head of 0.5 GB
// each, kv_dim 1024; a group gathers per layer two rows of 8192 sums of o's leaves and two of
// down's, and at the head a row of 128,256 logits.
ModelFootprint model_70b() {
  ModelFootprint m{80, std::vector<uint64_t>(80, 490'000'000), 500'000'000, 500'000'000, 2 * 1024 * sizeof(float)};
  m.layer_gathered_bytes.assign(80, 4 * 8192 * sizeof(float));
  m.layer_gathers.assign(80, 2);
  m.head_gathered_bytes = 128'256 * sizeof(float);
  return m;
}

uint64_t read_bytes(const ModelFootprint& m) {
  uint64_t bytes = m.head_bytes;
  for (uint64_t layer : m.layer_weight_bytes) bytes += layer;
  return bytes;
}

uint64_t gathered_bytes(const ModelFootprint& m) {
  uint64_t bytes = m.head_gathered_bytes;
  for (uint64_t layer : m.layer_gathered_bytes) bytes += layer;
  return bytes;
}

// One group holding every layer: its reads at the summed speed, the footprint's exchanges of
// each layer and one at the head at the link's latency, the gathered bytes of the member that receives the most, and
// a hop's time to start each step on the members.
double one_group_seconds(const ModelFootprint& m, double summed_speed, LinkCost link, double largest_others_share) {
  uint64_t exchanges = 1;
  for (uint64_t layer : m.layer_gathers) exchanges += layer;
  return static_cast<double>(read_bytes(m)) / summed_speed + link.latency_seconds * static_cast<double>(exchanges) +
         static_cast<double>(gathered_bytes(m)) * largest_others_share / link.bytes_per_second + kDefaultHopSeconds;
}

std::vector<std::string> member_ids(const GroupStage& stage) {
  std::vector<std::string> ids;
  for (const GroupMember& member : stage.members) ids.push_back(member.node_id);
  return ids;
}

TEST(TensorGroups, AGroupAddsSpeedsAndWaitsForItsSlowestLink) {
  const std::vector<NodeCapacity> members = {{"a", 30 * kGB, 30e9}, {"b", 20 * kGB, 10e9}};
  LinkCosts links(kGigabit);
  links.set("b", "a", {0.001, 50e6});
  const NodeCapacity group = group_capacity(members, links);
  EXPECT_EQ(group.id, "a+b");
  EXPECT_DOUBLE_EQ(group.weight_bytes_per_second, 40e9);
  // Shares 3/4 and 1/4: a holds 30 GB of 3/4 (40 GB), b 20 GB of 1/4 (80 GB).
  EXPECT_EQ(group.memory_bytes, 40 * kGB);
  EXPECT_DOUBLE_EQ(group.seconds_per_exchange, 0.001);
  // b receives a's 3/4 of each row over the measured link.
  EXPECT_DOUBLE_EQ(group.seconds_per_gathered_byte, 0.75 / 50e6);
  const std::vector<GroupMember> shares = group_shares(members);
  EXPECT_EQ(shares, (std::vector<GroupMember>{{"a", 0.75}, {"b", 0.25}}));
  EXPECT_EQ(group_capacity({members.begin(), 1}, links).id, "a");
  EXPECT_EQ(group_capacity({members.begin(), 1}, links).seconds_per_exchange, 0.0);
}

TEST(TensorGroups, LinksAreTheSameBothWaysAndRefuseNonsense) {
  LinkCosts links(kGigabit);
  links.set("x", "y", kTenGigabit);
  EXPECT_EQ(links.between("y", "x").bytes_per_second, kTenGigabit.bytes_per_second);
  EXPECT_EQ(links.between("x", "z").bytes_per_second, kGigabit.bytes_per_second);
  EXPECT_THROW(links.set("x", "y", {-1.0, 1e9}), std::invalid_argument);
  EXPECT_THROW(links.set("x", "y", {0.001, 0.0}), std::invalid_argument);
  EXPECT_THROW(LinkCosts({0.001, NAN}), std::invalid_argument);
}

TEST(TensorGroups, EqualNodesOnAFastLinkFormOneGroup) {
  const ModelFootprint m = model_70b();
  const std::vector<NodeCapacity> nodes = {{"a", 32 * kGB, 20e9}, {"b", 32 * kGB, 20e9}};
  const GroupPlacement p = place_groups(nodes, m, LinkCosts(kTenGigabit), {kContext4096, Strategy::Speed});
  ASSERT_EQ(p.stages.size(), 1u) << p.reason;
  EXPECT_EQ(p.stages[0].members, (std::vector<GroupMember>{{"a", 0.5}, {"b", 0.5}}));
  EXPECT_EQ(p.stages[0].first_layer, 0);
  EXPECT_EQ(p.stages[0].last_layer, 80);
  // About 1.02 s against the pipeline's 2.01 s.
  EXPECT_NEAR(p.predicted_seconds_per_token, one_group_seconds(m, 40e9, kTenGigabit, 0.5), 1e-9);
  EXPECT_NE(p.reason.find("group a+b: a 50% b 50%"), std::string::npos) << p.reason;
  // Why: against the pipeline of the two, each reading its half of the weights in turn.
  char why[96];
  std::snprintf(why, sizeof why, "with groups %.1f ms per token predicted, the nodes alone %.1f",
                one_group_seconds(m, 40e9, kTenGigabit, 0.5) * 1e3,
                (static_cast<double>(read_bytes(m)) / 20e9 + kDefaultHopSeconds) * 1e3);
  EXPECT_NE(p.reason.find(why), std::string::npos) << p.reason;
}

// One exchange more a layer (an expert layer's, say) costs the link's latency each.
TEST(TensorGroups, EveryGatherOfALayerWaitsForTheLink) {
  ModelFootprint m = model_70b();
  const std::vector<NodeCapacity> nodes = {{"a", 32 * kGB, 20e9}, {"b", 32 * kGB, 20e9}};
  const LinkCost link{0.0005, kTenGigabit.bytes_per_second};
  const GroupPlacement two = place_groups(nodes, m, LinkCosts(link), {kContext4096, Strategy::Speed});
  m.layer_gathers.assign(80, 3);
  const GroupPlacement three = place_groups(nodes, m, LinkCosts(link), {kContext4096, Strategy::Speed});
  ASSERT_EQ(two.stages.size(), 1u) << two.reason;
  ASSERT_EQ(three.stages.size(), 1u) << three.reason;
  EXPECT_NEAR(three.predicted_seconds_per_token - two.predicted_seconds_per_token, 80 * 0.0005, 1e-9);
  m.layer_gathers.pop_back();
  EXPECT_THROW(place_groups(nodes, m, LinkCosts(link), {kContext4096, Strategy::Speed}), std::invalid_argument);
}

TEST(TensorGroups, ASlowLinkMakesAPipeline) {
  const ModelFootprint m = model_70b();
  const std::vector<NodeCapacity> nodes = {{"a", 32 * kGB, 20e9}, {"b", 32 * kGB, 20e9}};
  // 100 Mbit/s and 5 ms: the group would wait 0.81 s on latency (161 exchanges) and 0.44 s on
  // bytes per token, more than the second stage's reads (about 1 s) it saves.
  const LinkCost slow{0.005, 12.5e6};
  const GroupPlacement p = place_groups(nodes, m, LinkCosts(slow), {kContext4096, Strategy::Speed});
  ASSERT_EQ(p.stages.size(), 2u) << p.reason;
  for (const GroupStage& stage : p.stages) ASSERT_EQ(stage.members.size(), 1u);
  const double pipeline = static_cast<double>(read_bytes(m)) / 20e9 + kDefaultHopSeconds;
  EXPECT_NEAR(p.predicted_seconds_per_token, pipeline, 1e-9);
  EXPECT_LT(pipeline, one_group_seconds(m, 40e9, slow, 0.5));
}

// The seed's four nodes (16, 16, 32 and 32 GB at 20 GB/s) on gigabit: all four in one group
// read a quarter each; two groups of two, or a pipeline, read more per member.
TEST(TensorGroups, SeedClusterOnGigabitIsOneGroupOfFour) {
  const ModelFootprint m = model_70b();
  const std::vector<NodeCapacity> nodes = {
      {"a", 16 * kGB, 20e9}, {"b", 16 * kGB, 20e9}, {"c", 32 * kGB, 20e9}, {"d", 32 * kGB, 20e9}};
  const GroupPlacement p = place_groups(nodes, m, LinkCosts(kGigabit), {kContext4096, Strategy::Speed});
  ASSERT_EQ(p.stages.size(), 1u) << p.reason;
  EXPECT_EQ(member_ids(p.stages[0]), (std::vector<std::string>{"a", "b", "c", "d"}));
  for (const GroupMember& member : p.stages[0].members) EXPECT_DOUBLE_EQ(member.share, 0.25);
  // 0.50 s of reads, 64 ms of latency and 105 ms of bytes.
  EXPECT_NEAR(p.predicted_seconds_per_token, one_group_seconds(m, 80e9, kGigabit, 0.75), 1e-9);
  EXPECT_LT(p.predicted_seconds_per_token, 0.7);
}

// One fast and one slow node that each hold the model: on gigabit the slow node's 11% of the
// reads saves less than the exchanges cost, so the fast node runs alone; on 10 GbE it joins.
TEST(TensorGroups, OneFastOneSlowNodeGroupOnlyOnAFastLink) {
  const ModelFootprint m = model_70b();
  const std::vector<NodeCapacity> nodes = {{"fast", 64 * kGB, 40e9}, {"slow", 64 * kGB, 5e9}};
  const double fast_alone = static_cast<double>(read_bytes(m)) / 40e9;

  const GroupPlacement gigabit = place_groups(nodes, m, LinkCosts(kGigabit), {kContext4096, Strategy::Speed});
  ASSERT_EQ(gigabit.stages.size(), 1u) << gigabit.reason;
  EXPECT_EQ(member_ids(gigabit.stages[0]), (std::vector<std::string>{"fast"}));
  EXPECT_NEAR(gigabit.predicted_seconds_per_token, fast_alone, 1e-9);
  EXPECT_GT(one_group_seconds(m, 45e9, kGigabit, 8.0 / 9.0), fast_alone);

  const GroupPlacement ten = place_groups(nodes, m, LinkCosts(kTenGigabit), {kContext4096, Strategy::Speed});
  ASSERT_EQ(ten.stages.size(), 1u) << ten.reason;
  ASSERT_EQ(ten.stages[0].members.size(), 2u);
  EXPECT_NEAR(ten.stages[0].members[0].share, 8.0 / 9.0, 1e-12);
  EXPECT_NEAR(ten.predicted_seconds_per_token, one_group_seconds(m, 45e9, kTenGigabit, 8.0 / 9.0), 1e-9);
  EXPECT_LT(ten.predicted_seconds_per_token, fast_alone);
}

// A group holds what its members can for their shares: a fast node short of memory for its
// share of speed makes the group too small, and the nodes form a pipeline instead.
TEST(TensorGroups, AGroupMustFitEachMembersShare) {
  const ModelFootprint m = model_70b();
  const std::vector<NodeCapacity> nodes = {{"fast", 32 * kGB, 40e9}, {"slow", 32 * kGB, 5e9}};
  ASSERT_LT(group_capacity(nodes, LinkCosts(kTenGigabit)).memory_bytes, read_bytes(m) + m.embedding_bytes);
  const GroupPlacement p = place_groups(nodes, m, LinkCosts(kTenGigabit), {kContext4096, Strategy::Speed});
  ASSERT_EQ(p.stages.size(), 2u) << p.reason;
  for (const GroupStage& stage : p.stages) EXPECT_EQ(stage.members.size(), 1u);
}

TEST(TensorGroups, TheMemoryStrategyAndFootprintsWithoutGatherSizesKeepNodesAlone) {
  const std::vector<NodeCapacity> nodes = {{"a", 32 * kGB, 20e9}, {"b", 32 * kGB, 20e9}};
  const GroupPlacement memory =
      place_groups(nodes, model_70b(), LinkCosts(kTenGigabit), {kContext4096, Strategy::Memory});
  EXPECT_EQ(memory.stages.size(), 2u);
  ModelFootprint unknown = model_70b();
  unknown.layer_gathered_bytes.clear();
  const GroupPlacement speed = place_groups(nodes, unknown, LinkCosts(kTenGigabit), {kContext4096, Strategy::Speed});
  EXPECT_EQ(speed.stages.size(), 2u);
  for (const GroupPlacement* p : {&memory, &speed}) {
    for (const GroupStage& stage : p->stages) EXPECT_EQ(stage.members.size(), 1u);
  }
}

TEST(TensorGroups, TooLittleMemoryInEveryGroupingSaysWhatIsMissing) {
  const std::vector<NodeCapacity> nodes = {{"a", 8 * kGB, 20e9}, {"b", 8 * kGB, 20e9}};
  try {
    place_groups(nodes, model_70b(), LinkCosts(kTenGigabit), {kContext4096, Strategy::Speed});
    ADD_FAILURE() << "placed";
  } catch (const DoesNotFit& e) {
    EXPECT_GT(e.missing_bytes(), 0u);
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

// A placement made by hand is predicted as place_groups would predict it: a group with shares by
// speed as one_group_seconds says, one by other shares reading as slowly as its member slowest for
// its share, and a pipeline of nodes alone with a hop between stages.
TEST(TensorGroups, APlacementMadeByHandIsPredictedByTheSameModel) {
  const ModelFootprint m = model_70b();
  const std::vector<NodeCapacity> nodes = {{"a", 64 * kGB, 30e9}, {"b", 64 * kGB, 10e9}};
  const LinkCosts links(kTenGigabit);
  const PlacementRequest request{kContext4096, Strategy::Speed};
  Placement by_speed{0, {{"a", 0, 80, {{"a", 0.75}, {"b", 0.25}}}}};
  EXPECT_NEAR(predict_placement(by_speed, nodes, m, links, request), one_group_seconds(m, 40e9, kTenGigabit, 0.75),
              1e-9);
  // Half each: b reads its half at 10 GB/s, as slowly as a group of 20 GB/s.
  Placement halves{0, {{"a", 0, 80, {{"a", 0.5}, {"b", 0.5}}}}};
  EXPECT_NEAR(predict_placement(halves, nodes, m, links, request), one_group_seconds(m, 20e9, kTenGigabit, 0.5),
              1e-9);
  Placement pipeline{0, {{"a", 0, 60}, {"b", 60, 80}}};
  const double first = 60 * 490e6 / 30e9;
  const double second = (20 * 490e6 + 500e6) / 10e9;
  EXPECT_NEAR(predict_placement(pipeline, nodes, m, links, request), first + kDefaultHopSeconds + second, 1e-9);
  Placement stranger{0, {{"c", 0, 80}}};
  EXPECT_THROW(predict_placement(stranger, nodes, m, links, request), std::invalid_argument);
}

// Seven nodes are more than every grouping is searched for: the pipeline of single nodes and one
// group of all are compared, and on a fast link the group wins.
TEST(TensorGroups, ManyNodesCompareThePipelineWithOneGroup) {
  const ModelFootprint m = model_70b();
  std::vector<NodeCapacity> nodes;
  for (const char* id : {"n1", "n2", "n3", "n4", "n5", "n6", "n7"}) nodes.push_back({id, 16 * kGB, 20e9});
  ASSERT_GT(nodes.size(), kMaxNodesForEveryGrouping);
  const GroupPlacement p = place_groups(nodes, m, LinkCosts(kTenGigabit), {kContext4096, Strategy::Speed});
  ASSERT_EQ(p.stages.size(), 1u) << p.reason;
  EXPECT_EQ(p.stages[0].members.size(), 7u);
  EXPECT_NEAR(p.predicted_seconds_per_token, one_group_seconds(m, 140e9, kTenGigabit, 6.0 / 7.0), 1e-9);
}

}  // namespace
}  // namespace strata::cluster
