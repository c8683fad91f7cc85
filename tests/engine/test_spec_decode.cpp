// Speculative decoding on the host: --speculative-config parsing (every refusal), the n-gram
// proposer, the scheduler's lookahead slots and rollback, and the engine with speculation on
// against the same engine with it off (Toy and Replay executors: greedy and seeded sampling
// identical token for token, stops / max_tokens inside an accepted run, logprobs, penalties,
// KV back to 0 after aborts, vLLM's counters).
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/spec_config.h"
#include "engine/spec_decode.h"
#include "engine/testing/replay_executor.h"
#include "engine/testing/toy_executor.h"

namespace moeserve {
namespace {

using namespace std::chrono_literals;
using testing::ReplayExecutor;
using testing::ReplayExecutorConfig;
using testing::ToyExecutor;
using testing::ToyExecutorConfig;

std::string error_of(const std::string& json) {
  try {
    parse_speculative_config(json);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpecConfigParse, NgramDefaultsAndMirrors) {
  SpecConfig c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3})");
  EXPECT_EQ(c.method, SpecMethod::Ngram);
  EXPECT_EQ(c.num_speculative_tokens, 3);
  EXPECT_EQ(c.prompt_lookup_min, 5);
  EXPECT_EQ(c.prompt_lookup_max, 5);
  c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})");
  EXPECT_EQ(c.prompt_lookup_min, 4);
  EXPECT_EQ(c.prompt_lookup_max, 4);
  c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2})");
  EXPECT_EQ(c.prompt_lookup_max, 2);
  // `model: "ngram"` without a method, and defaults spelled out (vLLM's defaults change nothing).
  c = parse_speculative_config(
      R"({"model": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
          "enforce_eager": false, "disable_padded_drafter_batch": false, "draft_tensor_parallel_size": 1,
          "rejection_sample_method": "standard", "draft_sample_method": "greedy", "quantization": null})");
  EXPECT_EQ(c.method, SpecMethod::Ngram);
  EXPECT_EQ(c.prompt_lookup_min, 1);
  EXPECT_EQ(c.prompt_lookup_max, 3);
  EXPECT_EQ(parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":1,"draft_tensor_parallel_size":4})",
                                     SpecParseContext{.tensor_parallel_size = 4})
                .draft_tensor_parallel_size,
            4);
}

TEST(SpecConfigParse, DraftHeadMethods) {
  SpecConfig e = parse_speculative_config(R"({"method": "eagle3", "model": "d/eagle3", "num_speculative_tokens": 3})");
  EXPECT_EQ(e.method, SpecMethod::Eagle3);
  EXPECT_EQ(e.model, "d/eagle3");
  EXPECT_EQ(e.num_speculative_tokens, 3);
  // Inferred from the model name as vLLM does.
  EXPECT_EQ(parse_speculative_config(R"({"model": "thoughtworks/MiniMax-M2.5-Eagle3", "num_speculative_tokens": 3})")
                .method,
            SpecMethod::Eagle3);
  SpecConfig m = parse_speculative_config(R"({"method": "deepseek_mtp", "num_speculative_tokens": 2})");
  EXPECT_EQ(m.method, SpecMethod::Mtp);
  EXPECT_TRUE(m.model.empty());
  EXPECT_EQ(describe(m), "mtp, num_speculative_tokens 2 (modules of the target checkpoint)");
}

