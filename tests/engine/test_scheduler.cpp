// Scheduler tests: the scheduler and block manager driven step by step against the
// ToyExecutor (whose logits depend on the context read back through the block tables),
// with greedy sampling, so every output can be compared with ToyExecutor::reference_greedy.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

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

}  // namespace
}  // namespace moeserve
