// Scheduler tests: the scheduler and block manager driven step by step against the
// ToyExecutor (whose logits depend on the context read back through the block tables),
// with greedy sampling, so every output can be compared with ToyExecutor::reference_greedy.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/stop.h"
#include "engine/testing/toy_executor.h"

namespace moeserve {
namespace {

using testing::ToyExecutor;
using testing::ToyExecutorConfig;

struct Harness {
  ToyExecutorConfig tcfg;
  ToyExecutor exec;
  BlockManager bm;
  Scheduler sched;
  int64_t next_id = 1;
  std::map<int64_t, std::vector<int32_t>> outputs;  // finished: generated tokens
  std::vector<int64_t> finish_order;

  Harness(ToyExecutorConfig t, SchedulerConfig s, bool prefix = true)
      : tcfg(t),
        exec(t),
        bm({.num_blocks = t.num_kv_blocks, .block_size = t.block_size, .enable_prefix_caching = prefix}),
        sched(s, bm) {}

  Sequence* add(std::vector<int32_t> prompt, int max_tokens) {
    auto req = std::make_shared<Request>();
    req->id = std::to_string(next_id);
    req->prompt_ids = prompt;
    req->params.temperature = 0;
    req->params.max_tokens = max_tokens;
    auto s = std::make_unique<Sequence>();
    s->id = next_id++;
    s->request = req;
    s->tokens = prompt;
    s->num_prompt_tokens = static_cast<int>(prompt.size());
    return sched.add(std::move(s));
  }

  // One engine step; returns the scheduler output's shape.
  SchedulerOutput step() {
    SchedulerOutput out = sched.schedule();
    if (out.empty()) return out;
    StepResult res = exec.execute(out.batch);
    sched.on_step_executed(out);
    int row = 0;
    std::vector<Sequence*> done;
    for (const auto& sc : out.scheduled) {
      if (!sc.sample) continue;
      Sequence* s = sc.seq;
      auto r = sample_next(*s, {.logits = std::span<const float>(res.logits.data() + size_t(row++) * tcfg.vocab_size,
                                                                 size_t(tcfg.vocab_size))});
      s->tokens.push_back(r.token);
      note_generated(*s, r.token);
      if (check_stop(*s, {}, sched.config().max_model_len).reason != FinishReason::None) done.push_back(s);
    }
    for (Sequence* s : done) {
      outputs[s->id] = std::vector<int32_t>(s->output().begin(), s->output().end());
      finish_order.push_back(s->id);
      sched.remove(s, FinishReason::Length);
    }
    return out;
  }

  int run(int max_steps = 10000) {
    int steps = 0;
    while (sched.has_work() && steps < max_steps) {
      step();
      ++steps;
    }
    return steps;
  }
};

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 7 + salt * 13 + 1) % 64;
  return p;
}

TEST(Scheduler, TokenBudgetAndChunkedPrefill) {
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 256, .block_size = 4, .num_kv_blocks = 128};
  Harness h(t, {.max_num_seqs = 8, .max_num_batched_tokens = 16, .max_model_len = 256});
  auto long_prompt = prompt_of(50, 1);
  Sequence* s = h.add(long_prompt, 5);
  const int64_t id = s->id;
  std::vector<int> chunks;
  std::vector<bool> logits;
  for (int i = 0; i < 4; ++i) {
    auto out = h.step();
    ASSERT_EQ(out.scheduled.size(), 1u);
    chunks.push_back(out.scheduled[0].num_tokens);
    logits.push_back(out.batch.seqs[0].need_logits);
  }
  EXPECT_EQ(chunks, (std::vector<int>{16, 16, 16, 2}));
  EXPECT_EQ(logits, (std::vector<bool>{false, false, false, true}));
  // More requests: every step stays within the budget.
  for (int i = 0; i < 6; ++i) h.add(prompt_of(10 + 7 * i, 2 + i), 8);
  h.run();
  for (const auto& r : h.exec.records()) EXPECT_LE(r.num_tokens, 16);
  EXPECT_EQ(h.outputs[id], ToyExecutor::reference_greedy(t, long_prompt, 5));
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(h.outputs[id + 1 + i], ToyExecutor::reference_greedy(t, prompt_of(10 + 7 * i, 2 + i), 8)) << i;
  EXPECT_EQ(h.bm.num_free_blocks(), t.num_kv_blocks);
}