TEST(SpecConfigParse, EveryRefusalNamesItsReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not valid JSON"},
      {"[1]", "expected a JSON object"},
      {R"({"num_speculative_tokens": 3})", "no \"method\" and no \"model\""},
      {R"({"method": "ngram"})", "\"num_speculative_tokens\" is required"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "must be in [1, 32]"},
      {R"({"method": "ngram", "num_speculative_tokens": 33})", "must be in [1, 32]"},
      {R"({"method": "ngram", "num_speculative_tokens": "3"})", "must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2})",
       "must be <= \"prompt_lookup_max\""},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0})", "must be >= 1"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "frobnicate": 1})", "unknown key \"frobnicate\""},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "tensor_parallel_size": 2})",
       "use \"draft_tensor_parallel_size\""},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2})",
       "must be 1 or the target's tensor parallel size 1"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "model": "org/draft"})", "takes no draft \"model\""},
      {R"({"method": "frob", "num_speculative_tokens": 3})", "unknown method \"frob\""},
      {R"({"method": "eagle3", "num_speculative_tokens": 3})", "needs \"model\": the EAGLE-3 draft's directory"},
      {R"({"method": "eagle3", "model": "x", "num_speculative_tokens": 3, "prompt_lookup_min": 2})",
       "\"prompt_lookup_min\" is an n-gram key"},
      {R"({"method": "eagle3", "model": "x"})", "\"num_speculative_tokens\" is required for method \"eagle3\""},
      {R"({"method": "eagle", "model": "x", "num_speculative_tokens": 3})", "method \"eagle\""},
      {R"({"model": "org/small-draft", "num_speculative_tokens": 3})", "method \"draft_model\""},
      {R"({"method": "mtp", "model": "org/x", "num_speculative_tokens": 1})", "omit \"model\""},
      {R"({"method": "deepseek_mtp", "num_speculative_tokens": 1, "prompt_lookup_max": 3})", "an n-gram key"},
      {R"({"method": "ngram_gpu", "num_speculative_tokens": 3})", "use \"ngram\""},
      {R"({"method": "suffix", "num_speculative_tokens": 3})", "method \"suffix\""},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "enforce_eager": true})", "\"enforce_eager\": true"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "quantization": "fp8"})", "draft-model override"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1,8,3]]})",
       "a k per batch size is not implemented"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic"})",
       "only the exact rule"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"})",
       "without probabilities"},
      {R"({"method": "ngram", "num_speculative_tokens": 3, "speculative_token_tree": "[(0,)]"})", "tree drafting"},
  };
  for (const auto& [json, want] : cases) {
    const std::string e = error_of(json);
    EXPECT_NE(e.find(want), std::string::npos) << json << " -> '" << e << "'";
    EXPECT_NE(e.find("--speculative-config"), std::string::npos) << e;
  }
}

TEST(NgramProposer, FollowsVllm) {
  const std::vector<int32_t> t = {1, 2, 3, 4, 2, 3};
  EXPECT_EQ(propose_ngram(t, 2, 3, 4), (std::vector<int32_t>{4, 2, 3}));  // vLLM's docstring example
  EXPECT_EQ(propose_ngram(t, 2, 3, 1), (std::vector<int32_t>{4}));
  EXPECT_TRUE(propose_ngram(t, 3, 3, 4).empty());  // [4, 2, 3] does not occur earlier
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1, 2, 3}, 1, 3, 2).empty());
  // The longest match ([5, 3], followed by 8) wins over the shorter, earlier [3] (followed by 9).
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{7, 3, 9, 5, 3, 8, 5, 3}, 1, 2, 1), (std::vector<int32_t>{8}));
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{3, 1, 3, 2, 3}, 1, 4, 2), (std::vector<int32_t>{1, 3}));
  // Matches are capped at max_n: both occurrences of [1,2] tie at length 2 -> the earliest.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{1, 2, 9, 0, 1, 2, 8, 1, 2}, 1, 2, 2), (std::vector<int32_t>{9, 0}));
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{1, 2, 9, 0, 1, 2, 8, 1, 2}, 3, 3, 2).size(), 0u);
  // The longest proper match (3 tokens, ending at index 2) leaves one token to propose.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{5, 5, 5, 5}, 1, 5, 3), (std::vector<int32_t>{5}));
}

