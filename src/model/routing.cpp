#include "model/routing.h"

#include <algorithm>
#include <cstddef>

namespace strata::model {

void choose_experts(std::span<const float> ranked, int group_count, int groups_used, std::span<int> chosen,
                    std::vector<int>& order) {
  const int experts = static_cast<int>(ranked.size());
  const auto higher = [&](int a, int b) { return ranked[a] > ranked[b] || (ranked[a] == ranked[b] && a < b); };
  order.resize(static_cast<size_t>(experts));
  for (int e = 0; e < experts; ++e) order[static_cast<size_t>(e)] = e;
  auto candidates_end = order.end();
  if (group_count > 1) {
    const int group_size = experts / group_count;
    std::vector<float> group_scores(static_cast<size_t>(group_count));
    for (int g = 0; g < group_count; ++g) {
      const auto first = order.begin() + g * group_size;
      std::partial_sort(first, first + 2, first + group_size, higher);
      group_scores[static_cast<size_t>(g)] = ranked[first[0]] + ranked[first[1]];
    }
    std::vector<int> groups(static_cast<size_t>(group_count));
    for (int g = 0; g < group_count; ++g) groups[static_cast<size_t>(g)] = g;
    std::partial_sort(groups.begin(), groups.begin() + groups_used, groups.end(), [&](int a, int b) {
      return group_scores[a] > group_scores[b] || (group_scores[a] == group_scores[b] && a < b);
    });
    // The chosen groups' experts, in index order, are the candidates.
    std::sort(groups.begin(), groups.begin() + groups_used);
    size_t kept = 0;
    for (int j = 0; j < groups_used; ++j) {
      for (int e = groups[static_cast<size_t>(j)] * group_size; e < (groups[static_cast<size_t>(j)] + 1) * group_size; ++e) {
        order[kept++] = e;
      }
    }
    candidates_end = order.begin() + static_cast<std::ptrdiff_t>(kept);
  }
  const auto k = static_cast<std::ptrdiff_t>(chosen.size());
  std::partial_sort(order.begin(), order.begin() + k, candidates_end, higher);
  std::copy(order.begin(), order.begin() + k, chosen.begin());
}

}  // namespace strata::model