TEST(Scheduler, MaxNumSeqsAndFcfsAdmission) {
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 128, .block_size = 4, .num_kv_blocks = 128};
  Harness h(t, {.max_num_seqs = 3, .max_num_batched_tokens = 64, .max_model_len = 128});
  std::vector<int64_t> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(h.add(prompt_of(6, i), 4 + (i % 3))->id);
  std::vector<int64_t> admitted;
  while (h.sched.has_work()) {
    h.step();
    EXPECT_LE(h.sched.num_running(), 3);
    for (Sequence* r : h.sched.running())
      if (std::find(admitted.begin(), admitted.end(), r->id) == admitted.end()) admitted.push_back(r->id);
  }
  for (int64_t id : h.finish_order)  // a sequence finishing in the admission step is seen here
    if (std::find(admitted.begin(), admitted.end(), id) == admitted.end()) admitted.push_back(id);
  EXPECT_TRUE(std::is_sorted(admitted.begin(), admitted.end())) << "FCFS admission";
  EXPECT_EQ(admitted.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(h.outputs[ids[i]], ToyExecutor::reference_greedy(t, prompt_of(6, i), 4 + (i % 3)));
}

TEST(Scheduler, StrictFcfsWithOneSlot) {
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 128, .block_size = 4, .num_kv_blocks = 64};
  Harness h(t, {.max_num_seqs = 1, .max_num_batched_tokens = 64, .max_model_len = 128});
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(h.add(prompt_of(5 + i, i), 10 - i)->id);
  h.run();
  EXPECT_EQ(h.finish_order, ids);
}

TEST(Scheduler, PreemptionWhenBlocksRunOutKeepsOutputs) {
  // 12 blocks of 4 = 48 token slots; 4 sequences of 8 + 16 tokens need 24 slots each.
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 48, .block_size = 4, .num_kv_blocks = 12};
  for (bool prefix : {true, false}) {
    Harness h(t, {.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 48}, prefix);
    std::vector<int64_t> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(h.add(prompt_of(8, i), 16)->id);
    int steps = 0;
    while (h.sched.has_work()) {
      auto out = h.step();
      ASSERT_FALSE(out.empty()) << "stalled";
      for (Sequence* v : out.preempted) {
        EXPECT_EQ(h.sched.waiting().front()->status, SeqStatus::Waiting);
        EXPECT_EQ(v->num_computed_tokens, 0);
        EXPECT_TRUE(v->blocks.table.empty());
      }
      if (!out.preempted.empty()) {  // the newest running sequence was the victim
        for (Sequence* r : h.sched.running())
          for (Sequence* v : out.preempted) EXPECT_LT(r->id, v->id);
      }
      ASSERT_LT(++steps, 1000);
    }
    EXPECT_GT(h.sched.num_preemptions(), 0u) << "prefix=" << prefix;
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(h.outputs[ids[i]], ToyExecutor::reference_greedy(t, prompt_of(8, i), 16)) << "prefix=" << prefix;
    EXPECT_EQ(h.bm.num_free_blocks(), 12);
    EXPECT_EQ(h.bm.num_used_blocks(), 0);
  }
}

TEST(Scheduler, PrefixCacheHitsCountedAtAdmission) {
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 128, .block_size = 4, .num_kv_blocks = 64};
  Harness h(t, {.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 128});
  auto shared = prompt_of(13, 5);  // 3 full blocks + 1 token
  Sequence* a = h.add(shared, 3);
  const int64_t a_id = a->id;
  h.run();
  EXPECT_EQ(h.sched.prefix_cache_queries(), 13u);
  EXPECT_EQ(h.sched.prefix_cache_hits(), 0u);
  auto b_prompt = shared;
  b_prompt.push_back(9);
  b_prompt.push_back(10);
  Sequence* b = h.add(b_prompt, 3);
  const int64_t b_id = b->id;
  auto out = h.step();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].start_pos, 12) << "three cached blocks";
  EXPECT_EQ(out.scheduled[0].num_tokens, 3);
  EXPECT_EQ(b->num_cached_tokens, 12);
  EXPECT_EQ(h.sched.prefix_cache_queries(), 13u + 15u);
  EXPECT_EQ(h.sched.prefix_cache_hits(), 12u);
  h.run();
  EXPECT_EQ(h.outputs[a_id], ToyExecutor::reference_greedy(t, shared, 3));
  EXPECT_EQ(h.outputs[b_id], ToyExecutor::reference_greedy(t, b_prompt, 3));
  // The whole prompt cached: one token is still recomputed for its logits.
  Sequence* c = h.add(shared, 2);
  out = h.step();
  EXPECT_EQ(c->num_cached_tokens, 12);
  EXPECT_EQ(out.scheduled[0].num_tokens, 1);
}

