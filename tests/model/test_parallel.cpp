// Tensor / expert parallelism on the CPU (in-process communicator) against TP=1, for every
// golden fixture: EP=4 with the rank threads of run_ranks, and the ParallelExecutor (what
// `serve -tp N [--enable-expert-parallel]` runs) at TP=2, TP=4, TP=2+EP and TP=4+EP.
// Plus the user-facing layout errors. (TP=2, EP=2 and TP=4 over run_ranks are in
// test_golden.cpp.)
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/in_process.h"
#include "executor_scenario.h"
#include "model/arch/minimax_m2.h"
#include "model/registry.h"
#include "tools/generate.h"
#include "runtime/model_executor.h"
#include "runtime/parallel_executor.h"
#include "backend/cpu/cpu_backend.h"
#include "golden_fixture.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

MiniMaxM2Config fixture_config(const std::string& name) {
  return MiniMaxM2Config::from_file((test::golden_fixture(name) / "config.json").string());
}

// Any architecture's fixture config, through the registry.
std::unique_ptr<ArchConfig> arch_config(const std::string& name) {
  return load_model_config(test::golden_fixture(name).string()).config;
}

GenerateOptions greedy_from_golden(const std::string& name) {
  std::ifstream f(test::golden_fixture(name) / "golden.json");
  EXPECT_TRUE(f.good()) << name;
  auto j = nlohmann::json::parse(f);
  GenerateOptions o;
  o.prompt_ids = j["prompt_ids"].get<std::vector<int32_t>>();
  o.max_tokens = int(j["generated_ids"].size());
  o.keep_logits = true;
  return o;
}

ExecutorOptions exec_opts(const std::string& name) {
  ExecutorOptions eo;
  eo.model_dir = test::golden_fixture(name).string();
  eo.num_kv_blocks = 64;
  return eo;
}

GenerateResult run_tp1(const std::string& name) {
  auto exec = make_cpu_executor(exec_opts(name));
  return generate(*exec, greedy_from_golden(name));
}

// Whether `layout` is valid for the fixture (e.g. 6 experts cannot go over 4 EP ranks).
bool layout_fits(const std::string& name, const ParallelLayout& l) {
  try {
    check_parallel_layout(*arch_config(name), l);
    return true;
  } catch (const Error& e) {
    std::printf("  [layout] %s tp=%d ep=%d rejected: %s\n", name.c_str(), l.tensor_parallel, int(l.expert_parallel),
                e.what());
    return false;
  }
}

class ParallelGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelGolden, ExpertParallel4MatchesTp1) {
  const std::string name = GetParam();
  const int experts = arch_config(name)->desc().num_experts;
  if (experts % 4 != 0) {
    // 6 experts over 4 ranks: refused with a clear message, on every rank.
    InProcessGroup group(4);
    try {
      run_ranks(group, [&](Communicator& comm) {
        ExecutorOptions eo = exec_opts(name);
        eo.expert_parallel = true;
        eo.comm = &comm;
        make_cpu_executor(eo);
      });
      FAIL() << "EP=4 with " << experts << " experts must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("num_local_experts"), std::string::npos) << e.what();
    }
    return;
  }
  const auto tp1 = run_tp1(name);
  InProcessGroup group(4);
  std::vector<GenerateResult> out(4);
  run_ranks(group, [&](Communicator& comm) {
    ExecutorOptions eo = exec_opts(name);
    eo.expert_parallel = true;
    eo.comm = &comm;
    auto exec = make_cpu_executor(eo);
    out[size_t(comm.rank())] = generate(*exec, greedy_from_golden(name));
  });
  for (const auto& r : out) {
    EXPECT_EQ(r.generated_ids, tp1.generated_ids);
    const double e = test::max_rel_err(r.logits, tp1.logits);
    std::printf("[parallel] %s EP=4 (attention TP=4): vs TP=1 %.3g\n", name.c_str(), e);
    EXPECT_LE(e, 1e-5);
  }
}

