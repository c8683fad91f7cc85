#include "engine/spec_decode.h"

#include <algorithm>

namespace moeserve {

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int min_n, int max_n, int k) {
  const int64_t N = static_cast<int64_t>(tokens.size());
  if (k <= 0 || min_n < 1 || max_n < min_n || N < min_n + 1) return {};
  // For every earlier end position e (e < N - 1, so at least one token follows it): the
  // length of the longest match (<= max_n) of the sequence's suffix ending at e. Keep the
  // longest; on ties the earliest (vLLM scans the reversed sequence with `>=`).
  int best_len = 0;
  int64_t best_end = -1;
  const int32_t last = tokens[N - 1];
  for (int64_t e = 0; e + 1 < N; ++e) {
    if (tokens[e] != last) continue;
    int len = 1;
    const int cap = static_cast<int>(std::min<int64_t>(max_n, e + 1));
    while (len < cap && tokens[e - len] == tokens[N - 1 - len]) ++len;
    if (len > best_len) best_len = len, best_end = e;
  }
  if (best_len < min_n) return {};
  const int64_t from = best_end + 1;
  const int64_t to = std::min<int64_t>(N, from + k);
  return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
}

int draft_budget(const SpecConfig& cfg, const Sequence& seq, int max_model_len) {
  int k = cfg.num_speculative_tokens;
  // The step computes positions [num_tokens - 1, num_tokens - 1 + k]: stay inside the model.
  k = std::min(k, max_model_len - seq.num_tokens());
  // The step emits at most k + 1 tokens; past max_tokens they would be dropped.
  k = std::min(k, seq.params().max_tokens - seq.num_output_tokens() - 1);
  return std::max(k, 0);
}

VerifyOutcome verify_and_sample(Sequence& seq, const VerifyInput& in) {
  VerifyOutcome out;
  const size_t rows = in.drafts.size() + 1;
  const size_t V = in.logits.size() / rows;
  MS_CHECK(V > 0 && V * rows == in.logits.size(), "verify: {} logits for {} rows", in.logits.size(), rows);
  for (size_t j = 0; j < rows; ++j) {
    SampleResult sr;
    try {
      SampleInput si{.logits = in.logits.subspan(j * V, V), .eos_token_ids = in.eos_token_ids};
      sr = sample_next(seq, si);
    } catch (const std::exception& e) {
      if (j == 0) out.error = e.what();
      break;  // j > 0: re-run as the next plain decode (see the header)
    }
    seq.tokens.push_back(sr.token);
    note_generated(seq, sr.token);
    const bool matched = j < in.drafts.size() && sr.token == in.drafts[j];
    if (matched) ++out.num_accepted;
    out.emitted.push_back(std::move(sr));
    out.stop = check_stop(seq, in.eos_token_ids ? *in.eos_token_ids : std::vector<int32_t>{}, in.max_model_len);
    if (out.stop.reason != FinishReason::None || !matched) break;
  }
  return out;
}

}  // namespace moeserve
