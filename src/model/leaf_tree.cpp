#include "model/leaf_tree.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace strata::model {
namespace {

int end_of(LeafNode node, int count) { return std::min(count, node.first + (1 << node.level)); }

LeafNode left_child(LeafNode node) { return {node.first, node.level - 1}; }
LeafNode right_child(LeafNode node) { return {node.first + (1 << (node.level - 1)), node.level - 1}; }

void cover_into(int count, LeafNode node, int first, int last, std::vector<LeafNode>& out) {
  const int end = end_of(node, count);
  if (node.first >= end || end <= first || node.first >= last) return;
  if (node.first >= first && end <= last) {
    out.push_back(node);
    return;
  }
  cover_into(count, left_child(node), first, last, out);
  cover_into(count, right_child(node), first, last, out);
}

// Node's sum into out; false for an empty node. `scratch` holds level * width floats.
bool add_node(int count, LeafNode node, std::span<const LeafNode> known, std::span<const float* const> values,
              size_t width, float* out, float* scratch) {
  if (node.first >= count) return false;
  const auto found = std::find(known.begin(), known.end(), node);
  if (found != known.end()) {
    const float* value = values[static_cast<size_t>(found - known.begin())];
    std::copy(value, value + width, out);
    return true;
  }
  if (node.level == 0) throw std::invalid_argument("leaf " + std::to_string(node.first) + " has no known sum");
  add_node(count, left_child(node), known, values, width, out, scratch + width);
  if (add_node(count, right_child(node), known, values, width, scratch, scratch + width)) {
    for (size_t i = 0; i < width; ++i) out[i] = out[i] + scratch[i];
  }
  return true;
}

// Steps that leave `node`'s sum in `slot`, from leaf `first` on.
void steps_into(int count, LeafNode node, int first, int slot, std::vector<tensor::LeafStep>& steps) {
  if (slot >= tensor::kLeafSlots) throw std::invalid_argument("a tree deeper than a leaf program's slots");
  if (node.level == 0) {
    steps.push_back({tensor::LeafStep::Kind::Leaf, static_cast<uint8_t>(slot), static_cast<uint16_t>(node.first - first)});
    return;
  }
  steps_into(count, left_child(node), first, slot, steps);
  if (right_child(node).first >= count) return;
  steps_into(count, right_child(node), first, slot + 1, steps);
  steps.push_back({tensor::LeafStep::Kind::Add, static_cast<uint8_t>(slot), static_cast<uint16_t>(slot + 1)});
}

}  // namespace

std::vector<tensor::LeafStep> leaf_steps(int count, int first, int last) {
  std::vector<tensor::LeafStep> steps;
  const std::vector<LeafNode> cover = leaf_cover(count, first, last);
  for (size_t i = 0; i < cover.size(); ++i) {
    steps_into(count, cover[i], first, 0, steps);
    steps.push_back({tensor::LeafStep::Kind::Store, 0, static_cast<uint16_t>(i)});
  }
  return steps;
}

LeafNode leaf_root(int count) {
  int level = 0;
  while ((1 << level) < count) ++level;
  return {0, level};
}

std::vector<LeafNode> leaf_cover(int count, int first, int last) {
  std::vector<LeafNode> nodes;
  cover_into(count, leaf_root(count), first, last, nodes);
  return nodes;
}

void add_leaf_tree(int count, LeafNode target, std::span<const LeafNode> known, std::span<const float* const> values,
                   size_t width, float* out) {
  if (known.size() != values.size()) throw std::invalid_argument("a sum for every known node");
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(target.level + 1) * width);
  if (!add_node(count, target, known, values, width, out, scratch.data())) {
    throw std::invalid_argument("node " + std::to_string(target.first) + " lies past the leaves");
  }
}

}  // namespace strata::model
