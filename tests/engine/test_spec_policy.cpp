// Adaptive speculation (engine/spec_policy.h): the policy on its own (acceptance rates, the cost
// model, the choice of k, bounded exploration), the controller's pure-decode rule, and the
// engine with a fake clock (SpecPolicyOptions::clock), so nothing here depends on timing.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/spec_decode.h"
#include "engine/spec_policy.h"
#include "engine/testing/toy_executor.h"

namespace moeserve {
namespace {

using namespace std::chrono_literals;
using testing::ToyExecutor;
using testing::ToyExecutorConfig;

// A verification where the first `accepted` of `k` drafts were accepted (then the target's token).
AcceptanceSample verified(int k, int accepted) {
  return AcceptanceSample{.asked = k, .proposed = k, .scheduled = k, .accepted = accepted, .emitted = accepted + 1};
}

// Runs `steps` choices in one bucket: each step's verify time is cost(k) and every sequence
// accepts its first `accept` drafts of the chosen k. Returns the choices.
std::vector<SpecChoice> simulate(SpecPolicy& p, int steps, const std::function<double(int)>& cost, int accept) {
  const SpecStepShape shape{8, 1000};
  std::vector<SpecChoice> out;
  for (int i = 0; i < steps; ++i) {
    SpecChoice c = p.choose(shape, p.max_k());
    p.observe_time(SpecPhase::Verify, shape, c.k, cost(c.k));
    for (int s = 0; s < 8; ++s) p.observe_acceptance(verified(c.k, std::min(accept, c.k)));
    out.push_back(c);
  }
  return out;
}

TEST(SpecPolicy, ChoosesZeroWhenVerifyCostExceedsTheGain) {
  SpecPolicy p(3, {});
  // Half the first drafts are accepted (E(1) = 1.5 at most), but one draft doubles the step.
  int n = 0;
  std::vector<SpecChoice> cs;
  for (int i = 0; i < 600; ++i) {
    const SpecStepShape shape{8, 1000};
    SpecChoice c = p.choose(shape, 3);
    p.observe_time(SpecPhase::Verify, shape, c.k, 0.010 * (1 + c.k));
    for (int s = 0; s < 8; ++s) p.observe_acceptance(verified(c.k, (n++ % 2) && c.k > 0 ? 1 : 0));
    cs.push_back(c);
  }
  EXPECT_EQ(cs[0].why, SpecChoice::Why::ColdBucket);
  EXPECT_EQ(cs[0].k, 3);  // nothing measured: what vLLM runs
  int zeros = 0, explores = 0;
  for (size_t i = 20; i < cs.size(); ++i) {
    zeros += cs[i].k == 0;
    explores += cs[i].exploration();
    if (!cs[i].exploration()) {
      EXPECT_EQ(cs[i].k, 0) << "step " << i << ": " << cs[i].reason;
    }
  }
  EXPECT_GE(zeros, 550);
  EXPECT_GT(explores, 0);  // measured k are measured again now and then (after 16, 32, ... 256 choices)
  EXPECT_LE(explores, 20);
  EXPECT_NEAR(p.acceptance(0), 0.5, 0.2);
  ASSERT_TRUE(p.predicted_seconds({8, 1000}, 0));
  EXPECT_DOUBLE_EQ(*p.predicted_seconds({8, 1000}, 0), 0.010);
  EXPECT_NE(cs.back().reason.find("predicted tokens/s k0=800.0"), std::string::npos) << cs.back().reason;
}

TEST(SpecPolicy, ChoosesMaxKWhenAcceptanceIsHighAndCostFlat) {
  SpecPolicy p(4, {});
  const auto cs = simulate(p, 200, [](int k) { return 0.020 + 0.0001 * k; }, 4);
  for (size_t i = 40; i < cs.size(); ++i)
    if (!cs[i].exploration()) {
      EXPECT_EQ(cs[i].k, 4) << "step " << i << ": " << cs[i].reason;
    }
  EXPECT_GT(p.acceptance(3), 0.9);
  EXPECT_GT(p.expected_tokens(4), 4.5);
}

TEST(SpecPolicy, PicksTheKInBetweenWhenLaterDraftsAreRejected) {
  SpecPolicy p(4, {});
  // Drafts 0 and 1 always accepted, 2 never: E(2) = 3, E(3) = E(4) = 3, with cost growing in k.
  const auto cs = simulate(p, 200, [](int k) { return 0.010 * (1 + 0.2 * k); }, 2);
  for (size_t i = 60; i < cs.size(); ++i)
    if (!cs[i].exploration()) {
      EXPECT_EQ(cs[i].k, 2) << "step " << i << ": " << cs[i].reason;
    }
}

TEST(SpecPolicy, ExplorationIsBoundedDeterministicAndMeasuresEveryK) {
  SpecPolicyOptions o;
  o.explore_interval = 8;
  o.reexplore_after = 64;
  SpecPolicy a(3, o), b(3, o);
  auto cost = [](int k) { return 0.010 * (1 + k); };
  const auto ca = simulate(a, 1000, cost, 1), cb = simulate(b, 1000, cost, 1);
  int explores = 0;
  size_t last = 0;
  for (size_t i = 0; i < ca.size(); ++i) {
    EXPECT_EQ(ca[i].k, cb[i].k) << i;  // no randomness: same inputs, same choices
    if (!ca[i].exploration()) continue;
    ++explores;
    if (last) {
      EXPECT_GE(i - last, 8u) << "explorations closer than explore_interval";
    }
    last = i;
  }
  EXPECT_LE(explores, 1000 / 8);
  EXPECT_GE(explores, 3);  // each of k = 1, 2 at least once, then re-measurements
  for (int k = 0; k <= 3; ++k) EXPECT_TRUE(a.predicted_seconds({8, 1000}, k)) << k;
  // Stale cells are re-measured: at least one exploration after the first 200 steps.
  int late = 0;
  for (size_t i = 200; i < ca.size(); ++i) late += ca[i].exploration();
  EXPECT_GT(late, 0);
}

TEST(SpecPolicy, MissingNgramDraftsCountAsRejections) {
  SpecPolicy p(3, {});
  const double prior = p.acceptance(0);
  // Asked for 3, the proposer had nothing: a rejection at position 0.
  for (int i = 0; i < 50; ++i)
    p.observe_acceptance(AcceptanceSample{.asked = 3, .proposed = 0, .scheduled = 0, .accepted = 0, .emitted = 1});
  EXPECT_LT(p.acceptance(0), 0.1);
  EXPECT_DOUBLE_EQ(p.acceptance(1), prior);  // never reached: no sample
  // One draft proposed and accepted, none for position 1: position 1 is a rejection.
  SpecPolicy q(3, {});
  for (int i = 0; i < 50; ++i)
    q.observe_acceptance(AcceptanceSample{.asked = 3, .proposed = 1, .scheduled = 1, .accepted = 1, .emitted = 2});
  EXPECT_GT(q.acceptance(0), 0.9);
  EXPECT_LT(q.acceptance(1), 0.1);
  EXPECT_DOUBLE_EQ(q.acceptance(2), prior);
  // What says nothing: a stop right after an accepted draft, drafts the scheduler cut.
  SpecPolicy r(3, {});
  r.observe_acceptance(AcceptanceSample{.asked = 3, .proposed = 3, .scheduled = 3, .accepted = 2, .emitted = 2});
  r.observe_acceptance(AcceptanceSample{.asked = 3, .proposed = 3, .scheduled = 1, .accepted = 1, .emitted = 2});
  EXPECT_GT(r.acceptance(0), prior);
  EXPECT_GT(r.acceptance(1), prior);
  EXPECT_DOUBLE_EQ(r.acceptance(2), prior);
  EXPECT_DOUBLE_EQ(r.expected_tokens(0), 1.0);
  EXPECT_THROW(r.observe_acceptance(AcceptanceSample{.asked = 2, .proposed = 3}), Error);
}

TEST(SpecPolicy, PinnedNoBudgetAndColdBucketsFromTheNearestMeasured) {
  SpecPolicyOptions pin;
  pin.pinned_k = 2;
  SpecPolicy p(4, pin);
  EXPECT_EQ(p.choose({1, 10}, 4).k, 2);
  EXPECT_EQ(p.choose({1, 10}, 1).k, 1);  // the sequences' budget still caps it
  EXPECT_EQ(p.choose({1, 10}, 4).why, SpecChoice::Why::Pinned);
  SpecPolicy a(3, {});
  EXPECT_EQ(a.choose({4, 500}, 0).why, SpecChoice::Why::NoBudget);
  // Bucket (4-7 seqs, 256-511) learns that k = 0 is best; a new neighbouring bucket starts there.
  for (int i = 0; i < 40; ++i) {
    SpecChoice c = a.choose({4, 500}, 3);
    a.observe_time(SpecPhase::Verify, {4, 500}, c.k, 0.01 * (1 + 5 * c.k));
  }
  const SpecChoice cold = a.choose({4, 700}, 3);  // 512-1023: nothing measured
  EXPECT_EQ(cold.why, SpecChoice::Why::ColdBucket);
  EXPECT_EQ(cold.k, 0) << cold.reason;
  EXPECT_EQ(SpecPolicy::bucket_of({4, 500}), std::make_pair(2, 1));
  EXPECT_EQ(SpecPolicy::bucket_of({1, 100}), std::make_pair(0, 0));
  EXPECT_EQ(SpecPolicy::bucket_of({33, 70000}), std::make_pair(5, 9));
}

// Interference only adds time: one slow sample of a k barely moves its estimate, a fast one
// brings it down at once, so a seldom-measured k is not shut out by one unlucky step.
TEST(SpecPolicy, StepTimesGoDownFastAndUpSlowly) {
  SpecPolicy p(1, {});
  const SpecStepShape s{8, 100};
  p.observe_time(SpecPhase::Verify, s, 0, 0.010);
  p.observe_time(SpecPhase::Verify, s, 0, 0.100);  // a 10x outlier counts as 1.5x
  EXPECT_NEAR(*p.predicted_seconds(s, 0), 0.0125, 1e-12);
  p.observe_time(SpecPhase::Verify, s, 0, 0.010);  // down with weight 1/2
  EXPECT_NEAR(*p.predicted_seconds(s, 0), 0.01125, 1e-12);
  // A first sample that was an outlier is undone by the next normal ones.
  SpecPolicy q(1, {});
  q.observe_time(SpecPhase::Verify, s, 1, 0.100);
  for (int i = 0; i < 6; ++i) q.observe_time(SpecPhase::Verify, s, 1, 0.010);
  EXPECT_LT(*q.predicted_seconds(s, 1), 0.012);
}

TEST(SpecPolicy, DraftTimeAddsToTheVerifyTime) {
  SpecPolicy p(2, {});
  p.observe_time(SpecPhase::Verify, {1, 100}, 2, 0.010);
  EXPECT_DOUBLE_EQ(*p.predicted_seconds({1, 100}, 2), 0.010);
  p.observe_time(SpecPhase::Draft, {1, 100}, 2, 0.004);
  EXPECT_DOUBLE_EQ(*p.predicted_seconds({1, 100}, 2), 0.014);
  EXPECT_FALSE(p.predicted_seconds({1, 100}, 1));
  p.observe_time(SpecPhase::Draft, {1, 100}, 1, 0.004);
  EXPECT_FALSE(p.predicted_seconds({1, 100}, 1));  // a draft time alone is no prediction
}

// The controller over hand-made steps: only pure-decode steps record a cost.
TEST(SpecController, OnlyPureDecodeStepsUpdateTheCostModel) {
  SpecConfig cfg;
  cfg.method = SpecMethod::Ngram;
  cfg.num_speculative_tokens = 3;
  cfg.prompt_lookup_min = 1;
  cfg.prompt_lookup_max = 2;
  double next_time = 0;
  std::vector<SpecPhase> phases;
  SpecPolicyOptions o;
  o.clock = [&](SpecPhase ph, const SpecStepShape&, int, double) {
    phases.push_back(ph);
    return ph == SpecPhase::Verify ? next_time : 0.0;
  };
  SpecController ctl(cfg, o, 1000);
  auto req = std::make_shared<Request>();
  req->params.max_tokens = 100;
  auto make = [&](int64_t id, int n) {
    auto s = std::make_unique<Sequence>();
    s->id = id;
    s->request = req;
    for (int i = 0; i < n; ++i) s->tokens.push_back(i % 5);
    s->num_prompt_tokens = n - 2;
    s->num_computed_tokens = n - 1;
    return s;
  };
  auto a = make(1, 40), b = make(2, 40), c = make(3, 40);
  auto decode_step = [&](std::vector<Sequence*> seqs) {
    SchedulerOutput out;
    for (Sequence* s : seqs)
      out.scheduled.push_back(ScheduledSeq{s, s->num_tokens() - 1, 1, true, 0});
    return out;
  };
  const SpecStepShape shape{2, 40};
  // Step 1 (pure decode, no k chosen before it): chooses k for step 2, records nothing.
  ctl.begin_step(decode_step({a.get(), b.get()}));
  std::vector<int> ks = ctl.choose_and_propose_ngram({a.get(), b.get()});
  ctl.end_draft();
  EXPECT_EQ(ks, (std::vector<int>{3, 3}));  // cold bucket: k_max
  EXPECT_EQ(a->spec_asked, 3);
  EXPECT_FALSE(a->spec_tokens.empty());  // the n-gram proposer ran with k = 3
  EXPECT_FALSE(ctl.policy().predicted_seconds(shape, 3));
  // Step 2, pure decode with k = 3: records 10 ms.
  next_time = 0.010;
  ctl.begin_step(decode_step({a.get(), b.get()}));
  ctl.choose_and_propose_ngram({a.get(), b.get()});
  ctl.end_draft();
  ASSERT_TRUE(ctl.policy().predicted_seconds(shape, 3));
  EXPECT_DOUBLE_EQ(*ctl.policy().predicted_seconds(shape, 3), 0.010);
  // Step 3: a decode and a prefill chunk (same bucket: 2 rows, context < 256) take 5 s; not recorded.
  next_time = 5.0;
  SchedulerOutput mixed = decode_step({a.get()});
  mixed.scheduled.push_back(ScheduledSeq{c.get(), 0, 39, true, 0});
  phases.clear();
  ctl.begin_step(mixed);
  ctl.choose_and_propose_ngram({a.get(), c.get()});
  ctl.end_draft();
  EXPECT_TRUE(phases.empty());
  EXPECT_DOUBLE_EQ(*ctl.policy().predicted_seconds(shape, 3), 0.010);
  EngineStats st;
  st.spec_k = 3;
  ctl.fill_stats(st);
  EXPECT_TRUE(st.spec_adaptive);
  ASSERT_EQ(st.spec_chosen_k.size(), 4u);
  EXPECT_EQ(st.spec_chosen_k[0] + st.spec_chosen_k[1] + st.spec_chosen_k[2] + st.spec_chosen_k[3], 3u);
}

// ---- The engine with a fake clock ------------------------------------------------------------

const ToyExecutorConfig kToy{.vocab_size = 16, .max_model_len = 128, .block_size = 4, .num_kv_blocks = 200};

// The toy model behind a "device" that samples greedy rows itself (argmax, lowest id on ties)
// and counts the sampled rows it was sent (the engine must keep seeded ones on the host).
struct DeviceCounts {
  std::atomic<int> rows{0}, sampled_rows{0};
};
class GreedyDeviceToy final : public ModelExecutor {
 public:
  GreedyDeviceToy(ToyExecutorConfig c, std::shared_ptr<DeviceCounts> counts) : toy_(c), counts_(std::move(counts)) {}
  ExecutorInfo info() const override {
    ExecutorInfo i = toy_.info();
    i.device_sampling = true;
    return i;
  }
  StepResult execute(const StepBatch& batch) override {
    StepBatch plain = batch;
    for (auto& s : plain.seqs) s.device_sample.reset();
    StepResult all = toy_.execute(plain);
    const size_t V = size_t(all.vocab_size);
    StepResult res;
    res.vocab_size = all.vocab_size;
    size_t r = 0;
    for (const auto& s : batch.seqs) {
      if (!s.need_logits) continue;
      const size_t rows = size_t(s.num_logits);
      if (s.device_sample) {
        ++counts_->rows;
        if (s.device_sample->temperature > 0) ++counts_->sampled_rows;
        std::span<const float> row(all.logits.data() + r * V, V);
        res.sampled_ids.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
      } else {
        res.logits.insert(res.logits.end(), all.logits.begin() + long(r * V), all.logits.begin() + long((r + rows) * V));
      }
      r += rows;
    }
    return res;
  }

