// Random weights from any architecture's declarations (tools/random_weights.h, serve
// --load-format dummy): they load through Model::load_from for every registry architecture,
// quantised or not, on one rank and split over ranks; the result runs and is deterministic;
// a source with a wrong shape or dtype is refused naming the tensor.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "model/registry.h"
#include "runtime/model_executor.h"
#include "runtime/parallel_executor.h"
#include "tools/generate.h"
#include "tools/random_weights.h"
#include "golden_fixture.h"

using namespace moeserve;

namespace {

ExecutorOptions random_options(const std::string& fixture, uint64_t seed) {
  ExecutorOptions eo;
  eo.model_dir = test::golden_fixture(fixture).string();
  eo.block_size = 4;
  eo.num_kv_blocks = 16;
  eo.make_weights = [seed](Backend&, Model& m, bool lm_head) {
    EXPECT_GT(tools::load_random_weights(m, tools::RandomWeightOptions{seed, lm_head}), 0);
  };
  return eo;
}

GenerateResult run(ModelExecutor& exec) {
  GenerateOptions g;
  g.prompt_ids = {1, 2, 3, 4, 5};
  g.max_tokens = 3;
  g.keep_logits = true;
  return generate(exec, g);
}

void expect_sane(const GenerateResult& r, const std::string& what) {
  ASSERT_EQ(r.logits.size(), size_t(3) * size_t(r.vocab_size)) << what;
  float lo = INFINITY, hi = -INFINITY;
  for (float x : r.logits) {
    ASSERT_TRUE(std::isfinite(x)) << what;
    lo = std::min(lo, x), hi = std::max(hi, x);
  }
  EXPECT_GT(hi - lo, 1e-3f) << what << ": logits do not depend on the token";
}

}  // namespace

TEST(RandomWeights, EveryArchitectureLoadsAndRuns) {
  // MiniMax-M2 (FP8 with partial blocks, and mixed dtypes with tied embeddings) and Qwen3-MoE
  // (bf16 with a dense layer, FP8 with decoder_sparse_step).
  for (const char* name : {"tiny_fp8_partial", "tiny_mixed_tied", "qwen3_tiny_bf16", "qwen3_tiny_fp8"}) {
    auto a = make_cpu_executor(random_options(name, 7));
    const GenerateResult ra = run(*a);
    expect_sane(ra, name);
    auto b = make_cpu_executor(random_options(name, 7));
    EXPECT_EQ(run(*b).logits, ra.logits) << name << ": same seed, same weights";
    auto c = make_cpu_executor(random_options(name, 8));
    EXPECT_NE(run(*c).logits, ra.logits) << name << ": the seed matters";
  }
}

TEST(RandomWeights, SplitOverRanks) {
  // Each rank draws its own slices (lm_head on every rank: the CPU group returns rank 0's).
  for (const char* name : {"qwen3_tiny_fp8", "tiny_bf16"}) {
    for (bool ep : {false, true}) {
      ParallelLayout layout;
      layout.tensor_parallel = 2;
      layout.expert_parallel = ep;
      layout.allow_fp8_block_split = true;  // qwen3_tiny_fp8: expert I 160 over 2 ranks cuts blocks
      auto exec = make_cpu_parallel_executor(random_options(name, 3), layout);
      expect_sane(run(*exec), std::string(name) + (ep ? " EP" : " TP"));
    }
  }
}

TEST(RandomWeights, LoadFromChecksWhatTheSourceGives) {
  auto backend = make_cpu_backend();
  const LoadedConfig lc = load_model_config(test::golden_fixture("qwen3_tiny_bf16").string());
  auto model = lc.entry->create(*lc.config, *backend, ParallelConfig{}, nullptr);
  const WeightSource good = tools::random_weight_source(model->desc(), {});
  const std::string victim = "model.layers.0.self_attn.q_proj.weight";
  auto expect_refused = [&](const WeightSource& src, const std::string& needle) {
    try {
      model->load_from(src);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_refused([&](const WeightDecl& d) {
    LoadedTensor t = good(d);
    if (d.name == victim) t.tensor = Tensor::host(t.tensor.dtype, {t.tensor.dim(0), t.tensor.dim(1) + 1});
    return t;
  }, victim + "' has shape");
  expect_refused([&](const WeightDecl& d) {
    LoadedTensor t = good(d);
    if (d.name == victim) t.tensor = Tensor::host(DType::I32, t.tensor.shape);
    return t;
  }, victim + "' is I32");
  expect_refused([&](const WeightDecl& d) { return d.name == victim ? LoadedTensor{} : good(d); },
                 "no tensor for '" + victim);
  model->load_from(good);  // and the honest source loads
}

TEST(RandomWeights, LocalShapeFollowsTheShardSpec) {
  WeightDecl d{"w", {8, 6}, {DType::BF16}, {}, -1};
  EXPECT_EQ(local_shape(d), Shape({8, 6}));
  d.shard = ShardSpec{ShardKind::ColumnParallel, 1, 4, 1, true};
  EXPECT_EQ(local_shape(d), Shape({2, 6}));
  d.shard = ShardSpec{ShardKind::ColumnParallel, 3, 4, 2, true};  // 2 distinct slices, replicated twice
  EXPECT_EQ(local_shape(d), Shape({4, 6}));
  d.shard = ShardSpec{ShardKind::RowParallel, 0, 2, 1, true};
  EXPECT_EQ(local_shape(d), Shape({8, 3}));
  d.shard = ShardSpec{ShardKind::RowParallel, 0, 4, 1, true};
  EXPECT_THROW(local_shape(d), Error);  // 6 does not split over 4
}
