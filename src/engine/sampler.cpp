#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace moeserve {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline float clean(float x) { return std::isnan(x) ? kNegInf : x; }

// Descending by value, ascending id on ties: the order used for top-k/top-p/top-logprobs.
template <typename V>
struct DescByValue {
  const V* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};
}  // namespace

void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt_set,
                     const std::unordered_map<int32_t, int>& output_counts) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto in_range = [&](int32_t t) { return t >= 0 && t < vocab; };
  if (p.repetition_penalty != 1.0f) {
    const float r = p.repetition_penalty;
    auto penalise = [&](int32_t t) {
      float& l = logits[t];
      l = l > 0 ? l / r : l * r;
    };
    // Each seen token once: the prompt set is unique; output tokens not in it are added.
    for (int32_t t : prompt_set)
      if (in_range(t)) penalise(t);
    for (const auto& [t, c] : output_counts)
      if (c > 0 && in_range(t) && !std::binary_search(prompt_set.begin(), prompt_set.end(), t)) penalise(t);
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [t, c] : output_counts)
      if (c > 0 && in_range(t)) logits[t] -= p.presence_penalty + p.frequency_penalty * float(c);
  }
}

std::vector<float> log_softmax(std::span<const float> logits) {
  std::vector<float> out(logits.size());
  float mx = kNegInf;
  for (float x : logits) mx = std::max(mx, clean(x));
  if (mx == kNegInf) {  // degenerate row: uniform
    std::fill(out.begin(), out.end(), -std::log(float(std::max<size_t>(1, logits.size()))));
    return out;
  }
  double sum = 0;
  for (float x : logits) sum += std::exp(double(clean(x)) - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = float(double(clean(logits[i])) - lse);
  return out;
}

int32_t argmax_lowest(std::span<const float> logits) {
  int32_t best = 0;
  float bv = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = clean(logits[i]);
    if (v > bv) {  // strict: the first (lowest id) maximum wins
      bv = v;
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

Candidates filter_candidates(std::span<const float> logits, const SamplingParams& p) {
  Candidates c;
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const double inv_t = 1.0 / std::max(double(p.temperature), double(kSamplingEps));
  float mx = kNegInf;
  for (float x : logits) mx = std::max(mx, clean(x));
  if (mx == kNegInf) {  // nothing is possible; fall back to the greedy choice
    c.ids = {argmax_lowest(logits)};
    c.probs = {1.0};
    return c;
  }
  // Work in logit space so that only surviving ids need exp(): softmax(l / T) is monotone
  // in l, and min_p's test prob_i >= min_p * prob_max is (l_i - max) / T >= log(min_p).
  const double log_min_p = p.min_p > 0 ? std::log(double(p.min_p)) : -std::numeric_limits<double>::infinity();
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < vocab; ++i) {
    const double z = (double(clean(logits[i])) - mx) * inv_t;  // <= 0
    if (z >= log_min_p && z > -745.0) ids.push_back(i);  // below -745 exp() underflows to 0
  }
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < ids.size()) {
    // Keep every id whose logit reaches the k-th largest (ties at the boundary kept, as a
    // threshold mask does).
    DescByValue<float> by_logit{logits.data()};
    std::nth_element(ids.begin(), ids.begin() + (p.top_k - 1), ids.end(), by_logit);
    const float kth = logits[ids[p.top_k - 1]];
    std::erase_if(ids, [&](int32_t i) { return logits[i] < kth; });
  }
  // Probabilities of the survivors, indexed by id (sparse: only ids are filled).
  std::vector<double> prob(vocab, 0.0);
  for (int32_t i : ids) prob[i] = std::exp((double(clean(logits[i])) - mx) * inv_t);
  DescByValue<double> desc{prob.data()};
  bool permuted = p.top_k > 0;
  if (p.top_p < 1.0f && ids.size() > 1) {
    // Keep, in descending probability order, every id whose renormalised mass ranked
    // strictly above it is < top_p (vLLM's mask; the first id always stays). Quickselect
    // narrows [lo, hi) to the cut in expected O(n); a short tail is sorted and scanned.
    double kept_mass = 0;
    for (int32_t i : ids) kept_mass += prob[i];
    const double target = double(p.top_p) * kept_mass;
    size_t lo = 0, hi = ids.size();
    double above = 0;  // mass of ids[0, lo), all ranked above ids[lo, hi)
    while (hi - lo > 64) {
      const size_t mid = lo + (hi - lo) / 2;
      std::nth_element(ids.begin() + lo, ids.begin() + mid, ids.begin() + hi, desc);
      double left = 0;
      for (size_t j = lo; j < mid; ++j) left += prob[ids[j]];
      if (above + left >= target && mid > 0) {
        hi = mid;  // ids[mid] has at least `target` above it: the cut is at or before mid
      } else {
        above += left + prob[ids[mid]];  // ids[mid] is kept
        lo = mid + 1;
      }
    }
    std::sort(ids.begin() + lo, ids.begin() + hi, desc);
    size_t keep = lo;
    while (keep < hi && (keep == 0 || above < target)) above += prob[ids[keep++]];
    ids.resize(keep);
    permuted = true;
  }
  if (permuted) std::sort(ids.begin(), ids.end());
  double kept = 0;
  for (int32_t i : ids) kept += prob[i];
  c.ids = std::move(ids);
  c.probs.reserve(c.ids.size());
  for (int32_t i : c.ids) c.probs.push_back(prob[i] / kept);
  return c;
}

double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

int32_t draw(const Candidates& c, double u) {
  double cum = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    cum += c.probs[i];
    if (u < cum) return c.ids[i];
  }
  return c.ids.back();  // rounding: u at the very top
}