TEST_P(ParallelGolden, ParallelExecutorLayoutsMatchTp1) {
  const std::string name = GetParam();
  const auto tp1 = run_tp1(name);
  int ran = 0;
  for (int tp : {2, 4})
    for (bool ep : {false, true}) {
      ParallelLayout l;
      l.tensor_parallel = tp;
      l.expert_parallel = ep;
      l.allow_fp8_block_split = true;  // tiny FP8 fixtures: 128-blocks over 16-wide heads
      if (!layout_fits(name, l)) {
        EXPECT_TRUE(ep && arch_config(name)->desc().num_experts % tp != 0) << "only EP=4 over 6 experts may not fit";
        continue;
      }
      auto exec = make_cpu_parallel_executor(exec_opts(name), l);
      EXPECT_EQ(exec->world(), tp);
      const auto res = generate(*exec, greedy_from_golden(name));
      EXPECT_EQ(res.generated_ids, tp1.generated_ids) << "tp " << tp << " ep " << ep;
      const double e = test::max_rel_err(res.logits, tp1.logits);
      std::printf("[parallel] %s ParallelExecutor TP=%d%s: vs TP=1 %.3g\n", name.c_str(), tp, ep ? "+EP" : "", e);
      EXPECT_LE(e, 1e-5) << "tp " << tp << " ep " << ep;
      ++ran;
    }
  EXPECT_GE(ran, 3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParallelGolden,
                         ::testing::Values("tiny_bf16", "tiny_fp8_b128", "tiny_fp8_partial", "tiny_fp8_nonsquare",
                                           "tiny_mixed_tied"));
INSTANTIATE_TEST_SUITE_P(Qwen3Moe, ParallelGolden,
                         ::testing::Values("qwen3_tiny_bf16", "qwen3_tiny_fp8", "qwen3_tiny_yarn"));
INSTANTIATE_TEST_SUITE_P(DeepseekV3, ParallelGolden,
                         ::testing::Values("dsv3_tiny_bf16", "dsv3_tiny_fp8", "dsv3_tiny_yarn", "kimi_tiny_yarn",
                                           "dsv3_tiny_int4"));

// A MiniMax-M2.5-shaped config (48 q heads, 8 KV heads of 128, 256 experts of 1536, FP8
// 128x128 blocks) for the layout checks; no weights needed.
MiniMaxM2Config m25_like() {
  MiniMaxM2Config c = fixture_config("tiny_fp8_b128");
  c.num_attention_heads = 48;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 1536;
  c.num_local_experts = 256;
  return c;
}

TEST(ParallelLayoutCheck, Fp8BlockSplitSuggestsExpertParallel) {
  const auto c = m25_like();
  ParallelLayout l;
  l.tensor_parallel = 8;
  try {
    check_parallel_layout(c, l);
    FAIL() << "1536 / 8 = 192 cuts 128-row FP8 blocks";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("1536"), std::string::npos) << m;
    EXPECT_NE(m.find("192"), std::string::npos) << m;
    EXPECT_NE(m.find("--enable-expert-parallel"), std::string::npos) << m;
  }
  l.expert_parallel = true;
  EXPECT_NO_THROW(check_parallel_layout(c, l));  // whole experts: 32 per rank
  l.expert_parallel = false;
  l.tensor_parallel = 4;  // 384 = 3 blocks
  EXPECT_NO_THROW(check_parallel_layout(c, l));
  l.tensor_parallel = 2;
  EXPECT_NO_THROW(check_parallel_layout(c, l));
}

