// How a tensor-parallel group's shares are planned: in proportion to the members' weights, in
// units of rows (of o's and down's leaves for the KV heads and the FFN's rows), every member at
// least one unit, and what cannot be shared refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/tensor_share.h"

namespace strata::model {
namespace {

// The shared model's dimensions, F32 (blocks of one element): 4 KV heads of 2 query heads (a
// leaf of o's input each), 172 FFN rows (9 leaves of down's input: the least leaf of 172 / 8 =
// 21 rows, as no size from 21 to 42 divides 172, and a last one of 4), 64 embedding rows (4
// units of 16) and 512 vocabulary rows (32 units).
Config dreams_like() {
  Config c;
  c.arch_name = "llama";
  c.head_count = 8;
  c.kv_head_count = 4;
  c.head_dim = 8;
  c.ffn_dim = 172;
  c.embedding_dim = 64;
  c.vocab_size = 512;
  return c;
}

std::vector<TensorShare> plan(const std::vector<double>& weights) { return plan_tensor_shares(dreams_like(), weights); }

// The message plan throws for `weights`.
std::string refusal(const Config& c, const std::vector<double>& weights) {
  try {
    plan_tensor_shares(c, weights);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(planned)";
}

TEST(PlanTensorShares, OneMemberHoldsEverything) {
  EXPECT_EQ(plan({2.5}), (std::vector<TensorShare>{{{0, 4}, {0, 172}, {0, 512}}}));
}

// Odd unit counts leave a unit over, which goes to the lower member.
TEST(PlanTensorShares, EqualWeightsShareEvenlyTheRestToTheLowerMember) {
  EXPECT_EQ(plan({1, 1}), (std::vector<TensorShare>{{{0, 2}, {0, 105}, {0, 256}},
                                                    {{2, 4}, {105, 172}, {256, 512}}}));
  EXPECT_EQ(plan({1, 1, 1}), (std::vector<TensorShare>{{{0, 2}, {0, 63}, {0, 176}},
                                                       {{2, 3}, {63, 126}, {176, 352}},
                                                       {{3, 4}, {126, 172}, {352, 512}}}));
}

// 3:1 of 9 FFN leaves is 6.75 and 2.25: rounded down to 6 and 2, the leaf over goes to the
// member furthest below its ideal share.
TEST(PlanTensorShares, UnevenWeightsShareByLargestRemainders) {
  EXPECT_EQ(plan({3, 1}), (std::vector<TensorShare>{{{0, 3}, {0, 147}, {0, 384}},
                                                    {{3, 4}, {147, 172}, {384, 512}}}));
  // Measured speeds need not be whole numbers or add up to anything.
  EXPECT_EQ(plan({0.3, 0.1}), plan({3, 1}));
}

TEST(PlanTensorShares, EveryMemberGetsAtLeastOneUnit) {
  const auto shares = plan({1, 1e-9});
  EXPECT_EQ(shares[1], (TensorShare{{3, 4}, {168, 172}, {496, 512}}));
  const auto three = plan({1e-6, 1, 1e-6});
  EXPECT_EQ(three[0].kv_heads, (RowRange{0, 1}));
  EXPECT_EQ(three[1].kv_heads, (RowRange{1, 3}));
  EXPECT_EQ(three[2].kv_heads, (RowRange{3, 4}));
}

// Down's input in leaves of whole weight blocks, at most 32 of them, of 256 rows or more where
// that leaves 8 or more, of one size where one up to twice the least divides the rows.
TEST(PlanTensorShares, FfnRowsComeInWholeLeavesOfDownsInput) {
  Config c = dreams_like();
  c.projection_block = 32;  // Q4_0 or Q8_0
  c.head_dim = 64;          // so that a KV head's 128 values are whole blocks
  c.ffn_dim = 2048;         // 64 blocks: leaves of 8 blocks, 256 rows
  EXPECT_EQ(projection_leaves(c).ffn_rows, 256);
  const auto ffn_rows = [&](const std::vector<double>& weights) {
    std::vector<RowRange> rows;
    for (const TensorShare& share : plan_tensor_shares(c, weights)) rows.push_back(share.ffn_rows);
    return rows;
  };
  // 1:2 of 8 leaves: 2.67 and 5.33, rounded down to 2 and 5, the leaf over to member 0.
  EXPECT_EQ(ffn_rows({1, 2}), (std::vector<RowRange>{{0, 768}, {768, 2048}}));
  EXPECT_EQ(ffn_rows({1, 1, 1}), (std::vector<RowRange>{{0, 768}, {768, 1536}, {1536, 2048}}));
  c.ffn_dim = 224;  // 7 blocks: fewer than 8 leaves of 256 rows, so leaves of one block
  EXPECT_EQ(projection_leaves(c).ffn_rows, 32);
  EXPECT_EQ(ffn_rows({1, 1, 1}), (std::vector<RowRange>{{0, 96}, {96, 160}, {160, 224}}));
  c.ffn_dim = 5632;  // TinyLlama: 176 blocks, 22 leaves of 256 rows
  EXPECT_EQ(projection_leaves(c).ffn_rows, 256);
  c.ffn_dim = 18944;  // 592 blocks: at most 32 leaves needs 19 blocks each; 37 divides 592
  EXPECT_EQ(projection_leaves(c).ffn_rows, 37 * 32);
  c.projection_block = 256;  // K-quants
  c.ffn_dim = 28672;         // Llama 70B: 112 super-blocks, 28 leaves of 4
  EXPECT_EQ(projection_leaves(c).ffn_rows, 1024);
}

// o's input in leaves of whole KV heads' query heads, as few heads as make whole weight blocks.
TEST(PlanTensorShares, KvHeadsComeInWholeLeavesOfOsInput) {
  Config c = dreams_like();  // 16 values a KV head, blocks of 1: a leaf a KV head
  EXPECT_EQ(projection_leaves(c).kv_heads, 1);
  c.projection_block = 256;  // 16 values a head: 16 KV heads would make a block, the model has 4
  EXPECT_EQ(projection_leaves(c).kv_heads, 4);
  EXPECT_EQ(projection_leaves(c).o_count(c), 1);
  c.head_count = 16;  // Qwen3-0.6B: 8 KV heads of 2 query heads of 128
  c.kv_head_count = 8;
  c.head_dim = 128;
  EXPECT_EQ(projection_leaves(c).kv_heads, 1);  // 256 values a KV head
  c.head_count = 8;  // 1 query head a KV head: 2 heads make a block
  EXPECT_EQ(projection_leaves(c).kv_heads, 2);
  c.ffn_dim = 3072;
  const auto shares = plan_tensor_shares(c, std::vector<double>{1, 1, 1});
  EXPECT_EQ(shares[0].kv_heads, (RowRange{0, 4}));
  EXPECT_EQ(shares[1].kv_heads, (RowRange{4, 6}));
  EXPECT_EQ(shares[2].kv_heads, (RowRange{6, 8}));
}

// A model without experts has empty expert ranges (the tests above compare them too); with
// them, each expert's rows (64: 2 leaves of 32) and the shared expert's (96: 3 leaves of 32)
// are shared out as the FFN's, in whole leaves of their down's input.
TEST(PlanTensorShares, SharesTheExpertsRowsAsTheFfns) {
  Config c = dreams_like();
  c.expert_count = 8;
  c.experts_per_token = 2;
  c.expert_ffn_dim = 64;
  c.shared_expert_ffn_dim = 96;
  c.expert_down_block = 32;
  const auto shares = plan_tensor_shares(c, std::vector<double>{1, 2});
  EXPECT_EQ(shares[0].expert_rows, (RowRange{0, 32}));
  EXPECT_EQ(shares[1].expert_rows, (RowRange{32, 64}));
  EXPECT_EQ(shares[0].shared_expert_rows, (RowRange{0, 32}));
  EXPECT_EQ(shares[1].shared_expert_rows, (RowRange{32, 96}));
  c.shared_expert_ffn_dim = 0;
  EXPECT_EQ(plan_tensor_shares(c, std::vector<double>{1, 2})[1].shared_expert_rows, (RowRange{}));
}

// An expert's down adds up at most 8 leaves, of 128 rows or more where that leaves 4 or more.
TEST(PlanTensorShares, ExpertsDownsAddUpInAFewLeaves) {
  Config c = dreams_like();
  c.expert_count = 128;
  c.experts_per_token = 8;
  c.expert_ffn_dim = 768;  // Qwen3-30B-A3B
  c.expert_down_block = 32;
  EXPECT_EQ(projection_leaves(c).expert_rows, 128);
  EXPECT_EQ(projection_leaves(c).expert_count(c), 6);
  c.expert_down_block = 256;  // K-quants: 3 blocks, a leaf each
  EXPECT_EQ(projection_leaves(c).expert_rows, 256);
  c.expert_ffn_dim = 2880;  // gpt-oss: 90 blocks of 32; 12 a leaf at least, 15 divide them
  c.expert_down_block = 32;
  EXPECT_EQ(projection_leaves(c).expert_rows, 480);
  c.expert_ffn_dim = 64;  // 2 blocks: 2 leaves
  EXPECT_EQ(projection_leaves(c).expert_count(c), 2);
  c.shared_expert_ffn_dim = 1408;  // GLM-4.5-Air's: 44 blocks, 6 at least, 11 divide them
  EXPECT_EQ(projection_leaves(c).shared_expert_rows, 352);
  EXPECT_EQ(refusal(c, {1, 1, 1}), "a group of 3 members cannot share 2 leaves of expert rows: each member needs at least one");
}

TEST(PlanTensorShares, RefusesMoreMembersThanKvHeads) {
  EXPECT_EQ(refusal(dreams_like(), {1, 1, 1, 1, 1}),
            "a group of 5 members cannot share 4 leaves of KV heads: each member needs at least one");
}

TEST(PlanTensorShares, RefusesMoreMembersThanUnitsOfADimension) {
  Config c = dreams_like();
  c.kv_head_count = 8;
  c.vocab_size = 64;
  EXPECT_EQ(refusal(c, {1, 1, 1, 1, 1}),
            "a group of 5 members cannot share 4 units of vocabulary rows: each member needs at least one");
}

TEST(PlanTensorShares, RefusesWeightsThatAreNotPositive) {
  EXPECT_EQ(refusal(dreams_like(), {1, 0}),
            "member 1's weight 0 is not a positive number: every member of a group computes a share");
  EXPECT_NE(refusal(dreams_like(), {-1, 1}).find("member 0's weight"), std::string::npos);
  EXPECT_NE(refusal(dreams_like(), {1, std::numeric_limits<double>::quiet_NaN()}).find("member 1's weight"),
            std::string::npos);
  EXPECT_EQ(refusal(dreams_like(), {}), "a tensor-parallel group needs at least one member");
}

TEST(PlanTensorShares, RefusesLatentAttentionNamingIt) {
  Config c = dreams_like();
  c.arch_name = "deepseek2";
  c.mla.kv_rank = 64;
  EXPECT_EQ(refusal(c, {1, 1}),
            "tensor parallelism cannot split deepseek2's latent attention, whose heads all read one latent KV head");
}

}  // namespace
}  // namespace strata::model
