// Which experts a token of a Mixture-of-Experts layer runs, from its experts' ranked scores.
#pragma once

#include <span>
#include <vector>

namespace strata::model {

// Writes the k = chosen.size() experts of the highest `ranked` scores to `chosen`, the highest
// first, ties to the lower index. With group_count > 1 the experts fall into that many equal
// groups in index order, each group scores the sum of its two highest ranked scores, and the
// k come from the groups_used highest-scoring groups only (ties to the lower group). Each
// call's result depends on `ranked` alone; `order` is scratch.
void choose_experts(std::span<const float> ranked, int group_count, int groups_used, std::span<int> chosen,
                    std::vector<int>& order);

}  // namespace strata::model
