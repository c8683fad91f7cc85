#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

constexpr int kBlock = 16;  // logits scanned in blocks; a block whose max is in the tail is skipped

// Per-thread scratch so a sampled token allocates nothing in steady state.
struct Scratch {
  std::vector<float> work;       // [V] penalised / masked copy of the row
  std::vector<float> block_max;  // [ceil(V / kBlock)]
  std::vector<int32_t> ids;      // head candidates (ascending id)
  std::vector<double> probs;     // their exp(z), parallel to ids
  std::vector<int32_t> order;    // permutation scratch for top-k / top-p
};
thread_local Scratch tl_scratch;

// Writes the max of each block of kBlock logits to bm (NaN ignored) and returns the row max.
float scalar_block_max(const float* x, int64_t n, float* bm) {
  float m = kNegInf;
  for (int64_t b = 0; b * kBlock < n; ++b) {
    float v = kNegInf;
    const int64_t end = std::min<int64_t>(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) v = x[i] > v ? x[i] : v;  // NaN compares false
    bm[b] = v;
    m = v > m ? v : m;
  }
  return m;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) float avx2_block_max(const float* x, int64_t n, float* bm) {
  const int64_t full = n / kBlock;
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  __m256 gm = ninf;
  for (int64_t b = 0; b < full; ++b) {
    // max_ps(a, b) returns b when either is NaN: keep the NaN-free accumulator second.
    __m256 m = _mm256_max_ps(_mm256_loadu_ps(x + b * kBlock), ninf);
    m = _mm256_max_ps(_mm256_loadu_ps(x + b * kBlock + 8), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    bm[b] = _mm_cvtss_f32(h);
    gm = _mm256_max_ps(m, gm);
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(gm), _mm256_extractf128_ps(gm, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  float m = _mm_cvtss_f32(h);
  if (full * kBlock < n) {
    const float t = scalar_block_max(x + full * kBlock, n - full * kBlock, bm + full);
    m = t > m ? t : m;
  }
  return m;
}
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
#endif

float block_max(std::span<const float> x, std::vector<float>& bm) {
  bm.resize((x.size() + kBlock - 1) / kBlock);
#if defined(__x86_64__)
  if (kHaveAvx2) return avx2_block_max(x.data(), static_cast<int64_t>(x.size()), bm.data());
#endif
  return scalar_block_max(x.data(), static_cast<int64_t>(x.size()), bm.data());
}

// Keeps, in descending probability order, every candidate whose mass ranked strictly above
// it is < target (vLLM's top-p mask; the first always stays). Reorders `ids` so the kept ones
// come first and returns their count; `above_last` gets the mass ranked above the last kept.
// Quickselect narrows [lo, hi) to the cut in expected O(n); a short tail is sorted and scanned.
size_t top_p_cut(std::vector<int32_t>& ids, const double* prob, double target, double* above_last) {
  DescByValue<double> desc{prob};
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
  double last = 0;
  while (keep < hi && (keep == 0 || above < target)) {
    last = above;
    above += prob[ids[keep++]];
  }
  if (above_last) *above_last = last;
  return keep;
}

}  // namespace

std::string no_candidate_message(float max) {
  if (max > 0)
    return "sampling failed: the logits contain +inf (after penalties and logit_bias), so no token has a "
           "finite probability";
  return "sampling failed: no token can be sampled (every logit is -inf or NaN after allowed_token_ids, "
         "bad_words, logit_bias and min_tokens masks)";
}

void apply_allowed_token_ids(std::span<float> logits, std::span<const int32_t> allowed) {
  // Keep the allowed values, then mask everything and put them back: O(|allowed| + V).
  thread_local std::vector<std::pair<int32_t, float>> keep;
  keep.clear();
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (int32_t t : allowed)
    if (t >= 0 && t < vocab) keep.emplace_back(t, logits[t]);
  std::fill(logits.begin(), logits.end(), kNegInf);
  for (const auto& [t, v] : keep) logits[t] = v;
}

void apply_bad_words(std::span<float> logits, const std::vector<std::vector<int32_t>>& bad_words,
                     std::span<const int32_t> output) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (const auto& w : bad_words) {
    if (w.empty() || w.size() > output.size() + 1) continue;
    const size_t prefix = w.size() - 1;  // the output must end with w[0, prefix)
    if (!std::equal(w.begin(), w.begin() + prefix, output.end() - prefix)) continue;
    const int32_t t = w.back();
    if (t >= 0 && t < vocab) logits[t] = kNegInf;
  }
}

void apply_logit_bias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (const auto& [t, b] : bias)
    if (t >= 0 && t < vocab) logits[t] += b;
}