TEST(Scheduler, RemoveFreesBlocksAnywhere) {
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 128, .block_size = 4, .num_kv_blocks = 64};
  Harness h(t, {.max_num_seqs = 1, .max_num_batched_tokens = 8, .max_model_len = 128});
  Sequence* a = h.add(prompt_of(20, 1), 50);
  Sequence* b = h.add(prompt_of(20, 2), 50);
  h.step();
  h.step();
  EXPECT_EQ(a->status, SeqStatus::Running);
  EXPECT_GT(h.bm.num_used_blocks(), 0);
  h.sched.remove(b, FinishReason::Abort);  // waiting
  h.sched.remove(a, FinishReason::Abort);  // running mid-prefill
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.bm.num_used_blocks(), 0);
}


// Decodes first: N running decodes and a long prompt arriving. Every step carries all N
// decodes and a prefill chunk of exactly budget - N tokens (the last one the rest), so the
// prompt completes in ceil(len / (budget - N)) steps and no step exceeds the budget.
TEST(Scheduler, DecodesFirstThenPrefillFillsTheRest) {
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 256, .block_size = 4, .num_kv_blocks = 256};
  const int kBudget = 24, kDecodes = 6, kLen = 100;
  Harness h(t, {.max_num_seqs = 16, .max_num_batched_tokens = kBudget, .max_model_len = 256});
  std::vector<int64_t> short_ids;
  for (int i = 0; i < kDecodes; ++i) short_ids.push_back(h.add(prompt_of(3, 10 + i), 60)->id);
  h.step();  // admits all six (18 tokens)
  h.step();  // their first decode
  for (Sequence* r : h.sched.running()) ASSERT_EQ(r->num_uncomputed(), 1);
  auto long_prompt = prompt_of(kLen, 3);
  Sequence* big = h.add(long_prompt, 4);
  const int64_t big_id = big->id;
  const int expected_steps = (kLen + (kBudget - kDecodes) - 1) / (kBudget - kDecodes);
  int steps = 0;
  while (big->num_computed_tokens < kLen) {
    auto out = h.step();
    ++steps;
    ASSERT_LE(out.num_batched_tokens, kBudget);
    int decodes = 0, prefill = 0;
    for (const auto& sc : out.scheduled) (sc.seq == big ? prefill : decodes) += sc.num_tokens;
    EXPECT_EQ(decodes, kDecodes) << "step " << steps << ": every decode runs";
    EXPECT_EQ(prefill, std::min(kBudget - kDecodes, kLen - (big->num_computed_tokens - prefill))) << steps;
    EXPECT_EQ(out.num_prefills, 1);
    ASSERT_LE(steps, expected_steps);
  }
  EXPECT_EQ(steps, expected_steps);  // ceil(100 / 18) = 6
  h.run();
  EXPECT_EQ(h.outputs[big_id], ToyExecutor::reference_greedy(t, long_prompt, 4));
  for (int i = 0; i < kDecodes; ++i)
    EXPECT_EQ(h.outputs[short_ids[i]], ToyExecutor::reference_greedy(t, prompt_of(3, 10 + i), 60));
}

// The reservation, not the admission order, decides: an older running sequence that has
// many tokens to compute again (here 20 tokens appended at once, as a jump-forward would do)
// ranks before six younger decodes, yet only gets what they leave.
TEST(Scheduler, OlderPrefillDoesNotStarveYoungerDecodes) {
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 256, .block_size = 4, .num_kv_blocks = 256};
  const int kBudget = 16;
  Harness h(t, {.max_num_seqs = 8, .max_num_batched_tokens = kBudget, .max_model_len = 256});
  Sequence* old = h.add(prompt_of(5, 1), 100);
  std::vector<Sequence*> young;
  for (int i = 0; i < 6; ++i) young.push_back(h.add(prompt_of(1, 40 + i), 100));
  h.step();  // 5 + 6 x 1 tokens
  h.step();  // seven decodes
  ASSERT_EQ(h.sched.running().front(), old);
  for (int k = 0; k < 20; ++k) old->tokens.push_back(int32_t(k % 64));
  ASSERT_EQ(old->num_uncomputed(), 21);
  auto out = h.step();
  ASSERT_EQ(out.scheduled.size(), 7u);
  EXPECT_EQ(out.scheduled[0].seq, old);
  EXPECT_EQ(out.scheduled[0].num_tokens, kBudget - 6) << "the older prefill takes what the decodes leave";
  for (Sequence* y : young)
    EXPECT_TRUE(std::any_of(out.scheduled.begin(), out.scheduled.end(), [&](const ScheduledSeq& sc) { return sc.seq == y; }));
  EXPECT_EQ(out.num_batched_tokens, kBudget);
  EXPECT_EQ(out.num_prefills, 1);
}