// The acceptance law at temperature > 0 (chi-square, fixed seeds): with draft x at position 0,
// the emitted token is distributed as p (the target's), x is accepted with probability p(x),
// a rejection emits a token from p without x, and after an acceptance position 1 (the bonus)
// follows its own row: vLLM's rule for drafts without probabilities.
TEST(SpecVerify, AcceptanceLawMatchesTargetDistribution) {
  constexpr int V = 8, kTrials = 40000;
  const std::vector<float> row0 = {0.1f, 1.2f, 0.9f, -0.5f, 0.3f, 1.5f, -1.0f, 0.0f};
  const std::vector<float> row1 = {1.0f, -0.2f, 0.4f, 0.8f, -1.5f, 0.1f, 0.6f, 0.2f};
  std::vector<float> logits = row0;
  logits.insert(logits.end(), row1.begin(), row1.end());
  auto probs = [](const std::vector<float>& r, double t) {
    std::vector<double> p(r.size());
    double z = 0;
    for (size_t i = 0; i < r.size(); ++i) z += p[i] = std::exp(r[i] / t);
    for (double& x : p) x /= z;
    return p;
  };
  const double T = 0.8;
  const std::vector<double> p0 = probs(row0, T), p1 = probs(row1, T);
  auto req = std::make_shared<Request>();
  req->params.temperature = float(T);
  req->params.max_tokens = 100;
  const int32_t draft[] = {2};
  std::vector<double> first(V, 0), rejected(V, 0), bonus(V, 0);
  int accepted = 0;
  for (int i = 0; i < kTrials; ++i) {
    Sequence s;
    s.request = req;
    s.tokens = {1};
    s.num_prompt_tokens = 1;
    s.sampler.rng.seed(uint64_t(i) * 7919 + 13);
    const VerifyOutcome o = verify_and_sample(
        s, VerifyInput{.logits = logits, .drafts = draft, .eos_token_ids = nullptr, .max_model_len = 100});
    ASSERT_TRUE(o.error.empty());
    ASSERT_EQ(o.emitted.size(), size_t(o.num_accepted + 1));
    ++first[o.emitted[0].token];
    if (o.num_accepted == 1) {
      ++accepted;
      ++bonus[o.emitted[1].token];
    } else {
      ++rejected[o.emitted[0].token];
    }
  }
  // Chi-square statistic of `counts` against `expected` probabilities (zero cells skipped).
  auto chi2 = [](const std::vector<double>& counts, const std::vector<double>& expected) {
    double n = 0, x = 0;
    for (double c : counts) n += c;
    for (size_t i = 0; i < counts.size(); ++i)
      if (expected[i] > 0) x += (counts[i] - n * expected[i]) * (counts[i] - n * expected[i]) / (n * expected[i]);
    return x;
  };
  std::vector<double> p0_without_x = p0;
  p0_without_x[2] = 0;
  for (double& q : p0_without_x) q /= 1 - p0[2];
  constexpr double kCrit7 = 24.32, kCrit6 = 22.46;  // p = 0.001 with 7 and 6 degrees of freedom
  EXPECT_LT(chi2(first, p0), kCrit7);
  EXPECT_LT(chi2(rejected, p0_without_x), kCrit6);
  EXPECT_LT(chi2(bonus, p1), kCrit7);
  const double rate = double(accepted) / kTrials;
  EXPECT_NEAR(rate, p0[2], 4 * std::sqrt(p0[2] * (1 - p0[2]) / kTrials));
  EXPECT_EQ(rejected[2], 0);
}

// --- scheduler: lookahead slots and rollback -------------------------------------------------

struct SchedFixture {
  BlockManager bm{BlockManagerConfig{.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true, .hash_fn = {}}};
  Scheduler sched;
  explicit SchedFixture(int budget = 32)
      : sched(SchedulerConfig{.max_num_seqs = 8, .max_num_batched_tokens = budget, .max_model_len = 32}, bm) {}
  Sequence* add(int id, std::vector<int32_t> prompt) {
    auto s = std::make_unique<Sequence>();
    s->id = id;
    static auto req = std::make_shared<Request>();
    s->request = req;
    s->tokens = std::move(prompt);
    s->num_prompt_tokens = int(s->tokens.size());
    return sched.add(std::move(s));
  }
  // Runs one step and appends `next` as the sampled token of every sampling sequence.
  SchedulerOutput step(int32_t next = 1) {
    SchedulerOutput o = sched.schedule();
    sched.on_step_executed(o);
    for (auto& sc : o.scheduled)
      if (sc.sample) sc.seq->tokens.push_back(next);
    return o;
  }
};

