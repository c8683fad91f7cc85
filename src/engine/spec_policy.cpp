#include "engine/spec_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/spec_decode.h"

namespace moeserve {

const char* spec_choice_why_name(SpecChoice::Why w) {
  switch (w) {
    case SpecChoice::Why::Pinned: return "pinned";
    case SpecChoice::Why::NoBudget: return "no budget";
    case SpecChoice::Why::Predicted: return "predicted";
    case SpecChoice::Why::Explore: return "explore";
    case SpecChoice::Why::ColdBucket: return "cold bucket";
  }
  return "?";
}

namespace {

// Running mean for the first samples, then an exponentially weighted mean of weight w.
void update(double& value, int& n, double x, double w) {
  ++n;
  value += std::max(1.0 / n, w) * (x - value);
}

// A step time: interference (other threads on the cores, a page fault, the OS) only ever adds
// time, and one such sample of a k that is seldom measured would otherwise decide the choice
// for long. So the estimate goes down fast (weight at least 1/2) and up slowly: a sample above
// 1.5 x the estimate counts as 1.5 x.
void update_time(double& value, int& n, double x, double w) {
  if (n == 0) {
    value = x, n = 1;
    return;
  }
  ++n;
  if (x < value) {
    value += std::max({1.0 / n, w, 0.5}) * (x - value);
  } else {
    value += std::max(1.0 / n, w) * (std::min(x, 1.5 * value) - value);
  }
}

int log2_floor(int x) { return x <= 1 ? 0 : std::bit_width(unsigned(x)) - 1; }

std::string bucket_name(std::pair<int, int> b) {
  const int s = 1 << b.first;
  const int c = 256 << b.second;
  return fmt::format("seqs {}-{}, context {}{}", s, 2 * s - 1, b.second == 0 ? "<" : "",
                     b.second == 0 ? std::to_string(c) : fmt::format("{}-{}", c / 2, c - 1));
}

}  // namespace

SpecPolicy::SpecPolicy(int max_k, SpecPolicyOptions options) : max_k_(max_k), opt_(std::move(options)) {
  MS_CHECK(max_k_ >= 0 && max_k_ <= kMaxSpecTokens, "SpecPolicy: k {} outside [0, {}]", max_k_, kMaxSpecTokens);
  MS_CHECK(opt_.pinned_k >= -1, "SpecPolicy: pinned_k {} must be -1 (adaptive) or >= 0", opt_.pinned_k);
  MS_CHECK(opt_.explore_interval >= 1 && opt_.reexplore_after >= 1, "SpecPolicy: explore_interval {} and "
           "reexplore_after {} must be >= 1", opt_.explore_interval, opt_.reexplore_after);
  MS_CHECK(opt_.cost_weight > 0 && opt_.cost_weight <= 1 && opt_.acceptance_weight > 0 && opt_.acceptance_weight <= 1,
           "SpecPolicy: EWMA weights must be in (0, 1]");
  // Each rate starts at the prior as one pseudo-observation: the first real one halves it.
  rate_.assign(size_t(max_k_), Ewma{opt_.acceptance_prior, 1});
}

std::pair<int, int> SpecPolicy::bucket_of(const SpecStepShape& shape) {
  return {log2_floor(std::max(shape.num_seqs, 1)), log2_floor(std::max(shape.mean_context, 1) / 128)};
}

SpecPolicy::Bucket& SpecPolicy::bucket(const SpecStepShape& shape) {
  Bucket& b = buckets_[bucket_of(shape)];
  if (b.cells.empty()) {
    b.cells.resize(size_t(max_k_) + 1);
    // As if the last exploration were explore_interval choices ago (modulo 2^64): a new bucket
    // explores as soon as its first k is measured, then at most once per interval.
    b.last_explore = uint64_t(0) - uint64_t(opt_.explore_interval);
  }
  return b;
}

void SpecPolicy::observe_acceptance(const AcceptanceSample& s) {
  MS_CHECK(s.proposed <= s.asked && s.scheduled <= s.proposed && s.accepted <= s.scheduled && s.asked <= max_k_ &&
               s.emitted <= s.accepted + 1,
           "SpecPolicy: inconsistent verification (asked {}, proposed {}, scheduled {}, accepted {}, emitted {})",
           s.asked, s.proposed, s.scheduled, s.accepted, s.emitted);
  auto obs = [&](int pos, double x) {
    Ewma& r = rate_[size_t(pos)];
    // The prior counts as one observation (n starts at 1).
    update(r.value, r.n, x, opt_.acceptance_weight);
  };
  for (int i = 0; i < s.accepted; ++i) obs(i, 1.0);
  // Nothing is known past a stop (emitted == accepted) or past drafts the scheduler cut.
  if (s.emitted != s.accepted + 1) return;
  if (s.accepted < s.scheduled) {
    obs(s.accepted, 0.0);  // the target's token differed from draft `accepted`
  } else if (s.scheduled == s.proposed && s.proposed < s.asked) {
    obs(s.proposed, 0.0);  // the proposer had no draft for this position: as a wrong one
  }
}

void SpecPolicy::observe_time(SpecPhase phase, const SpecStepShape& shape, int k, double seconds) {
  MS_CHECK(k >= 0 && k <= max_k_ && seconds >= 0 && std::isfinite(seconds), "SpecPolicy: time {} s for k {}",
           seconds, k);
  Bucket& b = bucket(shape);
  Cell& c = b.cells[size_t(k)];
  if (phase == SpecPhase::Verify) {
    update_time(c.verify.value, c.verify.n, seconds, opt_.cost_weight);
    c.measured_at = b.choices;
  } else {
    update_time(c.draft.value, c.draft.n, seconds, opt_.cost_weight);
  }
}

double SpecPolicy::expected_tokens(int k) const {
  double e = 1, p = 1;
  for (int i = 0; i < k && i < max_k_; ++i) e += (p *= rate_[size_t(i)].value);
  return e;
}

std::optional<double> SpecPolicy::predicted(const Bucket& b, int k) const {
  const Cell& c = b.cells[size_t(k)];
  if (c.verify.n == 0) return std::nullopt;
  return c.verify.value + (c.draft.n ? c.draft.value : 0.0);
}

std::optional<double> SpecPolicy::predicted_seconds(const SpecStepShape& shape, int k) const {
  auto it = buckets_.find(bucket_of(shape));
  if (it == buckets_.end() || k < 0 || k > max_k_) return std::nullopt;
  return predicted(it->second, k);
}

std::optional<int> SpecPolicy::best(const Bucket& b, int K) const {
  std::optional<int> best_k;
  double best_rate = 0;
  for (int k = 0; k <= K; ++k) {
    const auto t = predicted(b, k);
    if (!t) continue;
    // A zero time (a fake clock) is "free": the most tokens win.
    const double rate = *t > 0 ? expected_tokens(k) / *t : std::numeric_limits<double>::max() / (K + 2 - k);
    if (!best_k || rate > best_rate) best_k = k, best_rate = rate;
  }
  return best_k;
}

std::string SpecPolicy::describe(const SpecStepShape& shape, const Bucket& b, int K) const {
  std::string s = fmt::format("{}; predicted tokens/s", bucket_name(bucket_of(shape)));
  for (int k = 0; k <= K; ++k) {
    const auto t = predicted(b, k);
    if (t && *t > 0) s += fmt::format(" k{}={:.1f}", k, std::max(shape.num_seqs, 1) * expected_tokens(k) / *t);
    else s += fmt::format(" k{}={}", k, t ? "inf" : "?");
  }
  s += "; acceptance";
  for (int i = 0; i < K; ++i) s += fmt::format(" {:.2f}", rate_[size_t(i)].value);
  return s;
}

SpecChoice SpecPolicy::choose(const SpecStepShape& shape, int max_budget) {
  SpecChoice c;
  const int K = std::clamp(max_budget, 0, max_k_);
  if (opt_.pinned_k >= 0) {
    c.k = std::min(opt_.pinned_k, K);
    c.why = SpecChoice::Why::Pinned;
    return c;
  }
  if (K == 0) {
    c.why = SpecChoice::Why::NoBudget;
    return c;
  }
  Bucket& b = bucket(shape);
  ++b.choices;
  const std::optional<int> best_k = best(b, K);
  if (!best_k) {
    // Nothing measured here yet: the nearest bucket's best, else k_max (what vLLM runs).
    c.k = K;
    const auto here = bucket_of(shape);
    int best_dist = std::numeric_limits<int>::max();
    for (const auto& [key, other] : buckets_) {
      const int dist = std::abs(key.first - here.first) + std::abs(key.second - here.second);
      if (&other == &b || dist >= best_dist) continue;
      if (const auto k = best(other, K)) best_dist = dist, c.k = *k;
    }
    c.why = SpecChoice::Why::ColdBucket;
    c.reason = describe(shape, b, K) + (best_dist < std::numeric_limits<int>::max()
                                            ? fmt::format("; nothing measured: the nearest bucket's best")
                                            : std::string("; nothing measured: k_max"));
    return c;
  }
  c.k = *best_k;
  c.why = SpecChoice::Why::Predicted;
  if (b.choices - b.last_explore >= uint64_t(opt_.explore_interval)) {
    // Unmeasured cells first (0 first: whether speculation pays at all), then the stalest.
    std::optional<int> cand;
    for (int i = 0; i <= K && !cand; ++i) {
      const int k = i == 0 ? 0 : K + 1 - i;
      if (b.cells[size_t(k)].verify.n == 0) cand = k;
    }
    if (!cand) {
      // A k's measurement goes stale after 2^n explore intervals (n: its samples), capped at
      // reexplore_after: one unlucky sample of a k that is not chosen is re-measured soon, a
      // well-measured one rarely, so exploration falls to ~K per reexplore_after choices.
      uint64_t oldest = b.choices;
      for (int k = 0; k <= K; ++k) {
        const Cell& cell = b.cells[size_t(k)];
        const uint64_t stale_after = std::min<uint64_t>(uint64_t(opt_.reexplore_after),
                                                        uint64_t(opt_.explore_interval) << std::min(cell.verify.n, 20));
        if (k != *best_k && b.choices - cell.measured_at >= stale_after && cell.measured_at < oldest)
          oldest = cell.measured_at, cand = k;
      }
    }
    if (cand) {
      b.last_explore = b.choices;
      c.k = *cand;
      c.why = SpecChoice::Why::Explore;
    }
  }
  c.reason = describe(shape, b, K);
  return c;
}

bool spec_keeps_row_on_host(const SpecConfig& cfg, const SpecPolicyOptions& opt, const Sequence& seq) {
  const SamplingParams& p = seq.params();
  return cfg.enabled() && opt.pinned_k < 0 && p.seed.has_value() && p.temperature >= kSamplingEps;
}

// ---------------------------------------------------------------------------------------------

SpecController::SpecController(const SpecConfig& cfg, SpecPolicyOptions options, int max_model_len)
    : cfg_(cfg),
      max_model_len_(max_model_len),
      policy_(cfg.enabled() ? cfg.num_speculative_tokens : 0, std::move(options)) {}

double SpecController::seconds(SpecPhase phase, const SpecStepShape& shape, int k, Clock::time_point from) const {
  const double measured = std::chrono::duration<double>(Clock::now() - from).count();
  return policy_.options().clock ? policy_.options().clock(phase, shape, k, measured) : measured;
}

void SpecController::begin_step(const SchedulerOutput& out) {
  if (!enabled()) return;
  t_step_ = Clock::now();
  step_k_ = next_k_;
  next_k_.reset();
  // Pure decode: every row is one known token (+ drafts) that samples; no prefill chunk.
  pure_decode_ = !out.scheduled.empty() && out.preempted.empty();
  int64_t ctx = 0;
  for (const ScheduledSeq& sc : out.scheduled) {
    pure_decode_ = pure_decode_ && sc.sample && sc.num_tokens - sc.num_spec == 1;
    ctx += sc.start_pos + 1;
  }
  step_shape_ = {int(out.scheduled.size()), out.scheduled.empty() ? 0 : int(ctx / int64_t(out.scheduled.size()))};
}

void SpecController::observe_row(const ScheduledSeq& sc, const VerifyOutcome& vo) {
  Sequence& s = *sc.seq;
  const int asked = s.spec_asked;
  s.spec_asked = 0;
  // Only rows the policy asked drafts for (a decode row: a prefill row never has any).
  if (!enabled() || asked == 0 || !vo.error.empty() || sc.num_tokens - sc.num_spec != 1) return;
  policy_.observe_acceptance(AcceptanceSample{.asked = asked,
                                              .proposed = int(s.spec_tokens.size()),
                                              .scheduled = sc.num_spec,
                                              .accepted = vo.num_accepted,
                                              .emitted = int(vo.emitted.size())});
}

std::vector<int> SpecController::choose_and_propose_ngram(const std::vector<Sequence*>& going_on) {
  std::vector<int> ks(going_on.size(), 0);
  if (!enabled()) return ks;
  t_draft_ = Clock::now();
  // This step's verify part (schedule .. delivery), under the k chosen for it.
  if (pure_decode_ && step_k_)
    policy_.observe_time(SpecPhase::Verify, step_shape_, *step_k_,
                         seconds(SpecPhase::Verify, step_shape_, *step_k_, t_step_));
  if (going_on.empty()) return ks;
  int max_budget = 0;
  int64_t ctx = 0;
  for (size_t i = 0; i < going_on.size(); ++i) {
    ks[i] = draft_budget(cfg_, *going_on[i], max_model_len_);
    max_budget = std::max(max_budget, ks[i]);
    ctx += going_on[i]->num_tokens();
  }
  next_shape_ = {int(going_on.size()), int(ctx / int64_t(going_on.size()))};
  const SpecChoice choice = policy_.choose(next_shape_, max_budget);
  next_k_ = choice.k;
  chosen_[size_t(choice.k)].fetch_add(1, std::memory_order_relaxed);
  if (choice.exploration()) explorations_.fetch_add(1, std::memory_order_relaxed);
  last_k_.store(choice.k, std::memory_order_relaxed);
  const std::pair<int, int> logged{choice.k, int(choice.why)};
  if (!choice.reason.empty() && (logged != last_logged_ || choice.exploration()))
    spdlog::debug("speculative k {} ({}): {}", choice.k, spec_choice_why_name(choice.why), choice.reason);
  last_logged_ = logged;
  for (size_t i = 0; i < going_on.size(); ++i) {
    Sequence& s = *going_on[i];
    ks[i] = std::min(ks[i], choice.k);
    s.spec_asked = ks[i];
    if (cfg_.method == SpecMethod::Ngram && ks[i] > 0)
      s.spec_tokens = propose_ngram(s.tokens, cfg_.prompt_lookup_min, cfg_.prompt_lookup_max, ks[i]);
  }
  return ks;
}

void SpecController::end_draft() {
  if (!enabled() || !pure_decode_ || !next_k_) return;
  policy_.observe_time(SpecPhase::Draft, next_shape_, *next_k_,
                       seconds(SpecPhase::Draft, next_shape_, *next_k_, t_draft_));
}

void SpecController::fill_stats(EngineStats& s) const {
  if (!enabled()) return;
  s.spec_adaptive = policy_.options().pinned_k < 0;
  s.spec_chosen_k.resize(size_t(cfg_.num_speculative_tokens) + 1);
  for (size_t k = 0; k < s.spec_chosen_k.size(); ++k) s.spec_chosen_k[k] = chosen_[k].load(std::memory_order_relaxed);
  s.spec_k_explorations = explorations_.load(std::memory_order_relaxed);
  s.spec_last_k = last_k_.load(std::memory_order_relaxed);
}

}  // namespace moeserve