TEST(ParallelLayoutCheck, OtherInvalidLayouts) {
  const auto c = m25_like();
  auto msg = [&](ParallelLayout l) {
    try {
      check_parallel_layout(c, l);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ParallelLayout dp;
  dp.data_parallel = 2;
  EXPECT_NE(msg(dp).find("--data-parallel-size"), std::string::npos);
  ParallelLayout gpus;
  gpus.tensor_parallel = 4;
  gpus.available_devices = 2;
  EXPECT_NE(msg(gpus).find("only 2 are visible"), std::string::npos) << msg(gpus);
  ParallelLayout heads;
  heads.tensor_parallel = 5;  // 48 heads
  EXPECT_NE(msg(heads).find("num_attention_heads"), std::string::npos) << msg(heads);
  ParallelLayout experts;
  experts.tensor_parallel = 3;
  experts.expert_parallel = true;
  auto c3 = c;
  c3.num_local_experts = 8;  // 48 heads split over 3, 8 experts do not
  try {
    check_parallel_layout(c3, experts);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts % ranks"), std::string::npos) << e.what();
  }
  ParallelLayout zero;
  zero.tensor_parallel = 0;
  EXPECT_FALSE(msg(zero).empty());
}

// A bad batch is rejected once, before the ranks start, and the group stays usable.
TEST(ParallelExecutor, BadBatchLeavesRanksUsable) {
  ParallelLayout l;
  l.tensor_parallel = 2;
  ExecutorOptions eo = exec_opts("tiny_bf16");
  eo.block_size = 4;
  eo.num_kv_blocks = 4;
  auto exec = make_cpu_parallel_executor(eo, l);
  auto single = make_cpu_executor(eo);
  EXPECT_THROW(exec->execute(StepBatch{{SequenceStep{1, {5000}, 0, {0}, true}}}), Error);
  EXPECT_THROW(exec->execute(StepBatch{{SequenceStep{1, {1}, 0, {9}, true}}}), Error);
  const StepBatch ok{{SequenceStep{1, {5, 6, 7}, 0, {2}, true}}};
  const StepResult a = exec->execute(ok), b = single->execute(ok);
  ASSERT_EQ(a.logits.size(), size_t(a.vocab_size));
  EXPECT_LE(test::max_rel_err(a.logits, b.logits), 1e-5);
  EXPECT_EQ(exec->info().num_kv_blocks, 4);
}

// KV pool from memory: every rank proposes a size, the pool is the minimum.
TEST(ParallelExecutor, KvPoolIsMinimumOverRanks) {
  ParallelExecutorOptions o;
  o.exec = exec_opts("tiny_bf16");
  o.exec.num_kv_blocks = 0;
  o.layout.tensor_parallel = 2;
  auto group = std::make_shared<InProcessGroup>(2);
  std::atomic<int> calls{0};
  o.make_backend = [](int) { return make_cpu_backend(); };
  o.make_comm = [group](int r, Backend&) { return group->communicator(r); };
  o.kv_blocks_for_memory = [&](Backend&, int64_t per_block) {
    EXPECT_GT(per_block, 0);
    return 10 + 7 * calls++;  // 10 and 17
  };
  ParallelExecutor exec(std::move(o));
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(exec.info().num_kv_blocks, 10);
}

// A backend factory that fails on one rank fails the constructor (no hang, threads joined).
TEST(ParallelExecutor, RankFailureDuringLoadThrows) {
  ParallelExecutorOptions o;
  o.exec = exec_opts("tiny_bf16");
  o.layout.tensor_parallel = 2;
  auto group = std::make_shared<InProcessGroup>(2);
  o.make_backend = [](int r) -> std::unique_ptr<Backend> {
    if (r == 1) throw Error("no device for rank 1");
    return make_cpu_backend();
  };
  o.make_comm = [group](int r, Backend&) { return group->communicator(r); };
  try {
    ParallelExecutor exec(std::move(o));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no device for rank 1"), std::string::npos) << e.what();
  }
}

// ---- decode graphs per rank (what NCCL ranks do on CUDA), on the CPU ----

// The in-process communicator claiming to be capturable, so the rank executors take the
// graph path; the recording runner replays the captured closure (the collectives run again
// at replay, as captured NCCL calls do).
class CapturableComm : public Communicator {
 public:
  explicit CapturableComm(std::unique_ptr<Communicator> c) : c_(std::move(c)) {}
  int rank() const override { return c_->rank(); }
  int world_size() const override { return c_->world_size(); }
  void all_reduce_sum(Tensor& t) override { c_->all_reduce_sum(t); }
  void all_gather(const Tensor& in, Tensor& out) override { c_->all_gather(in, out); }
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override { c_->reduce_scatter_sum(in, out); }
  void all_to_all(const Tensor& in, Tensor& out) override { c_->all_to_all(in, out); }
  void all_to_allv(const Tensor& in, const std::vector<int64_t>& s, Tensor& out,
                   const std::vector<int64_t>& r) override {
    c_->all_to_allv(in, s, out, r);
  }
  void broadcast(Tensor& t, int root) override { c_->broadcast(t, root); }
  void barrier() override { c_->barrier(); }
  void abort(const std::string& reason) override { c_->abort(reason); }
  bool graph_capturable() const override { return true; }

 private:
  std::unique_ptr<Communicator> c_;
};

// The multi-sequence scenario (prefills mixed with decodes of changing batch size) under TP=2 +
// EP on an FP8 fixture against TP=1, step by step: on the CPU (f32) the layout must agree to
// rounding at every step (the 2 x H200 run of the same scenario differs at one step; this
// separates the layout's logic from GPU rounding).
TEST(ParallelExecutor, ScenarioTp2EpMatchesTp1OnFp8Fixture) {
  ExecutorOptions eo = test::scenario_options(test::golden_fixture("tiny_fp8_b128").string());
  eo.enforce_eager = true;
  auto one = make_cpu_executor(eo);
  const test::ScenarioTrace ref = test::run_scenario(*one);
  ParallelExecutorOptions o;
  o.exec = eo;
  o.layout.tensor_parallel = 2;
  o.layout.expert_parallel = true;
  o.layout.allow_fp8_block_split = true;  // as test_nccl: k/v rows 128 -> 64 per rank
  auto group = std::make_shared<InProcessGroup>(2);
  o.make_backend = [](int) { return make_cpu_backend(); };
  o.make_comm = [group](int r, Backend&) { return group->communicator(r); };
  ParallelExecutor par(std::move(o));
  const test::ScenarioTrace got = test::run_scenario(par, &ref);
  const auto e = test::step_errors(ref, got);
  ASSERT_GE(e.size(), 11u);
  for (size_t k = 0; k < e.size(); ++k) EXPECT_LE(e[k], 1e-4) << "step " << k;
}

// Ranks capture and replay the same buckets; rank 0's logits match TP=1 eager; only rank 0
// gets the device sampler (here a host argmax over the CPU "device" logits).
TEST(ParallelExecutor, CapturableCommRanksReplayGraphsAndRank0Samples) {
  ExecutorOptions eo = test::scenario_options(test::golden_fixture("tiny_bf16").string());
  eo.enforce_eager = true;
  auto one = make_cpu_executor(eo);
  const test::ScenarioTrace ref = test::run_scenario(*one);

  eo.enforce_eager = false;
  eo.graph_runner_factory = [](Backend&) { return std::make_unique<test::RecordingRunner>(); };
  ParallelExecutorOptions o;
  o.exec = eo;
  o.layout.tensor_parallel = 2;
  auto group = std::make_shared<InProcessGroup>(2);
  o.make_backend = [](int) { return make_cpu_backend(); };
  o.make_comm = [group](int r, Backend&) -> std::unique_ptr<Communicator> {
    return std::make_unique<CapturableComm>(group->communicator(r));
  };
  std::atomic<int> samplers{0}, sampled_rows{0};
  o.make_device_sampler = [&](Backend&) {
    ++samplers;
    return [&](const Tensor& logits, const std::vector<DeviceSampling>& rows, Tensor& out) {
      const int64_t V = logits.dim(1);
      for (size_t r = 0; r < rows.size(); ++r)
        out.ptr<int32_t>()[r] = argmax_lowest(logits.ptr<float>() + int64_t(r) * V, int(V));
      sampled_rows += int(rows.size());
    };
  };
  ParallelExecutor par(std::move(o));
  EXPECT_EQ(samplers.load(), 1);  // rank 0 only
  EXPECT_TRUE(par.info().device_sampling);
  const test::ScenarioTrace got = test::run_scenario(par, &ref);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(par.graphs_captured(r), 5) << "rank " << r;
    EXPECT_EQ(par.graph_replays(r), 9) << "rank " << r;
  }
  const auto e = test::step_errors(ref, got);
  for (size_t k = 0; k < e.size(); ++k) EXPECT_LE(e[k], 1e-4) << "step " << k;

  // A pure-decode step (one token each, so it replays bucket 2) of two new sequences: row 0
  // sampled by rank 0's sampler, row 1 returned as logits; TP=1 eager gives both rows.
  StepBatch b;
  for (int64_t id : {int64_t(5), int64_t(6)}) {
    SequenceStep s;
    s.seq_id = id;
    s.tokens = {int32_t(7 + id)};
    s.start_pos = 0;
    s.block_table = {int32_t(100 + id)};
    b.seqs.push_back(s);
  }
  const StepResult want = one->execute(b);  // eager TP=1, both rows' logits
  b.seqs[0].device_sample = DeviceSampling{};
  const int before = par.graph_replays(0);
  const StepResult res = par.execute(b);
  ASSERT_EQ(res.sampled_ids.size(), 1u);
  ASSERT_EQ(res.logits.size(), size_t(res.vocab_size));
  EXPECT_EQ(res.sampled_ids[0], argmax_lowest(want.logits.data(), want.vocab_size));
  EXPECT_LE(test::max_rel_err(res.logits, std::vector<float>(want.logits.begin() + want.vocab_size, want.logits.end())), 1e-4);
  EXPECT_EQ(par.graph_replays(0), before + 1);  // bucket 2 was captured by the scenario
  EXPECT_EQ(sampled_rows.load(), 2);            // the sampler sees every logits row (host rows as placeholders)
}

}  // namespace