TEST(SpecScheduler, DraftsAreQueryTokensWithLookaheadBlocks) {
  SchedFixture f;
  Sequence* s = f.add(1, {1, 2, 3, 4, 5});  // 5 tokens: 2 blocks
  f.step();                                   // prefill; s has 6 tokens, 5 computed
  EXPECT_EQ(f.bm.num_used_blocks(), 2);
  s->spec_tokens = {7, 8, 9, 10};
  SchedulerOutput o = f.sched.schedule();
  ASSERT_EQ(o.scheduled.size(), 1u);
  EXPECT_EQ(o.scheduled[0].num_spec, 4);
  EXPECT_EQ(o.scheduled[0].num_tokens, 5);
  EXPECT_EQ(o.batch.seqs[0].tokens, (std::vector<int32_t>{1, 7, 8, 9, 10}));
  EXPECT_EQ(o.batch.seqs[0].num_logits, 5);
  EXPECT_EQ(o.num_batched_tokens, 5);
  EXPECT_EQ(f.bm.num_used_blocks(), 3);  // positions 5..9: lookahead into block 2
  f.sched.on_step_executed(o);
  EXPECT_EQ(s->num_computed_tokens, 10);
  // One draft accepted: tokens gain 7 and the target's token; K/V valid up to position 6.
  s->tokens.insert(s->tokens.end(), {7, 42});
  f.sched.rollback_rejected(s, s->num_tokens() - 1);
  EXPECT_EQ(s->num_computed_tokens, 7);
  EXPECT_EQ(s->num_uncomputed(), 1);
  EXPECT_EQ(f.bm.num_used_blocks(), 2);  // the lookahead block held only rejected drafts: freed
  EXPECT_THROW(f.sched.rollback_rejected(s, 9), Error);
}

TEST(SpecScheduler, DraftsYieldToOtherDecodesBudgetAndBlocks) {
  SchedFixture f(/*budget=*/4);
  Sequence* a = f.add(1, {1, 2, 3});
  Sequence* b = f.add(2, {4, 5, 6});
  f.step();  // a: 3 tokens
  f.step();  // a decodes (1), b prefills 3
  ASSERT_EQ(a->num_uncomputed(), 1);
  ASSERT_EQ(b->num_uncomputed(), 1);
  a->spec_tokens = {9, 9, 9, 9, 9};
  SchedulerOutput o = f.sched.schedule();
  ASSERT_EQ(o.scheduled.size(), 2u);
  EXPECT_EQ(o.scheduled[0].num_spec, 2);  // budget 4: a's token + 2 drafts, b keeps its token
  EXPECT_EQ(o.scheduled[1].num_tokens, 1);
  EXPECT_EQ(o.num_batched_tokens, 4);
  f.sched.on_step_executed(o);
  f.sched.rollback_rejected(a, a->num_computed_tokens - 2);  // both drafts rejected
  a->tokens.push_back(3);
  b->tokens.push_back(3);
  a->spec_tokens.clear();
  // Blocks: fill the pool so the drafts' lookahead block is not there; the drafts are dropped,
  // nobody is preempted.
  SchedFixture g(32);
  Sequence* c = g.add(1, std::vector<int32_t>(15, 2));  // 4 blocks
  Sequence* d = g.add(2, std::vector<int32_t>(15, 3));  // 4 blocks: the pool is full
  g.step();
  ASSERT_EQ(g.bm.num_free_blocks(), 0);
  c->spec_tokens = {1, 1};
  o = g.sched.schedule();
  EXPECT_TRUE(o.preempted.empty());
  ASSERT_EQ(o.scheduled.size(), 2u);
  EXPECT_EQ(o.scheduled[0].num_spec, 0);
  EXPECT_EQ(o.batch.seqs[0].num_logits, 1);
  (void)d;
}