namespace {

bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

void penalties_stage(std::span<float> row, Sequence& seq, const SampleInput&) {
  const SamplingParams& p = seq.params();
  SamplerState& st = seq.sampler;
  if (p.repetition_penalty != 1.0f && !st.prompt_set_ready) {
    st.prompt_set.assign(seq.prompt().begin(), seq.prompt().end());
    std::sort(st.prompt_set.begin(), st.prompt_set.end());
    st.prompt_set.erase(std::unique(st.prompt_set.begin(), st.prompt_set.end()), st.prompt_set.end());
    st.prompt_set_ready = true;
  }
  apply_penalties(row, p, st.prompt_set, st.output_counts);
}

void min_tokens_stage(std::span<float> row, Sequence& seq, const SampleInput& in) {
  const SamplingParams& p = seq.params();
  const int64_t vocab = static_cast<int64_t>(row.size());
  auto mask = [&](int32_t t) {
    if (t >= 0 && t < vocab) row[t] = kNegInf;
  };
  // A complete grammar whose only continuation is a stop token wins over min_tokens (vLLM):
  // the stop tokens stay and check_stop ends the request on one.
  if (has_structured_constraint(seq)) {
    std::vector<int32_t> stops = p.stop_token_ids;
    if (in.eos_token_ids) stops.insert(stops.end(), in.eos_token_ids->begin(), in.eos_token_ids->end());
    if (structured_allows_only_stop(seq, stops)) return;
  }
  if (in.eos_token_ids && !p.ignore_eos)
    for (int32_t t : *in.eos_token_ids) mask(t);
  for (int32_t t : p.stop_token_ids) mask(t);
}

// SamplingParams::thinking: the sequence's reasoning-section state, read from the prompt the
// first time (the last start / end marker in it decides whether the prompt ends inside).
const SamplerState::Thinking& thinking_state(const Sequence& seq) {
  SamplerState::Thinking& t = seq.sampler.thinking;
  if (!t.ready) {
    const auto& tb = seq.params().thinking;
    for (int32_t id : seq.prompt()) {
      if (id == tb.start_token) t.inside = true, t.count = 0;
      else if (id == tb.end_token) t.inside = false;
    }
    t.ready = true;
  }
  return t;
}

bool thinking_budget_spent(const Sequence& seq) {
  const auto& tb = seq.params().thinking;
  if (tb.max_tokens < 0 || tb.end_token < 0) return false;
  const SamplerState::Thinking& t = thinking_state(seq);
  return t.inside && t.count >= tb.max_tokens;
}

// Forces the reasoning section's end token: every other entry -inf, the end token finite, so
// nothing before this stage (masks, bias, penalties) can keep it from being chosen.
void thinking_budget_stage(std::span<float> row, Sequence& seq, const SampleInput&) {
  const int32_t end = seq.params().thinking.end_token;
  std::fill(row.begin(), row.end(), kNegInf);
  if (end >= 0 && end < static_cast<int64_t>(row.size())) row[end] = 0.0f;
}

// vLLM v1's order (Sampler.apply_logits_processors, then apply_penalties): allowed ids and
// bad words first, then logit_bias and min_tokens (non-argmax-invariant processors), then the
// penalties on the biased logits. min_p is argmax-invariant and part of the draw.
constexpr LogitsStage kLogitsStages[] = {
    {"allowed_token_ids", [](const Sequence& s) { return !s.params().allowed_token_ids.empty(); },
     [](std::span<float> row, Sequence& s, const SampleInput&) {
       apply_allowed_token_ids(row, s.params().allowed_token_ids);
     }},
    {"bad_words", [](const Sequence& s) { return !s.params().bad_words_token_ids.empty(); },
     [](std::span<float> row, Sequence& s, const SampleInput&) {
       apply_bad_words(row, s.params().bad_words_token_ids, s.output());
     }},
    {"logit_bias", [](const Sequence& s) { return !s.params().logit_bias.empty(); },
     [](std::span<float> row, Sequence& s, const SampleInput&) { apply_logit_bias(row, s.params().logit_bias); }},
    {"min_tokens", [](const Sequence& s) { return s.num_output_tokens() < s.params().min_tokens; }, min_tokens_stage},
    {"penalties", [](const Sequence& s) { return has_penalties(s.params()); }, penalties_stage},
    // Last, so the forced end of the reasoning section overrides every other stage.
    {"thinking_budget", thinking_budget_spent, thinking_budget_stage},
};

}  // namespace

