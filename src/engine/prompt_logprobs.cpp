#include "engine/prompt_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace moeserve {

PromptTokenLogprob prompt_token_logprob(std::span<const float> logits, int32_t token, int k) {
  const int64_t V = int64_t(logits.size());
  // log_softmax in double: logprob(i) = logit(i) - (max + log sum exp(logit - max)).
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : logits)
    if (x > mx) mx = x;
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - double(mx));
  const double lse = double(mx) + std::log(sum);
  auto lp = [&](int64_t i) { return float(double(logits[size_t(i)]) - lse); };
  PromptTokenLogprob out;
  out.token_id = token;
  out.logprob = lp(token);
  // Rank as vLLM's batched_count_greater_than: 1 + tokens with a strictly larger logprob.
  const float tl = logits[size_t(token)];
  int64_t greater = 0;
  for (float x : logits) greater += x > tl;
  out.rank = greater + 1;
  const int64_t n = k < 0 ? V : std::min<int64_t>(k, V);
  if (n > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    auto before = [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), before);
    out.top.reserve(size_t(n));
    for (int64_t i = 0; i < n; ++i) out.top.emplace_back(ids[size_t(i)], lp(ids[size_t(i)]));
  }
  return out;
}

}  // namespace moeserve
