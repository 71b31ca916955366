// The fixed tree that o's and down's leaves add up in: a member's cover of its leaves, and the
// root from every member's sums, bit for bit what the tree over all the leaves gives.
#include "model/leaf_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

namespace strata::model {
namespace {

// The tree written out on its own: the sum of leaves [first, last), halves added left +
// right, the left half the larger by one where the leaves are odd.
float reference_sum(const std::vector<float>& leaves, int first, int last) {
  if (last - first == 1) return leaves[static_cast<size_t>(first)];
  const int left = (last - first + 1) / 2;
  return reference_sum(leaves, first, first + left) + reference_sum(leaves, first + left, last);
}

float reference_root(const std::vector<float>& leaves) {
  return reference_sum(leaves, 0, static_cast<int>(leaves.size()));
}

// Sums of `nodes` from one-float leaves.
std::vector<float> sums_of(int count, const std::vector<LeafNode>& nodes, const std::vector<float>& leaves) {
  std::vector<LeafNode> known;
  std::vector<const float*> values;
  for (int i = 0; i < count; ++i) {
    known.push_back({i, i + 1});
    values.push_back(&leaves[static_cast<size_t>(i)]);
  }
  std::vector<float> sums(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) add_leaf_tree(nodes[i], known, values, 1, &sums[i]);
  return sums;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// The node of the tree over `count` leaves whose child `node` is (node is not the root).
LeafNode parent_of(int count, LeafNode node) {
  LeafNode at = leaf_root(count);
  while (true) {
    const int mid = at.first + (at.last - at.first + 1) / 2;
    const LeafNode left{at.first, mid}, right{mid, at.last};
    if (left == node || right == node) return at;
    at = node.first < mid ? left : right;
  }
}

TEST(LeafTree, ACoverIsTheFewestNodesOverExactlyItsLeaves) {
  for (int count = 1; count <= 40; ++count) {
    for (int first = 0; first < count; ++first) {
      for (int last = first + 1; last <= count; ++last) {
        const std::vector<LeafNode> cover = leaf_cover(count, first, last);
        int next = first;
        for (const LeafNode& node : cover) {
          EXPECT_EQ(node.first, next) << count << " " << first << " " << last;
          next = node.last;
          // Its parent reaches outside [first, last): else the parent would stand for both.
          if (node == leaf_root(count)) continue;
          const LeafNode parent = parent_of(count, node);
          EXPECT_TRUE(parent.first < first || parent.last > last)
              << count << " " << first << " " << last << " " << node.first << ".." << node.last;
        }
        EXPECT_EQ(next, last);
      }
    }
  }
  EXPECT_EQ(leaf_cover(22, 0, 22), (std::vector<LeafNode>{{0, 22}}));
  // An even split of two members: one sum each; of three, a few.
  EXPECT_EQ(leaf_cover(22, 0, 11), (std::vector<LeafNode>{{0, 11}}));
  EXPECT_EQ(leaf_cover(22, 11, 22), (std::vector<LeafNode>{{11, 22}}));
  EXPECT_EQ(leaf_cover(9, 0, 5), (std::vector<LeafNode>{{0, 5}}));
  EXPECT_EQ(leaf_cover(22, 8, 15), (std::vector<LeafNode>{{8, 9}, {9, 11}, {11, 14}, {14, 15}}));
}

TEST(LeafTree, TheRootFromEveryMembersSumsIsTheTreeOverAllLeaves) {
  std::mt19937 rng(7);
  // Magnitudes far apart, so that the order of the additions shows in the bits.
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  int differs_from_a_left_fold = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 40);
    std::vector<float> leaves(static_cast<size_t>(count));
    for (float& v : leaves) v = std::ldexp(mantissa(rng), exponent(rng));
    // 1 to 4 members, each a run of leaves, in order.
    std::vector<int> cuts{0, count};
    const int members = 1 + static_cast<int>(rng() % std::min(4, count));
    while (static_cast<int>(cuts.size()) < members + 1) {
      const int cut = 1 + static_cast<int>(rng() % static_cast<unsigned>(count - 1 > 0 ? count - 1 : 1));
      if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end()) cuts.push_back(cut);
    }
    std::sort(cuts.begin(), cuts.end());
    std::vector<LeafNode> all;
    std::vector<float> all_sums;
    for (size_t m = 0; m + 1 < cuts.size(); ++m) {
      const std::vector<LeafNode> cover = leaf_cover(count, cuts[m], cuts[m + 1]);
      // A member knows only its own leaves.
      std::vector<LeafNode> known;
      std::vector<const float*> values;
      for (int i = cuts[m]; i < cuts[m + 1]; ++i) {
        known.push_back({i, i + 1});
        values.push_back(&leaves[static_cast<size_t>(i)]);
      }
      for (const LeafNode& node : cover) {
        float sum;
        add_leaf_tree(node, known, values, 1, &sum);
        all.push_back(node);
        all_sums.push_back(sum);
      }
    }
    std::vector<const float*> values;
    for (const float& sum : all_sums) values.push_back(&sum);
    float root;
    add_leaf_tree(leaf_root(count), all, values, 1, &root);
    ASSERT_EQ(bits(root), bits(reference_root(leaves))) << "trial " << trial;
    ASSERT_EQ(bits(root), bits(sums_of(count, {leaf_root(count)}, leaves)[0]));
    float fold = leaves[0];
    for (int i = 1; i < count; ++i) fold = fold + leaves[static_cast<size_t>(i)];
    if (bits(fold) != bits(root)) ++differs_from_a_left_fold;
  }
  EXPECT_GT(differs_from_a_left_fold, 100);  // the order is the tree's, not the leaves' in turn
}