std::span<const LogitsStage> logits_stages() { return kLogitsStages; }

bool needs_logits_processing(const Sequence& seq) {
  for (const LogitsStage& st : kLogitsStages)
    if (st.active(seq)) return true;
  return false;
}

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
  if (mx == std::numeric_limits<float>::infinity()) {  // the limit: all mass on the +inf entries
    const auto n_inf = std::count(logits.begin(), logits.end(), mx);
    for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] == mx ? -std::log(float(n_inf)) : kNegInf;
    return out;
  }
  double sum = 0;
  for (float x : logits) sum += std::exp(double(clean(x)) - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = float(double(clean(logits[i])) - lse);
  return out;
}

namespace {
// The lowest id holding `mx`, found through the block maxima `bm` of `logits`.
int32_t first_index_of_max(std::span<const float> logits, const std::vector<float>& bm, float mx) {
  for (size_t b = 0; b < bm.size(); ++b) {
    if (bm[b] != mx) continue;
    const size_t end = std::min(logits.size(), (b + 1) * kBlock);
    for (size_t i = b * kBlock; i < end; ++i)
      if (logits[i] == mx) return static_cast<int32_t>(i);  // the first (lowest id) maximum
  }
  return 0;  // unreachable for a max taken from bm
}
}  // namespace

int32_t argmax_lowest(std::span<const float> logits) {
  if (logits.empty()) return 0;
  std::vector<float>& bm = tl_scratch.block_max;
  const float mx = block_max(logits, bm);
  if (mx == kNegInf) return 0;  // every entry -inf or NaN
  return first_index_of_max(logits, bm, mx);
}

Candidates filter_candidates(std::span<const float> logits, const SamplingParams& p) {
  Candidates c;
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const double inv_t = 1.0 / std::max(double(p.temperature), double(kSamplingEps));
  float mx = kNegInf;
  for (float x : logits) mx = std::max(mx, clean(x));
  if (!std::isfinite(mx)) throw SamplingError(no_candidate_message(mx));
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
  bool permuted = p.top_k > 0;
  if (p.top_p < 1.0f && ids.size() > 1) {
    double kept_mass = 0;
    for (int32_t i : ids) kept_mass += prob[i];
    ids.resize(top_p_cut(ids, prob.data(), double(p.top_p) * kept_mass, nullptr));
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
  if (c.ids.empty()) throw SamplingError("sampling failed: empty candidate set");
  double cum = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    cum += c.probs[i];
    if (u < cum) return c.ids[i];
  }
  return c.ids.back();  // rounding: u at the very top
}

namespace {
// Exact draw from the full distribution (slow path): filter the whole row, then inverse CDF.
int32_t draw_full(std::span<const float> logits, const SamplingParams& p, double u) {
  return draw(filter_candidates(logits, p), u);
}
}  // namespace