TEST(SpecScheduler, MaxModelLenCutsDraftsAndPreemptionDropsThem) {
  SchedFixture f;
  Sequence* s = f.add(1, std::vector<int32_t>(29, 4));
  f.step();  // 30 tokens, 29 computed; max_model_len 32
  s->spec_tokens = {1, 2, 3, 4};
  SchedulerOutput o = f.sched.schedule();
  EXPECT_EQ(o.scheduled[0].num_spec, 2);  // positions 29..31
  f.sched.on_step_executed(o);
  f.sched.rollback_rejected(s, 29);
  s->tokens.push_back(1);
  // Preemption (a victim) clears its drafts.
  SchedFixture g;
  Sequence* a = g.add(1, std::vector<int32_t>(16, 1));  // 4 blocks
  Sequence* b = g.add(2, std::vector<int32_t>(16, 2));  // 4 blocks
  g.step();
  ASSERT_EQ(g.bm.num_free_blocks(), 0);
  b->spec_tokens = {5, 6};
  o = g.sched.schedule();  // a needs a 5th block: b (newest) is preempted
  ASSERT_EQ(o.preempted.size(), 1u);
  EXPECT_EQ(o.preempted[0], b);
  EXPECT_TRUE(b->spec_tokens.empty());
  (void)a;
}

// --- engine: speculation on vs off -------------------------------------------------------------

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<TokenLogprob>> logprobs;
  std::map<std::string, RequestOutput> final;
  std::function<void(RequestOutput&&)> sink() {
    return [this](RequestOutput&& o) {
      std::lock_guard lk(mu);
      auto& t = tokens[o.request_id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      auto& l = logprobs[o.request_id];
      l.insert(l.end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finished) {
        final[o.request_id] = o;
        cv.notify_all();
      }
    };
  }
  bool wait_finished(size_t n) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, 30s, [&] { return final.size() >= n; });
  }
};

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

struct RunResult {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<TokenLogprob>> logprobs;
  std::map<std::string, FinishReason> reasons;
  EngineStats stats;
};

RunResult run(std::unique_ptr<ModelExecutor> exec, EngineConfig cfg, const std::vector<Job>& jobs) {
  auto engine = make_engine(cfg, std::move(exec));
  Collector c;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    r.prompt_ids = jobs[i].prompt;
    r.params = jobs[i].params;
    r.on_output = c.sink();
    EXPECT_TRUE(engine->submit(std::move(r)));
  }
  EXPECT_TRUE(c.wait_finished(jobs.size()));
  RunResult res;
  // The engine publishes its stats after the step that finished the last request.
  for (int i = 0; i < 1000 && engine->stats().kv_cache_usage != 0.0; ++i) std::this_thread::sleep_for(1ms);
  res.stats = engine->stats();
  engine->shutdown(1s);
  std::lock_guard lk(c.mu);
  res.tokens = c.tokens;
  res.logprobs = c.logprobs;
  for (auto& [id, o] : c.final) res.reasons[id] = o.finish_reason;
  return res;
}

EngineConfig engine_cfg(int max_seqs, int max_tokens, std::vector<int32_t> eos = {}) {
  EngineConfig c;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = max_tokens;
  c.eos_token_ids = std::move(eos);
  return c;
}

SpecConfig ngram(int k, int min_n, int max_n) {
  SpecConfig s;
  s.method = SpecMethod::Ngram;
  s.num_speculative_tokens = k;
  s.prompt_lookup_min = min_n;
  s.prompt_lookup_max = max_n;
  return s;
}

// A small vocabulary and prompts with repeats, so n=1 lookups propose drafts at most steps and
// most are rejected: every step exercises verification and rollback.
const ToyExecutorConfig kToy{.vocab_size = 16, .max_model_len = 128, .block_size = 4, .num_kv_blocks = 200};