void note_generated(Sequence& seq, int32_t token) { ++seq.sampler.output_counts[token]; }

SampleResult sample_next(Sequence& seq, const SampleInput& in) {
  const SamplingParams& p = seq.params();
  const int32_t vocab = static_cast<int32_t>(in.logits.size());
  SampleResult res;
  const bool masks = seq.num_output_tokens() < p.min_tokens;
  const bool penalties = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  std::vector<float> work;  // a modified copy, only when something modifies the logits
  if (masks || penalties) work.assign(in.logits.begin(), in.logits.end());
  const std::span<const float> view = work.empty() ? in.logits : std::span<const float>(work);

  if (masks) {  // EOS and stop ids may not end it yet
    auto mask = [&](int32_t t) {
      if (t >= 0 && t < vocab) work[t] = kNegInf;
    };
    if (in.eos_token_ids && !p.ignore_eos)
      for (int32_t t : *in.eos_token_ids) mask(t);
    for (int32_t t : p.stop_token_ids) mask(t);
  }
  if (penalties) {
    SamplerState& st = seq.sampler;
    if (p.repetition_penalty != 1.0f && !st.prompt_set_ready) {
      st.prompt_set.assign(seq.prompt().begin(), seq.prompt().end());
      std::sort(st.prompt_set.begin(), st.prompt_set.end());
      st.prompt_set.erase(std::unique(st.prompt_set.begin(), st.prompt_set.end()), st.prompt_set.end());
      st.prompt_set_ready = true;
    }
    apply_penalties(work, p, st.prompt_set, st.output_counts);
  }
  if (p.temperature < kSamplingEps) {
    res.token = argmax_lowest(view);
  } else {
    res.token = draw(filter_candidates(view, p), uniform01(seq.sampler.rng));
  }

  if (p.logprobs >= 0) {
    // Raw model logprobs (before penalties and masks), as vLLM v1 returns by default.
    const std::vector<float> lsm = log_softmax(in.logits);
    res.has_logprobs = true;
    res.logprob.token_id = res.token;
    res.logprob.logprob = lsm[res.token];
    const int k = std::min(p.logprobs, vocab);
    if (k > 0) {
      std::vector<int32_t> idx(vocab);
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), DescByValue<float>{lsm.data()});
      res.logprob.top.reserve(k);
      for (int i = 0; i < k; ++i) res.logprob.top.emplace_back(idx[i], lsm[idx[i]]);
    }
  }
  return res;
}

}  // namespace moeserve
