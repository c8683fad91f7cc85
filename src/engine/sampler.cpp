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
  // Softmax of logits / temperature over the whole vocabulary.
  std::vector<double> prob(vocab);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += prob[i] = std::exp((double(clean(logits[i])) - mx) * inv_t);
  for (double& q : prob) q /= sum;

  std::vector<int32_t> ids;
  ids.reserve(vocab);
  // min_p: drop ids whose probability is below min_p times the largest probability.
  const double pmax = 1.0 / sum;  // the maximum logit's probability: exp(0) / sum
  const double min_prob = p.min_p > 0 ? double(p.min_p) * pmax : 0.0;
  for (int32_t i = 0; i < vocab; ++i)
    if (prob[i] > 0 && prob[i] >= min_prob) ids.push_back(i);

  DescByValue<double> desc{prob.data()};
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < ids.size()) {
    // Keep every id whose probability reaches the k-th largest (ties at the boundary kept,
    // as a threshold mask does).
    std::nth_element(ids.begin(), ids.begin() + (p.top_k - 1), ids.end(), desc);
    const double kth = prob[ids[p.top_k - 1]];
    std::erase_if(ids, [&](int32_t i) { return prob[i] < kth; });
  }
  if (p.top_p < 1.0f) {
    double kept_mass = 0;
    for (int32_t i : ids) kept_mass += prob[i];
    // Sort only as much of the head as needed: grow the sorted prefix until it holds p.
    size_t m = std::min<size_t>(ids.size(), 256);
    size_t keep = ids.size();
    for (;;) {
      std::partial_sort(ids.begin(), ids.begin() + m, ids.end(), desc);
      double above = 0;  // renormalised mass ranked strictly above ids[j]
      size_t j = 0;
      for (; j < m; ++j) {
        if (above >= double(p.top_p) && j > 0) break;
        above += prob[ids[j]] / kept_mass;
      }
      if (j < m || m == ids.size()) {
        keep = j;
        break;
      }
      m = std::min(ids.size(), m * 4);
    }
    ids.resize(keep);
  }
  std::sort(ids.begin(), ids.end());
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
  std::vector<float> work(in.logits.begin(), in.logits.end());

  if (seq.num_output_tokens() < p.min_tokens) {  // EOS and stop ids may not end it yet
    auto mask = [&](int32_t t) {
      if (t >= 0 && t < vocab) work[t] = kNegInf;
    };
    if (in.eos_token_ids && !p.ignore_eos)
      for (int32_t t : *in.eos_token_ids) mask(t);
    for (int32_t t : p.stop_token_ids) mask(t);
  }
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
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
    res.token = argmax_lowest(work);
  } else {
    res.token = draw(filter_candidates(work, p), uniform01(seq.sampler.rng));
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
