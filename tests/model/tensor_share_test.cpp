// How a tensor-parallel group's shares are planned: in proportion to the members' weights, in
// units of rows, every member at least one unit, and what cannot be shared refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/tensor_share.h"

namespace strata::model {
namespace {

// The shared model's dimensions: 4 KV heads of 2 query heads, 172 FFN rows (11 units, the
// last 12 rows), 64 embedding rows (4 units) and 512 vocabulary rows (32 units).
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
  EXPECT_EQ(plan({2.5}), (std::vector<TensorShare>{{{0, 4}, {0, 172}, {0, 64}, {0, 512}}}));
}

// Odd unit counts leave a unit over, which goes to the lower member.
TEST(PlanTensorShares, EqualWeightsShareEvenlyTheRestToTheLowerMember) {
  EXPECT_EQ(plan({1, 1}), (std::vector<TensorShare>{{{0, 2}, {0, 96}, {0, 32}, {0, 256}},
                                                    {{2, 4}, {96, 172}, {32, 64}, {256, 512}}}));
  EXPECT_EQ(plan({1, 1, 1}), (std::vector<TensorShare>{{{0, 2}, {0, 64}, {0, 32}, {0, 176}},
                                                       {{2, 3}, {64, 128}, {32, 48}, {176, 352}},
                                                       {{3, 4}, {128, 172}, {48, 64}, {352, 512}}}));
}

// 3:1 of 11 FFN units is 8.25 and 2.75: rounded down to 8 and 2, the unit over goes to the
// member furthest below its ideal share.
TEST(PlanTensorShares, UnevenWeightsShareByLargestRemainders) {
  EXPECT_EQ(plan({3, 1}), (std::vector<TensorShare>{{{0, 3}, {0, 128}, {0, 48}, {0, 384}},
                                                    {{3, 4}, {128, 172}, {48, 64}, {384, 512}}}));
  // Measured speeds need not be whole numbers or add up to anything.
  EXPECT_EQ(plan({0.3, 0.1}), plan({3, 1}));
}

TEST(PlanTensorShares, EveryMemberGetsAtLeastOneUnit) {
  const auto shares = plan({1, 1e-9});
  EXPECT_EQ(shares[1], (TensorShare{{3, 4}, {160, 172}, {48, 64}, {496, 512}}));
  const auto three = plan({1e-6, 1, 1e-6});
  EXPECT_EQ(three[0].kv_heads, (RowRange{0, 1}));
  EXPECT_EQ(three[1].kv_heads, (RowRange{1, 3}));
  EXPECT_EQ(three[2].kv_heads, (RowRange{3, 4}));
}

// Down's input in whole activation blocks where the FFN dimension allows: units of 256 rows
// while every member gets 4 of them on average, else of 32 rows, else of 16 (dreams_like's 172).
TEST(PlanTensorShares, FfnRowsComeInWholeActivationBlocksWhereTheDimensionAllows) {
  Config c = dreams_like();
  c.ffn_dim = 2048;  // 8 units of 256
  const auto ffn_rows = [&](const std::vector<double>& weights) {
    std::vector<RowRange> rows;
    for (const TensorShare& share : plan_tensor_shares(c, weights)) rows.push_back(share.ffn_rows);
    return rows;
  };
  EXPECT_EQ(ffn_rows({1, 2}), (std::vector<RowRange>{{0, 768}, {768, 2048}}));
  // 3 members would get fewer than 4 units of 256 each: units of 32, 64 of them.
  EXPECT_EQ(ffn_rows({1, 1, 1}), (std::vector<RowRange>{{0, 704}, {704, 1376}, {1376, 2048}}));
  c.ffn_dim = 224;  // 7 units of 32
  EXPECT_EQ(ffn_rows({1, 1, 1}), (std::vector<RowRange>{{0, 96}, {96, 160}, {160, 224}}));
  c.ffn_dim = 96;  // 3 units of 32 for 4 members: units of 16
  EXPECT_EQ(ffn_rows({1, 1, 1, 1}), (std::vector<RowRange>{{0, 32}, {32, 64}, {64, 80}, {80, 96}}));
}

// A model without experts has empty expert ranges (the tests above compare them too); with
// them, each expert's rows (64: 2 units of 32) and the shared expert's (96: 3 units of 32)
// are shared out as the FFN's.
TEST(PlanTensorShares, SharesTheExpertsRowsAsTheFfns) {
  Config c = dreams_like();
  c.expert_count = 8;
  c.experts_per_token = 2;
  c.expert_ffn_dim = 64;
  c.shared_expert_ffn_dim = 96;
  const auto shares = plan_tensor_shares(c, std::vector<double>{1, 2});
  EXPECT_EQ(shares[0].expert_rows, (RowRange{0, 32}));
  EXPECT_EQ(shares[1].expert_rows, (RowRange{32, 64}));
  EXPECT_EQ(shares[0].shared_expert_rows, (RowRange{0, 32}));
  EXPECT_EQ(shares[1].shared_expert_rows, (RowRange{32, 96}));
  c.shared_expert_ffn_dim = 0;
  EXPECT_EQ(plan_tensor_shares(c, std::vector<double>{1, 2})[1].shared_expert_rows, (RowRange{}));
}

TEST(PlanTensorShares, RefusesMoreMembersThanKvHeads) {
  EXPECT_EQ(refusal(dreams_like(), {1, 1, 1, 1, 1}),
            "a group of 5 members cannot share 4 KV heads: each member needs at least one");
}

TEST(PlanTensorShares, RefusesMoreMembersThanUnitsOfADimension) {
  Config c = dreams_like();
  c.kv_head_count = 8;
  EXPECT_EQ(refusal(c, {1, 1, 1, 1, 1}),
            "a group of 5 members cannot share 4 units of embedding rows: each member needs at least one");
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
