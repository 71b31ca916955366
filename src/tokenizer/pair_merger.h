// The merge loop both BPE flavours share: start from single characters and keep merging the
// adjacent pair with the highest priority (the leftmost among equals) until no pair qualifies.
#pragma once

#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "tokenizer/unicode.h"

namespace strata::tokenizer {

// `priority_of(left, right)` returns the priority of merging two adjacent symbols (views into
// `text`, so left.data() + left.size() == right.data()), or nullopt if they cannot merge.
// Returns the final symbols in order. A priority queue with stale-entry checks keeps this
// O(n log n) for a piece of n characters.
template <typename PriorityOf>
std::vector<std::string_view> merge_pairs(std::string_view text, PriorityOf priority_of) {
  struct Symbol {
    size_t start;
    size_t length;  // 0 once merged into its left neighbour
    int prev;
    int next;
  };
  struct Candidate {
    double priority;
    int left;
    int right;
    size_t length;  // of left + right when proposed; any other length now means it is stale
  };
  struct LowerPriority {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
    }
  };

  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = unicode::decode_utf8_at(text, pos).length;
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({pos, length, index - 1, pos + length == text.size() ? -1 : index + 1});
    pos += length;
  }
  const auto view = [&](int i) { return text.substr(symbols[i].start, symbols[i].length); };

  std::priority_queue<Candidate, std::vector<Candidate>, LowerPriority> candidates;
  const auto propose = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    if (std::optional<double> priority = priority_of(view(left), view(right))) {
      candidates.push({*priority, left, right, symbols[left].length + symbols[right].length});
    }
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) propose(i - 1, i);

  while (!candidates.empty()) {
    const Candidate best = candidates.top();
    candidates.pop();
    Symbol& left = symbols[best.left];
    Symbol& right = symbols[best.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != best.length) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = best.left;
    propose(left.prev, best.left);
    propose(best.left, left.next);
  }

  std::vector<std::string_view> result;
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) result.push_back(view(i));
  return result;
}

}  // namespace strata::tokenizer