std::vector<Job> toy_jobs(SamplingParams base, int n) {
  std::vector<Job> jobs;
  for (int i = 0; i < n; ++i) {
    Job j;
    for (int t = 0; t < 3 + (i * 7) % 20; ++t) j.prompt.push_back((t * 3 + i) % 16);
    j.params = base;
    j.params.max_tokens = 20 + (i * 13) % 40;
    j.params.ignore_eos = true;
    if (base.seed) j.params.seed = *base.seed + uint64_t(i);
    jobs.push_back(j);
  }
  return jobs;
}

void expect_same(const RunResult& a, const RunResult& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (const auto& [id, t] : a.tokens) {
    EXPECT_EQ(t, b.tokens.at(id)) << id;
    EXPECT_EQ(a.reasons.at(id), b.reasons.at(id)) << id;
  }
}

TEST(SpecEngine, GreedyIdenticalWithMixedPrefillDecodeBatches) {
  SamplingParams p;
  p.temperature = 0;
  const auto jobs = toy_jobs(p, 12);
  EngineConfig off = engine_cfg(6, 16);
  EngineConfig on = off;
  on.speculative = ngram(4, 1, 3);
  on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  const RunResult a = run(std::make_unique<ToyExecutor>(kToy), off, jobs);
  const RunResult b = run(std::make_unique<ToyExecutor>(kToy), on, jobs);
  expect_same(a, b);
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_EQ(b.tokens.at("r" + std::to_string(i)),
              ToyExecutor::reference_greedy(kToy, jobs[i].prompt, jobs[i].params.max_tokens));
  EXPECT_EQ(a.stats.spec_k, 0);
  EXPECT_EQ(b.stats.spec_k, 4);
  EXPECT_GT(b.stats.spec_num_drafts, 50u);
  EXPECT_GT(b.stats.spec_num_accepted_tokens, 0u);
  EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
}

TEST(SpecEngine, SeededSamplingWithEveryLogitsStageIsIdentical) {
  // Temperature > 0: each emitted token is drawn from the position's distribution with the
  // request's RNG, as without speculation, so seeded outputs agree token for token (a stronger
  // check than comparing distributions). Penalties, bias, bad words, min_tokens and logprobs
  // see the accepted drafts before each position.
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 8;
  p.top_p = 0.95f;
  p.seed = 1234;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.1f;
  p.logit_bias = {{3, 2.0f}, {5, -1.0f}};
  p.bad_words_token_ids = {{4, 6}};
  p.min_tokens = 5;
  p.logprobs = 2;
  auto jobs = toy_jobs(p, 10);
  for (auto& j : jobs) j.params.ignore_eos = false;
  EngineConfig off = engine_cfg(4, 24, {0});
  EngineConfig on = off;
  on.speculative = ngram(3, 1, 2);
  on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  const RunResult a = run(std::make_unique<ToyExecutor>(kToy), off, jobs);
  const RunResult b = run(std::make_unique<ToyExecutor>(kToy), on, jobs);
  expect_same(a, b);
  for (const auto& [id, lp] : a.logprobs) {
    const auto& lq = b.logprobs.at(id);
    ASSERT_EQ(lp.size(), lq.size()) << id;
    for (size_t i = 0; i < lp.size(); ++i) {
      EXPECT_EQ(lp[i].token_id, lq[i].token_id);
      EXPECT_EQ(lp[i].logprob, lq[i].logprob);
      EXPECT_EQ(lp[i].top, lq[i].top);
    }
  }
  EXPECT_GT(b.stats.spec_num_drafts, 20u);
}

TEST(SpecEngine, AllowedTokensAndThinkingBudgetIdentical) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 99;
  p.allowed_token_ids = {1, 2, 3, 7, 8, 9};
  p.thinking = {.max_tokens = 4, .start_token = 7, .end_token = 8};
  const auto jobs = toy_jobs(p, 8);
  EngineConfig off = engine_cfg(8, 64);
  EngineConfig on = off;
  on.speculative = ngram(5, 1, 4);
  on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  const RunResult a = run(std::make_unique<ToyExecutor>(kToy), off, jobs);
  const RunResult b = run(std::make_unique<ToyExecutor>(kToy), on, jobs);
  expect_same(a, b);
  EXPECT_GT(b.stats.spec_num_accepted_tokens, 0u);
}