TEST(Scheduler, MaxNumPartialPrefillsAndThreshold) {
  ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 256, .block_size = 4, .num_kv_blocks = 256};
  for (int limit : {1, 2}) {
    Harness h(t, {.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 256,
                  .long_prefill_token_threshold = 10, .max_num_partial_prefills = limit});
    std::vector<int64_t> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(h.add(prompt_of(25, 30 + i), 5)->id);
    // limit 1: 10, 10, 5 tokens for the first prompt while the others wait; limit 2: two at a time.
    auto out = h.step();
    EXPECT_EQ(out.num_prefills, limit);
    EXPECT_EQ(h.sched.num_waiting(), 3 - limit);
    for (const auto& sc : out.scheduled) EXPECT_EQ(sc.num_tokens, 10);
    int max_prefills = 0;
    while (h.sched.has_work()) {
      out = h.step();
      max_prefills = std::max(max_prefills, out.num_prefills);
      for (const auto& sc : out.scheduled) EXPECT_LE(sc.num_tokens, 10);
    }
    EXPECT_EQ(max_prefills, limit);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(h.outputs[ids[i]], ToyExecutor::reference_greedy(t, prompt_of(25, 30 + i), 5));
  }
}

// Random arrivals, prompt lengths with shared prefixes, a KV pool small enough to preempt and
// random budgets / caps. Every step: tokens <= budget, chunk <= threshold, prefills <= limit,
// and every sequence decoding at the step start is either scheduled or preempted. Outputs
// equal the reference (prefix-cache hits and recomputes included), and the pool drains.
TEST(Scheduler, BudgetInvariantsUnderLoadWithPreemptionAndPrefixHits) {
  std::mt19937 rng(17);
  for (int round = 0; round < 12; ++round) {
    const int block = 4, blocks = 24 + int(rng() % 40);
    ToyExecutorConfig t{.vocab_size = 64, .max_model_len = 96, .block_size = block, .num_kv_blocks = blocks};
    SchedulerConfig sc{.max_num_seqs = 4 + int(rng() % 8),
                       .max_num_batched_tokens = 16 + int(rng() % 24),
                       .max_model_len = 96,
                       .long_prefill_token_threshold = (round % 3 == 0) ? 0 : 5 + int(rng() % 12),
                       .max_num_partial_prefills = (round % 2 == 0) ? 0 : 1 + int(rng() % 2)};
    Harness h(t, sc, /*prefix=*/round % 4 != 3);
    std::map<int64_t, std::pair<std::vector<int32_t>, int>> want;
    const auto shared = prompt_of(40, 99);
    int added = 0, steps = 0;
    while (added < 20 || h.sched.has_work()) {
      if (added < 20 && rng() % 3 == 0) {
        const int len = 1 + int(rng() % 40);
        std::vector<int32_t> p = (rng() % 2) ? std::vector<int32_t>(shared.begin(), shared.begin() + len)
                                             : prompt_of(len, 200 + added);
        const int max_tokens = 1 + int(rng() % 30);
        want[h.add(p, max_tokens)->id] = {p, max_tokens};
        ++added;
      }
      std::vector<Sequence*> decoding;
      for (Sequence* r : h.sched.running())
        if (r->num_uncomputed() == 1) decoding.push_back(r);
      auto out = h.step();
      ++steps;
      ASSERT_LT(steps, 5000) << "stalled, round " << round;
      ASSERT_LE(out.num_batched_tokens, sc.max_num_batched_tokens);
      if (sc.max_num_partial_prefills > 0) {
        ASSERT_LE(out.num_prefills, sc.max_num_partial_prefills);
      }
      for (const auto& s : out.scheduled)
        if (sc.long_prefill_token_threshold > 0) {
          ASSERT_LE(s.num_tokens, sc.long_prefill_token_threshold);
        }
      for (Sequence* d : decoding) {
        const bool ran = std::any_of(out.scheduled.begin(), out.scheduled.end(), [&](const ScheduledSeq& s) { return s.seq == d; });
        const bool preempted = std::find(out.preempted.begin(), out.preempted.end(), d) != out.preempted.end();
        ASSERT_TRUE(ran || preempted) << "round " << round << " step " << steps << ": decode left out";
      }
    }
    for (const auto& [id, w] : want)
      EXPECT_EQ(h.outputs[id], ToyExecutor::reference_greedy(t, w.first, w.second)) << "round " << round << " id " << id;
    EXPECT_EQ(h.bm.num_used_blocks(), 0);
  }
}

}  // namespace
}  // namespace moeserve
