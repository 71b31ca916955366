// Which experts a token runs: the k best ranked scores, and DeepSeek V3's group-limited choice,
// on scores worked out by hand.
#include <gtest/gtest.h>

#include <vector>

#include "model/routing.h"

namespace strata::model {
namespace {

std::vector<int> chosen(const std::vector<float>& ranked, int k, int group_count = 0, int groups_used = 0) {
  std::vector<int> experts(static_cast<size_t>(k), -1);
  std::vector<int> scratch{5, 5, 5};  // left over from another call: choose_experts must not read it
  choose_experts(ranked, group_count, groups_used, experts, scratch);
  return experts;
}

TEST(ChooseExperts, TakesTheHighestFirstAndTiesGoToTheLowerIndex) {
  const std::vector<float> ranked{0.1f, 0.5f, 0.5f, 0.3f, -0.2f};
  EXPECT_EQ(chosen(ranked, 2), (std::vector<int>{1, 2}));
  EXPECT_EQ(chosen(ranked, 4), (std::vector<int>{1, 2, 3, 0}));
  EXPECT_EQ(chosen(ranked, 1, 1, 1), (std::vector<int>{1}));  // one group: no limit
}

// Groups {0, 1}, {2, 3}, {4, 5}, {6, 7} score 0.9 + 0, 0.4 + 0.4, 0.5 + 0.2 and 0.1 + 0.1: the
// best two are the first two groups, so expert 4 (0.5) is left out for experts 2 and 3 (0.4).
TEST(ChooseExperts, KeepsOnlyTheExpertsOfTheBestGroups) {
  const std::vector<float> ranked{0.9f, 0.0f, 0.4f, 0.4f, 0.5f, 0.2f, 0.1f, 0.1f};
  EXPECT_EQ(chosen(ranked, 3), (std::vector<int>{0, 4, 2}));
  EXPECT_EQ(chosen(ranked, 3, 4, 2), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(chosen(ranked, 4, 4, 3), (std::vector<int>{0, 4, 2, 3}));
}

// A group scores the sum of its two best, not its best: {1, 0, 0} sums to 1 and {0.6, 0.6, 0}
// to 1.2, so the second group wins though the first holds the highest score.
TEST(ChooseExperts, GroupsScoreTheirTwoBestTogether) {
  const std::vector<float> ranked{1.0f, 0.0f, 0.0f, 0.6f, 0.6f, 0.0f};
  EXPECT_EQ(chosen(ranked, 2, 2, 1), (std::vector<int>{3, 4}));
}

// Groups of equal scores (0.2 + 0.3 each): the lower group is kept.
TEST(ChooseExperts, GroupTiesGoToTheLowerGroup) {
  const std::vector<float> ranked{0.2f, 0.3f, 0.3f, 0.2f};
  EXPECT_EQ(chosen(ranked, 2, 2, 1), (std::vector<int>{1, 0}));
}

}  // namespace
}  // namespace strata::model