// Replay: a periodic script, so n-gram drafts are (mostly) right and long runs are accepted.
ReplayExecutorConfig periodic_replay(int length) {
  ReplayExecutorConfig c;
  c.vocab_size = 32;
  c.max_model_len = 256;
  c.block_size = 4;
  c.num_kv_blocks = 256;
  c.end_token = 31;
  testing::ReplayScript s;
  for (int i = 0; i < length; ++i) s.tokens.push_back(10 + i % 5);
  c.scripts.push_back(s);
  return c;
}

TEST(SpecEngine, StopsAndMaxTokensInsideAcceptedRuns) {
  // Every draft of the periodic script is accepted once the period is seen; max_tokens and stop
  // ids land inside accepted runs and end exactly where plain decoding ends.
  std::vector<Job> jobs;
  for (int mt : {1, 2, 5, 7, 11, 12, 13, 30}) {
    Job j;
    j.prompt = {1, 2, 3};
    j.params.temperature = 0;
    j.params.max_tokens = mt;
    jobs.push_back(j);
  }
  Job stop;
  stop.prompt = {1, 2};
  stop.params.temperature = 0;
  stop.params.max_tokens = 40;
  stop.params.stop_token_ids = {13};
  stop.params.min_tokens = 9;  // the first 13s (positions 3 and 8) are below min_tokens
  jobs.push_back(stop);
  Job eos = stop;
  eos.params.stop_token_ids = {};
  eos.params.min_tokens = 0;
  jobs.push_back(eos);  // runs into end_token 31 (EOS) after the 20-token script
  EngineConfig off = engine_cfg(16, 64, {31});
  EngineConfig on = off;
  on.speculative = ngram(4, 2, 3);
  on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  const RunResult a = run(std::make_unique<ReplayExecutor>(periodic_replay(20)), off, jobs);
  const RunResult b = run(std::make_unique<ReplayExecutor>(periodic_replay(20)), on, jobs);
  expect_same(a, b);
  EXPECT_EQ(b.tokens.at("r8").size(), 14u);  // 13 at output index 13 (min_tokens 9 skips 3 and 8)
  EXPECT_EQ(b.reasons.at("r8"), FinishReason::Stop);
  EXPECT_EQ(b.tokens.at("r9").size(), 21u);
  EXPECT_EQ(b.tokens.at("r9").back(), 31);
  // Acceptance: after the first period almost every draft is accepted.
  ASSERT_EQ(b.stats.spec_accepted_per_pos.size(), 4u);
  EXPECT_GT(b.stats.spec_num_accepted_tokens * 10, b.stats.spec_num_draft_tokens * 8);
  uint64_t sum = 0;
  for (size_t i = 0; i < 4; ++i) {
    sum += b.stats.spec_accepted_per_pos[i];
    if (i) {
      EXPECT_LE(b.stats.spec_accepted_per_pos[i], b.stats.spec_accepted_per_pos[i - 1]);
    }
  }
  EXPECT_EQ(sum, b.stats.spec_num_accepted_tokens);
  EXPECT_LE(b.stats.spec_accepted_per_pos[0], b.stats.spec_num_drafts);
  EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
}

// Adaptive k (engine/spec_policy.h) with a fake clock: a verify step costs 1 + 3k at 4 or more
// sequences (k = 0 wins there) and 1 below (k_max wins), so k changes as batches shrink.
SpecPolicyOptions adaptive_by_batch() {
  SpecPolicyOptions o;
  o.clock = [](SpecPhase ph, const SpecStepShape& shape, int k, double) {
    return ph == SpecPhase::Draft ? 0.0 : shape.num_seqs >= 4 ? 0.001 * (1 + 3 * k) : 0.001;
  };
  return o;
}