 private:
  ToyExecutor toy_;
  std::shared_ptr<DeviceCounts> counts_;
};

struct AdaptiveRun {
  std::map<std::string, std::vector<int32_t>> tokens;
  EngineStats stats;
};

AdaptiveRun run(std::unique_ptr<ModelExecutor> exec, const EngineConfig& cfg, int n, bool sampled) {
  auto engine = make_engine(cfg, std::move(exec));
  std::mutex mu;
  std::condition_variable cv;
  AdaptiveRun out;
  int done = 0;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    for (int t = 0; t < 6 + i; ++t) r.prompt_ids.push_back((t * 3 + i) % 16);
    r.params.temperature = sampled && i % 2 ? 0.8f : 0.0f;
    if (sampled && i % 2) r.params.seed = 1000 + i;
    r.params.max_tokens = 80;
    r.params.ignore_eos = true;
    r.on_output = [&, id = r.id](RequestOutput&& o) {
      std::lock_guard lk(mu);
      out.tokens[id].insert(out.tokens[id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) ++done, cv.notify_all();
    };
    EXPECT_TRUE(engine->submit(std::move(r)));
  }
  {
    std::unique_lock lk(mu);
    EXPECT_TRUE(cv.wait_for(lk, 30s, [&] { return done == n; }));
  }
  for (int i = 0; i < 1000 && engine->stats().kv_cache_usage != 0.0; ++i) std::this_thread::sleep_for(1ms);
  out.stats = engine->stats();
  engine->shutdown(1s);
  return out;
}

EngineConfig spec_cfg(std::function<double(int k)> verify_cost) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 256;
  c.speculative.method = SpecMethod::Ngram;
  c.speculative.num_speculative_tokens = 3;
  c.speculative.prompt_lookup_min = 1;
  c.speculative.prompt_lookup_max = 3;
  c.spec_policy.clock = [verify_cost](SpecPhase ph, const SpecStepShape&, int k, double) {
    return ph == SpecPhase::Verify ? verify_cost(k) : 0.0;
  };
  return c;
}

uint64_t sum(const std::vector<uint64_t>& v) {
  uint64_t s = 0;
  for (uint64_t x : v) s += x;
  return s;
}

TEST(SpecAdaptiveEngine, ExpensiveVerifyTurnsSpeculationOffGreedyUnchanged) {
  EngineConfig off;
  off.max_num_seqs = 8;
  off.max_num_batched_tokens = 256;
  const AdaptiveRun a = run(std::make_unique<ToyExecutor>(kToy), off, 4, false);
  const EngineConfig on = spec_cfg([](int k) { return 0.001 * (1 + 3 * k); });
  const AdaptiveRun b = run(std::make_unique<ToyExecutor>(kToy), on, 4, false);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
  ASSERT_EQ(b.stats.spec_chosen_k.size(), 4u);
  EXPECT_TRUE(b.stats.spec_adaptive);
  const uint64_t choices = sum(b.stats.spec_chosen_k);
  EXPECT_GE(choices, 70u);  // 80 tokens each, one choice per step (4 sequences decode together)
  EXPECT_GE(b.stats.spec_chosen_k[0] * 3, choices * 2) << "k=0 chosen " << b.stats.spec_chosen_k[0] << " of " << choices;
  EXPECT_GT(b.stats.spec_k_explorations, 0u);
  EXPECT_LE(b.stats.spec_k_explorations, choices / 8 + 4);  // a bucket explores once per 8 choices
  EXPECT_GT(b.stats.spec_num_drafts, 0u);  // k > 0 did run (the cold start and explorations)
  EXPECT_EQ(b.stats.spec_last_k, 0);  // the last choice had no budget (max_tokens)
  std::printf("choices %llu: k0 %llu k1 %llu k2 %llu k3 %llu, explorations %llu, verify rows %llu\n",
              (unsigned long long)choices, (unsigned long long)b.stats.spec_chosen_k[0],
              (unsigned long long)b.stats.spec_chosen_k[1], (unsigned long long)b.stats.spec_chosen_k[2],
              (unsigned long long)b.stats.spec_chosen_k[3], (unsigned long long)b.stats.spec_k_explorations,
              (unsigned long long)b.stats.spec_num_drafts);
}

TEST(SpecAdaptiveEngine, FlatVerifyCostKeepsMaxK) {
  EngineConfig pinned = spec_cfg([](int) { return 0.001; });
  pinned.spec_policy.pinned_k = 3;
  const AdaptiveRun a = run(std::make_unique<ToyExecutor>(kToy), pinned, 4, false);
  const AdaptiveRun b = run(std::make_unique<ToyExecutor>(kToy), spec_cfg([](int) { return 0.001; }), 4, false);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_FALSE(a.stats.spec_adaptive);
  EXPECT_EQ(a.stats.spec_k_explorations, 0u);
  const uint64_t choices = sum(b.stats.spec_chosen_k);
  EXPECT_GE(b.stats.spec_chosen_k[3] * 3, choices * 2) << "k=3 chosen " << b.stats.spec_chosen_k[3] << " of " << choices;
  EXPECT_GT(b.stats.spec_num_drafts, 100u);
  EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
}

// While k adapts, seeded sampled rows stay on the host sampler, so they give exactly what
// speculation off on the host sampler gives; greedy rows still go to the device at k = 0.
TEST(SpecAdaptiveEngine, SeededSampledRowsStayOnTheHostAndReproduce) {
  EngineConfig off;
  off.max_num_seqs = 8;
  off.max_num_batched_tokens = 256;
  off.device_sampling = false;
  const AdaptiveRun a = run(std::make_unique<ToyExecutor>(kToy), off, 6, true);
  auto counts = std::make_shared<DeviceCounts>();
  const AdaptiveRun b = run(std::make_unique<GreedyDeviceToy>(kToy, counts),
                    spec_cfg([](int k) { return 0.001 * (1 + 3 * k); }), 6, true);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(counts->sampled_rows.load(), 0) << "a seeded sampled row went to the device sampler";
  EXPECT_GT(counts->rows.load(), 50) << "greedy rows of plain (k = 0) steps go to the device";
  EXPECT_GT(b.stats.spec_chosen_k[0], 0u);
  // Pinned k (vLLM's behaviour) keeps today's rule: plain rows of seeded requests may go to the device.
  auto pinned_counts = std::make_shared<DeviceCounts>();
  EngineConfig pinned = spec_cfg([](int) { return 0.001; });
  pinned.spec_policy.pinned_k = 3;
  run(std::make_unique<GreedyDeviceToy>(kToy, pinned_counts), pinned, 6, true);
  EXPECT_EQ(pinned_counts->sampled_rows.load() > 0, true);
}

}  // namespace
}  // namespace moeserve