// The sampled token for temperature > 0: exact in distribution, one uniform per token except
// in the rare tail case. Steps (z = (l - max) / T):
//  1. one vectorised pass for the row max and per-block maxima;
//  2. head = ids with z >= -tail_cut, found by visiting only blocks whose max reaches it;
//  3. min_p / top_k / top_p on the head. They are exact there whenever the tail cannot
//     matter: min_p's cut is above the tail; top_k needs k head ids; top_p's cut must be the
//     same for every possible tail mass in [0, bound]. Otherwise: the full path;
//  4. inverse CDF over head + bound (see below).
int32_t sample_token(std::span<const float> logits, const SamplingParams& p, std::mt19937_64& rng, double tail_cut) {
  Scratch& s = tl_scratch;
  const float mx = logits.empty() ? kNegInf : block_max(logits, s.block_max);
  if (!std::isfinite(mx)) throw SamplingError(no_candidate_message(mx));
  if (p.temperature < kSamplingEps) return first_index_of_max(logits, s.block_max, mx);
  const double u = uniform01(rng);
  const double t = std::max(double(p.temperature), double(kSamplingEps));
  const double inv_t = 1.0 / t;
  const double log_min_p = p.min_p > 0 ? std::log(double(p.min_p)) : -std::numeric_limits<double>::infinity();
  // A top_k larger than the head widens the cut (the tail could hold top-k ids).
  double zcut = 0, bound = 0;
  int64_t n_tail = 0;
  const int64_t V = static_cast<int64_t>(logits.size());
  for (double cut = tail_cut;; cut *= 2) {
    zcut = std::max(-cut, log_min_p);  // head: z >= zcut
    // Logit-space block threshold, slightly below the cut so that every id in a skipped block
    // has z < -cut however the divisions round.
    const float lcut = std::nextafter(float(double(mx) - (cut + 1e-3) * t), kNegInf);
    // 2. Gather the head in id order; count what is left (every one has z < -cut, or
    // fails min_p and is excluded exactly).
    s.ids.clear();
    s.probs.clear();
    n_tail = 0;
    for (size_t b = 0; b < s.block_max.size(); ++b) {
      const int64_t begin = int64_t(b) * kBlock, end = std::min<int64_t>(V, begin + kBlock);
      if (!(s.block_max[b] >= lcut)) {
        n_tail += end - begin;
        continue;
      }
      for (int64_t i = begin; i < end; ++i) {
        const double z = (double(clean(logits[i])) - mx) * inv_t;
        if (z >= zcut) {
          s.ids.push_back(static_cast<int32_t>(i));
          s.probs.push_back(std::exp(z));
        } else {
          ++n_tail;
        }
      }
    }
    // Upper bound on the mass of tail tokens that min_p does not exclude.
    bound = log_min_p > -cut ? 0.0 : double(n_tail) * std::exp(-cut);
    if (p.top_k <= 0 || size_t(p.top_k) <= s.ids.size() || bound == 0 || cut >= 8 * tail_cut) break;
  }
  const size_t n = s.ids.size();
  // s.order[j] indexes s.ids / s.probs; the kept set ends up in s.order[0, keep).
  s.order.resize(n);
  std::iota(s.order.begin(), s.order.end(), 0);
  size_t keep = n;
  bool reordered = false;
  // 3a. top_k: every tail token is below every head token, so k head ids decide it.
  if (p.top_k > 0 && size_t(p.top_k) < n + (bound > 0 ? size_t(n_tail) : 0)) {
    if (size_t(p.top_k) > n) return draw_full(logits, p, u);
    auto logit = [&](int32_t j) { return clean(logits[s.ids[j]]); };
    std::nth_element(s.order.begin(), s.order.begin() + (p.top_k - 1), s.order.end(), [&](int32_t a, int32_t b) {
      return logit(a) > logit(b) || (logit(a) == logit(b) && a < b);
    });
    const float kth = logit(s.order[p.top_k - 1]);  // ties at the boundary are kept
    keep = size_t(std::partition(s.order.begin(), s.order.end(), [&](int32_t j) { return logit(j) >= kth; }) -
                  s.order.begin());
    bound = 0;
    reordered = true;
  }
  double head = 0;
  for (size_t j = 0; j < keep; ++j) head += s.probs[s.order[j]];
  // 3b. top_p over head + tail mass m in [0, bound]: the cut for m = 0 and m = bound must
  // agree (the last kept id is kept for the smaller target too) and exclude the tail (the
  // next ranked id, a head id or the first tail id, is dropped for the larger target).
  if (p.top_p < 1.0f && (keep > 1 || bound > 0)) {
    s.order.resize(keep);
    double above_last = 0;
    const double lo = double(p.top_p) * head, hi = double(p.top_p) * (head + bound);
    const size_t k2 = top_p_cut(s.order, s.probs.data(), hi, &above_last);
    const bool exact = (k2 <= 1 || above_last < lo) && (k2 < keep || head >= hi);
    if (!exact) return draw_full(logits, p, u);
    keep = k2;
    bound = 0;
    reordered = true;
    head = 0;
    for (size_t j = 0; j < keep; ++j) head += s.probs[s.order[j]];
  }
  if (reordered) std::sort(s.order.begin(), s.order.begin() + keep);  // id order for the CDF
  // 4. x uniform over [0, head + bound). Below `head`: the head token at x. Else the tail:
  // its exact mass m <= bound is computed; x - head < m picks the tail token there; the rest
  // of the slot (bound - m) redraws from the exact distribution. Every token then has
  // probability exactly p_i / (head + m).
  const double x = u * (head + bound);
  if (x < head || bound == 0) {
    double cum = 0;
    for (size_t j = 0; j < keep; ++j) {
      cum += s.probs[s.order[j]];
      if (x < cum) return s.ids[s.order[j]];
    }
    return s.ids[s.order[keep - 1]];  // rounding at the top
  }
  const double y = x - head;
  double cum = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double z = (double(clean(logits[i])) - mx) * inv_t;
    if (z >= zcut || z < log_min_p) continue;  // head, or excluded by min_p
    cum += std::exp(z);
    if (y < cum) return static_cast<int32_t>(i);
  }
  return draw_full(logits, p, uniform01(rng));
}