class SpecEngineK : public ::testing::TestWithParam<bool> {};  // true: adaptive k, false: pinned
INSTANTIATE_TEST_SUITE_P(PinnedAndAdaptive, SpecEngineK, ::testing::Bool());

TEST_P(SpecEngineK, AbortsMidVerifyLeaveNoKv) {
  ReplayExecutorConfig rc = periodic_replay(200);
  rc.step_sleep = 2ms;
  EngineConfig cfg = engine_cfg(8, 64);
  cfg.speculative = ngram(4, 2, 3);
  cfg.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  if (GetParam()) {  // adaptive, flat cost: mostly k = 4, with explorations of the others
    cfg.spec_policy = SpecPolicyOptions{};
    cfg.spec_policy.clock = [](SpecPhase, const SpecStepShape&, int, double) { return 0.001; };
  }
  auto engine = make_engine(cfg, std::make_unique<ReplayExecutor>(rc));
  Collector c;
  for (int i = 0; i < 6; ++i) {
    Request r;
    r.id = "a" + std::to_string(i);
    r.prompt_ids = {1, 2, i % 2 ? 3 : 4};
    r.params.temperature = 0;
    r.params.max_tokens = 150;
    r.on_output = c.sink();
    ASSERT_TRUE(engine->submit(std::move(r)));
  }
  // Wait until drafts are being verified, then abort everything while steps run.
  for (int i = 0; i < 2000 && engine->stats().spec_num_accepted_tokens < 20; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_GE(engine->stats().spec_num_accepted_tokens, 20u);
  for (int i = 0; i < 6; ++i) engine->abort("a" + std::to_string(i));
  ASSERT_TRUE(c.wait_finished(6));
  bool idle = false;
  for (int i = 0; i < 2000 && !idle; ++i) {
    const EngineStats s = engine->stats();
    idle = s.num_running == 0 && s.num_waiting == 0 && s.kv_cache_usage == 0.0;
    if (!idle) std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(idle);
  for (auto& [id, o] : c.final) EXPECT_EQ(o.finish_reason, FinishReason::Abort) << id;
  engine->shutdown(1s);
}

TEST_P(SpecEngineK, PreemptionAndPrefixCachingStayExact) {
  // A small KV pool forces preemption (recompute) while sequences speculate; shared prompt
  // prefixes hit the cache.
  ToyExecutorConfig small = kToy;
  small.num_kv_blocks = 40;
  SamplingParams p;
  p.temperature = 0;
  std::vector<Job> jobs = toy_jobs(p, 10);
  for (auto& j : jobs) j.prompt.insert(j.prompt.begin(), {1, 2, 3, 4, 5, 6, 7, 8});
  EngineConfig off = engine_cfg(8, 32);
  EngineConfig on = off;
  on.speculative = ngram(6, 1, 2);
  on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  if (GetParam()) on.spec_policy = adaptive_by_batch();
  const RunResult a = run(std::make_unique<ToyExecutor>(small), off, jobs);
  const RunResult b = run(std::make_unique<ToyExecutor>(small), on, jobs);
  expect_same(a, b);
  EXPECT_GT(b.stats.num_preemptions, 0u);
  EXPECT_GT(b.stats.prefix_cache_hits, 0u);
  EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
  if (GetParam()) {
    ASSERT_EQ(b.stats.spec_chosen_k.size(), 7u);
    EXPECT_GT(b.stats.spec_chosen_k[0], 0u);
    EXPECT_GT(b.stats.spec_chosen_k[6], 0u);
  }
}

TEST(SpecEngine, RefusesUnimplementedMethods) {
  EngineConfig cfg;
  cfg.speculative.method = SpecMethod::Eagle3;
  cfg.speculative.num_speculative_tokens = 3;
  EXPECT_THROW(make_engine(cfg, std::make_unique<ToyExecutor>(kToy)), Error);
}

}  // namespace
}  // namespace moeserve