// Runs a leaf program's steps over one-float leaves [first, ...) as tensor::matmul would.
std::vector<float> run_steps(const std::vector<tensor::LeafStep>& steps, const std::vector<float>& leaves, int first,
                             size_t outputs) {
  std::vector<float> slots(tensor::kLeafSlots, NAN), out(outputs, NAN);
  for (const tensor::LeafStep& step : steps) {
    switch (step.kind) {
      case tensor::LeafStep::Kind::Leaf: slots[step.slot] = leaves[static_cast<size_t>(first + step.arg)]; break;
      case tensor::LeafStep::Kind::Add: slots[step.slot] = slots[step.slot] + slots[step.arg]; break;
      case tensor::LeafStep::Kind::Store: out.at(step.arg) = slots[step.slot]; break;
    }
  }
  return out;
}

TEST(LeafTree, AProgramsStepsAddUpACoversSumsFromItsLeavesAlone) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (int count = 1; count <= 64; ++count) {
    std::vector<float> leaves(static_cast<size_t>(count));
    for (float& v : leaves) v = std::ldexp(mantissa(rng), exponent(rng));
    for (int first = 0; first < count; ++first) {
      for (int last = first + 1; last <= count; ++last) {
        const std::vector<LeafNode> cover = leaf_cover(count, first, last);
        const std::vector<float> sums = sums_of(count, cover, leaves);
        const std::vector<float> ran = run_steps(leaf_steps(count, first, last), leaves, first, cover.size());
        for (size_t i = 0; i < cover.size(); ++i) {
          ASSERT_EQ(bits(ran[i]), bits(sums[i])) << count << " " << first << " " << last << " sum " << i;
        }
      }
    }
  }
}

TEST(LeafTree, AddsWholeRowsElementByElement) {
  const std::vector<float> a{1, 2, 3}, b{10, 20, 30}, c{100, 200, 300};
  const std::vector<LeafNode> known{{0, 1}, {1, 2}, {2, 3}};
  const std::vector<const float*> values{a.data(), b.data(), c.data()};
  std::vector<float> out(3);
  add_leaf_tree(leaf_root(3), known, values, 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{111, 222, 333}));
}

TEST(LeafTree, RefusesALeafWithoutASum) {
  const float one = 1.0f;
  const std::vector<LeafNode> known{{0, 1}, {2, 3}};
  const std::vector<const float*> values{&one, &one};
  float out;
  EXPECT_THROW(add_leaf_tree(leaf_root(3), known, values, 1, &out), std::invalid_argument);
  EXPECT_THROW(add_leaf_tree({4, 4}, known, values, 1, &out), std::invalid_argument);
}

}  // namespace
}  // namespace strata::model
