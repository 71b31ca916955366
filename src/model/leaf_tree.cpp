#include "model/leaf_tree.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace strata::model {
namespace {

int middle(LeafNode node) { return node.first + (node.last - node.first + 1) / 2; }
LeafNode left_child(LeafNode node) { return {node.first, middle(node)}; }
LeafNode right_child(LeafNode node) { return {middle(node), node.last}; }
bool is_leaf(LeafNode node) { return node.last - node.first == 1; }

void cover_into(LeafNode node, int first, int last, std::vector<LeafNode>& out) {
  if (node.last <= first || node.first >= last) return;
  if (node.first >= first && node.last <= last) {
    out.push_back(node);
    return;
  }
  cover_into(left_child(node), first, last, out);
  cover_into(right_child(node), first, last, out);
}

// Steps that leave `node`'s sum in `slot`, from leaf `first` on.
void steps_into(LeafNode node, int first, int slot, std::vector<tensor::LeafStep>& steps) {
  if (slot >= tensor::kLeafSlots) throw std::invalid_argument("a tree deeper than a leaf program's slots");
  if (is_leaf(node)) {
    steps.push_back({tensor::LeafStep::Kind::Leaf, static_cast<uint8_t>(slot), static_cast<uint16_t>(node.first - first)});
    return;
  }
  steps_into(left_child(node), first, slot, steps);
  steps_into(right_child(node), first, slot + 1, steps);
  steps.push_back({tensor::LeafStep::Kind::Add, static_cast<uint8_t>(slot), static_cast<uint16_t>(slot + 1)});
}

// Node's sum into out. `scratch` holds a width of floats per level below it.
void add_node(LeafNode node, std::span<const LeafNode> known, std::span<const float* const> values, size_t width,
              float* out, float* scratch) {
  const auto found = std::find(known.begin(), known.end(), node);
  if (found != known.end()) {
    const float* value = values[static_cast<size_t>(found - known.begin())];
    std::copy(value, value + width, out);
    return;
  }
  if (is_leaf(node)) throw std::invalid_argument("leaf " + std::to_string(node.first) + " has no known sum");
  add_node(left_child(node), known, values, width, out, scratch + width);
  add_node(right_child(node), known, values, width, scratch, scratch + width);
  for (size_t i = 0; i < width; ++i) out[i] = out[i] + scratch[i];
}

}  // namespace

LeafNode leaf_root(int count) { return {0, count}; }

std::vector<LeafNode> leaf_cover(int count, int first, int last) {
  std::vector<LeafNode> nodes;
  cover_into(leaf_root(count), first, last, nodes);
  return nodes;
}

std::vector<tensor::LeafStep> leaf_steps(int count, int first, int last) {
  std::vector<tensor::LeafStep> steps;
  const std::vector<LeafNode> cover = leaf_cover(count, first, last);
  for (size_t i = 0; i < cover.size(); ++i) {
    steps_into(cover[i], first, 0, steps);
    steps.push_back({tensor::LeafStep::Kind::Store, 0, static_cast<uint16_t>(i)});
  }
  return steps;
}

void add_leaf_tree(LeafNode target, std::span<const LeafNode> known, std::span<const float* const> values,
                   size_t width, float* out) {
  if (known.size() != values.size()) throw std::invalid_argument("a sum for every known node");
  if (target.last <= target.first) throw std::invalid_argument("an empty node of leaves");
  int depth = 0;
  for (int leaves = target.last - target.first; leaves > 1; leaves = (leaves + 1) / 2) ++depth;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(depth + 1) * width);
  add_node(target, known, values, width, out, scratch.data());
}

}  // namespace strata::model