void note_generated(Sequence& seq, int32_t token) {
  ++seq.sampler.output_counts[token];
  if (const auto& tb = seq.params().thinking; tb.max_tokens >= 0) {
    SamplerState::Thinking& t = seq.sampler.thinking;
    thinking_state(seq);  // from the prompt first
    if (token == tb.start_token) t.inside = true, t.count = 0;
    else if (token == tb.end_token) t.inside = false;
    else if (t.inside) ++t.count;
  }
  structured_note_token(seq, token);
}

SampleResult sample_next(Sequence& seq, const SampleInput& raw_in) {
  // Structured outputs first: disallowed tokens at -inf, so logprobs are after masking (vLLM).
  SampleInput in = raw_in;
  in.logits = apply_structured_mask(seq, raw_in.logits);
  const SamplingParams& p = seq.params();
  const int32_t vocab = static_cast<int32_t>(in.logits.size());
  SampleResult res;
  std::span<const float> view = in.logits;
  bool copied = false;
  for (const LogitsStage& st : kLogitsStages) {
    if (!st.active(seq)) continue;
    std::vector<float>& work = tl_scratch.work;
    if (!copied) {  // a modified copy in the thread's scratch
      work.assign(in.logits.begin(), in.logits.end());
      view = work;
      copied = true;
    }
    st.apply(work, seq, in);
  }
  res.token = sample_token(view, p, seq.sampler.rng);

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

std::optional<DeviceSampling> device_sampling_params(const Sequence& seq) {
  const SamplingParams& p = seq.params();
  // A grammar mask (structured outputs) travels as DeviceSampling::mask (the engine sets it).
  if (needs_logits_processing(seq)) return std::nullopt;  // masks, bias, penalties: on the host
  if (p.min_p > 0.0f || p.logprobs >= 0) return std::nullopt;
  DeviceSampling d;
  d.temperature = p.temperature < kSamplingEps ? 0.0f : p.temperature;
  d.top_k = p.top_k > 0 ? p.top_k : 0;
  d.top_p = p.top_p;
  return d;
}

}  // namespace moeserve
