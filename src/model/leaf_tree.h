// The order in which o and the FFN's down add up the parts of their input. Their input's
// columns are cut into a fixed number of leaves (the same for one Model and for any group); a
// leaf's product is one matmul over its columns, and the leaves' products add in one binary
// tree over them. A group's member that holds some leaves adds up the subtrees wholly its own
// and sends those few sums; every member then finishes the tree, and gets the bits one Model
// gets: each node of the tree is always the sum of its two children, whoever adds them.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "tensor/matmul.h"

namespace strata::model {

// Leaves [first, last) of the tree over `count` leaves: the root is [0, count), and a node of
// more than one leaf is its left child [first, mid) plus its right child [mid, last), mid =
// first + (last - first + 1) / 2. So a group of two that shares the leaves out evenly (the
// odd one to the first member) holds one child of the root each, and sends one sum each.
struct LeafNode {
  int first = 0;
  int last = 0;
  bool operator==(const LeafNode&) const = default;
};

// The root of the tree over `count` leaves (count >= 1).
LeafNode leaf_root(int count);

// The fewest nodes that cover leaves [first, last) of `count` and no other, left to right: the
// sums a member holding those leaves sends.
std::vector<LeafNode> leaf_cover(int count, int first, int last);

// The steps (tensor::LeafProgram) that add up, from leaves [first, last) of `count` alone (the
// program's leaf 0 is leaf `first`), the sums of leaf_cover(count, first, last), into outputs
// in its order: each node as add_leaf_tree adds it.
std::vector<tensor::LeafStep> leaf_steps(int count, int first, int last);

// out[0, width) = node `target`'s sum, from the sums of `known` nodes (values[i] is known[i]'s,
// width floats), adding a node's children where it is not known. Throws std::invalid_argument
// where a leaf under target is neither known nor under a known node.
void add_leaf_tree(LeafNode target, std::span<const LeafNode> known, std::span<const float* const> values,
                   size_t width, float* out);

}  // namespace strata::model
