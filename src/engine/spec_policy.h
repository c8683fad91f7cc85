// Adaptive speculation: the number of drafts k (0 .. num_speculative_tokens) each step runs,
// chosen so that speculation never makes decoding slower.
//
// Why: on a fine-grained MoE a verify step of 1 + k query tokens per sequence reads up to
// (k + 1) x top_k experts per layer instead of top_k, so at high batch or short context the
// verify step can cost more than the accepted drafts give back. The policy predicts both sides
// per step and picks the k with the most tokens per second:
//   tokens/s(k) = num_seqs * E(k) / T(bucket, k),  E(k) = 1 + sum_{i<k} prod_{j<=i} a_j
// where a_j is the running acceptance rate of draft position j given that positions < j were
// accepted, and T the measured wall time of a step of that shape with k drafts.
//
// SpecPolicy (pure, no engine types; unit-tested without a model) keeps
//   (a) a_j: exponentially weighted over observations (one per verified sequence and
//       position); a proposer that gave fewer drafts than asked (n-gram without a match) counts
//       as a rejection at the first missing position, not as no sample;
//   (b) the cost model: per (decode sequences bucket, mean context bucket) a cell per k with
//       the step's verify time (schedule .. delivery) and draft time (the proposer / draft
//       forward for the next step), each estimated down fast and up slowly (interference only
//       adds time); only pure-decode steps (no prefill chunk in the batch) update it, so
//       prefills never pollute it;
//   (c) the choice, with a deterministic exploration schedule (no RNG, nothing that could
//       change sampling): in a bucket the first exploration follows its first measurement, then
//       at most one step in `explore_interval` measures a k that is unmeasured (order 0, k_max,
//       k_max - 1, ..., 1) or stale (older than explore_interval x 2^samples choices of the
//       bucket, at most `reexplore_after`); a bucket with nothing measured takes the best k of
//       the nearest measured bucket (else k_max, vLLM's behaviour).
// Buckets: sequences 1, 2-3, 4-7, ...; mean context < 256, 256-511, ... (powers of two).
//
// SpecController is the engine's glue (engine.cpp calls it at four points of a step): it
// times the step, feeds SpecPolicy, picks each sequence's k (capped by draft_budget),
// proposes n-gram drafts, and keeps the counters shown on /metrics.
//
// Correctness does not depend on k: greedy verification emits the target's argmax whatever the
// drafts, and host-sampled rows use the request's RNG exactly as without speculation
// (spec_decode.h). The device sampler draws from another random stream, so while k adapts a
// seeded non-greedy row could switch between device (plain) and host (verify) sampling from
// one run to the next; such rows stay on the host sampler (spec_keeps_row_on_host).
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/spec_config.h"

namespace moeserve {

struct Sequence;
struct SchedulerOutput;
struct ScheduledSeq;
struct VerifyOutcome;
struct EngineStats;

// The shape a step's cost is keyed by.
struct SpecStepShape {
  int num_seqs = 0;      // decode sequences
  int mean_context = 0;  // mean tokens per sequence (prompt + output so far)
};

enum class SpecPhase { Verify, Draft };

struct SpecPolicyOptions {
  // -1: adaptive. >= 0: k is always min(pinned_k, the sequence's budget) (serve
  // --no-speculative-adaptive pins num_speculative_tokens, vLLM's behaviour; tests).
  int pinned_k = -1;
  int explore_interval = 8;   // at most one exploration per this many choices in a bucket
  int reexplore_after = 256;  // a k unmeasured for this many choices of its bucket is measured again (the cap)
  double cost_weight = 0.125;  // weight of a slower new time (a running mean until 1/n < it); faster: >= 1/2
  double acceptance_weight = 1.0 / 64;  // EWMA weight of a new acceptance observation (likewise)
  double acceptance_prior = 0.5;        // a_j before any observation (one pseudo-observation)
  // Test hook (fake clock): returns the seconds to record for a phase of shape / k instead of
  // the measured wall time, so tests do not depend on timing. Unset: the wall time.
  std::function<double(SpecPhase, const SpecStepShape&, int k, double measured_seconds)> clock;
};

// One sequence's verification, for the acceptance rates.
struct AcceptanceSample {
  int asked = 0;      // drafts requested from the proposer for this step (after the budget)
  int proposed = 0;   // drafts it returned (<= asked)
  int scheduled = 0;  // drafts the step ran (<= proposed: the scheduler may cut them)
  int accepted = 0;   // leading drafts equal to the emitted tokens
  int emitted = 0;    // tokens emitted (accepted + the target's token, unless a stop came first)
};

struct SpecChoice {
  enum class Why { Pinned, NoBudget, Predicted, Explore, ColdBucket };
  int k = 0;
  Why why = Why::Pinned;
  bool exploration() const { return why == Why::Explore; }
  std::string reason;  // for the debug log: the prediction per k and the acceptance rates
};
const char* spec_choice_why_name(SpecChoice::Why w);  // "pinned", "no budget", "predicted", ...

class SpecPolicy {
 public:
  SpecPolicy(int max_k, SpecPolicyOptions options);

