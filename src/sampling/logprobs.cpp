#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "sampling/sampler.h"

namespace strata::sampling {

Logprobs logprobs(std::span<const float> logits, int32_t chosen, int k) {
  if (chosen < 0 || static_cast<size_t>(chosen) >= logits.size()) {
    throw std::invalid_argument("logprobs: chosen token outside the logits");
  }
  double max_logit = -INFINITY;
  for (float logit : logits) max_logit = std::max(max_logit, double{logit});
  double total = 0.0;
  for (float logit : logits) total += std::exp(logit - max_logit);
  const double log_normalizer = max_logit + std::log(total);

  Logprobs result;
  result.chosen = static_cast<float>(logits[static_cast<size_t>(chosen)] - log_normalizer);
  const size_t count = std::min(logits.size(), static_cast<size_t>(std::max(k, 0)));
  // Kept from call to call, as sampler.cpp's scratch: a vocabulary's row of ids.
  thread_local std::vector<int32_t> order;
  order.resize(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto more_likely = [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)];
    const float lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count), order.end(),
                    more_likely);
  result.top.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const int32_t token = order[i];
    result.top.emplace_back(token,
                            static_cast<float>(logits[static_cast<size_t>(token)] - log_normalizer));
  }
  return result;
}

}  // namespace strata::sampling