  int max_k() const { return max_k_; }
  const SpecPolicyOptions& options() const { return opt_; }

  void observe_acceptance(const AcceptanceSample& s);
  // A pure-decode step's time: its verify part ran with drafts chosen as `k`; the draft part
  // proposed `k` drafts for the next step.
  void observe_time(SpecPhase phase, const SpecStepShape& shape, int k, double seconds);
  // The k for the next step of `shape`; `max_budget` is the largest draft_budget among its
  // sequences (k above it cannot run). Advances the bucket's exploration schedule.
  SpecChoice choose(const SpecStepShape& shape, int max_budget);

  double acceptance(int pos) const { return rate_[size_t(pos)].value; }
  int acceptance_samples(int pos) const { return rate_[size_t(pos)].n; }
  double expected_tokens(int k) const;  // E(k) per sequence
  // Predicted seconds of a step of `shape` with k drafts (verify + draft), if measured.
  std::optional<double> predicted_seconds(const SpecStepShape& shape, int k) const;

  static std::pair<int, int> bucket_of(const SpecStepShape& shape);

 private:
  struct Ewma {
    double value = 0;
    int n = 0;
  };
  struct Cell {
    Ewma verify, draft;
    uint64_t measured_at = 0;  // the bucket's choice count at the last verify sample
  };
  struct Bucket {
    std::vector<Cell> cells;  // [max_k + 1]
    uint64_t choices = 0;
    uint64_t last_explore = 0;
  };
  Bucket& bucket(const SpecStepShape& shape);
  std::optional<double> predicted(const Bucket& b, int k) const;
  // The measured k with the most tokens per second among 0..K (ties: the smaller k).
  std::optional<int> best(const Bucket& b, int K) const;
  std::string describe(const SpecStepShape& shape, const Bucket& b, int K) const;

  int max_k_;
  SpecPolicyOptions opt_;
  std::vector<Ewma> rate_;  // [max_k]: a_j
  std::map<std::pair<int, int>, Bucket> buckets_;
};

// While k adapts, seeded non-greedy rows are sampled on the host (see the header comment).
bool spec_keeps_row_on_host(const SpecConfig& cfg, const SpecPolicyOptions& opt, const Sequence& seq);

// The engine's use of SpecPolicy over one step (engine thread only, except fill_stats).
class SpecController {
 public:
  SpecController(const SpecConfig& cfg, SpecPolicyOptions options, int max_model_len);
  bool enabled() const { return cfg_.enabled(); }

  // After schedule(): starts the step's clock; notes whether it is pure decode and its shape.
  void begin_step(const SchedulerOutput& out);
  // Each sampled row after verification (before its drafts are cleared): acceptance.
  void observe_row(const ScheduledSeq& sc, const VerifyOutcome& vo);
  // After delivery, with the sequences that go on: records the verify time, chooses k and
  // returns each sequence's k (the choice capped by its draft_budget), parallel to `going_on`.
  // Also proposes n-gram drafts into Sequence::spec_tokens (other methods: the caller runs
  // the executor's draft with these k).
  std::vector<int> choose_and_propose_ngram(const std::vector<Sequence*>& going_on);
  // After the executor's draft ran (or right after choose_* for n-gram): records the draft time.
  void end_draft();

  void fill_stats(EngineStats& s) const;  // any thread
  SpecPolicy& policy() { return policy_; }

 private:
  using Clock = std::chrono::steady_clock;
  double seconds(SpecPhase phase, const SpecStepShape& shape, int k, Clock::time_point from) const;

  const SpecConfig cfg_;
  const int max_model_len_;
  SpecPolicy policy_;
  // The current step.
  Clock::time_point t_step_{}, t_draft_{};
  bool pure_decode_ = false;
  SpecStepShape step_shape_, next_shape_;
  std::optional<int> step_k_;   // the k chosen for the step now running (unset: none chosen)
  std::optional<int> next_k_;   // chosen this step for the next one
  std::pair<int, int> last_logged_{-1, -1};
  // Published counters.
  std::array<std::atomic<uint64_t>, kMaxSpecTokens + 1> chosen_{};
  std::atomic<uint64_t> explorations_{0};
  std::atomic<int> last_k_{0};
};

}  // namespace moeserve
