// Whole-step CUDA graphs of decode steps (label gpu; skipped without a device): the MiniMax-M2
// executor on CudaBackend with graphs on against --enforce-eager, over a scripted run where
// sequences join and leave and decode batches of 1..10 pad into buckets 1, 2, 4, 8, 16.
//  - graphs vs padded eager steps (same buckets, same metadata, same kernels): equal up to
//    float non-associativity in reductions, bound 1e-3 (the observed error is printed);
//  - graphs vs plain eager (unpadded, other split/path choices): bf16 bound 3e-2 and the same
//    greedy ids except where the eager top-2 margin is within that bound.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "../model/executor_scenario.h"
#include "backend/cuda/cuda_backend.h"
#include "runtime/model_executor.h"
#include "../model/golden_fixture.h"

namespace moeserve::test {
namespace {

namespace fs = std::filesystem;

class CudaDecodeGraphs : public ::testing::TestWithParam<std::string> {};

ExecutorOptions opts(const std::string& name) {
  ExecutorOptions eo;
  eo.model_dir = test::golden_fixture(name).string();
  eo.block_size = 4;
  eo.num_kv_blocks = 128;
  eo.max_num_seqs = 16;
  eo.max_num_batched_tokens = 64;
  return eo;
}

TEST_P(CudaDecodeGraphs, GraphsMatchEager) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // tiny_d128_fp8 (head_dim 128: the fused decode attention kernel) is generated, not stored:
  //   moeserve make-tiny tests/fixtures/golden/tiny_d128_fp8 --fp8 --block-size 128 --hidden-size 256
  //     --num-heads 12 --num-kv-heads 2 --head-dim 128 --rotary-dim 64 --intermediate-size 256
  if (!fs::exists(test::golden_fixture(GetParam()) / "config.json")) GTEST_SKIP() << "fixture " << GetParam() << " not present";
  ExecutorOptions eo = opts(GetParam());
  eo.enforce_eager = true;
  ScenarioTrace ref, padded, graphed, startup;
  {
    RankExecutor ex(make_cuda_backend(0), eo);
    EXPECT_TRUE(ex.graph_buckets().empty());
    ref = run_scenario(ex);
  }
  {
    eo.pad_decode = true;
    RankExecutor ex(make_cuda_backend(0), eo);
    padded = run_scenario(ex, &ref);
    EXPECT_EQ(ex.graphs_captured(), 0);
  }
  {
    eo.enforce_eager = false;
    eo.pad_decode = false;
    RankExecutor ex(make_cuda_backend(0), eo);
    ASSERT_EQ(ex.graph_buckets(), (std::vector<int>{1, 2, 4, 8, 16}));
    graphed = run_scenario(ex, &ref);
    EXPECT_EQ(ex.graphs_captured(), 5);
    EXPECT_EQ(ex.graph_replays(), 9);
  }
  {
    eo.capture_graphs_at_startup = true;
    RankExecutor ex(make_cuda_backend(0), eo);
    EXPECT_EQ(ex.graphs_captured(), 5);
    startup = run_scenario(ex, &ref);
    EXPECT_EQ(ex.graph_replays(), 14);  // every decode step
  }
  const auto e_pad = step_errors(padded, graphed), e_eager = step_errors(ref, graphed),
             e_start = step_errors(graphed, startup);
  double worst_pad = 0, worst_eager = 0, worst_start = 0;
  for (size_t k = 0; k < e_pad.size(); ++k) {
    worst_pad = std::max(worst_pad, e_pad[k]);
    worst_eager = std::max(worst_eager, e_eager[k]);
    worst_start = std::max(worst_start, e_start[k]);
    EXPECT_LE(e_pad[k], 1e-3) << "step " << k << ": graph replay vs the same padded step run eagerly";
    EXPECT_LE(e_start[k], 1e-3) << "step " << k << ": startup-captured vs lazily captured graphs";
    EXPECT_LE(e_eager[k], 3e-2) << "step " << k << ": graphs vs --enforce-eager";
    const int V = ref.vocab;
    for (size_t i = 0; i < ref.next[k].size(); ++i) {
      const float* r = ref.logits[k].data() + i * V;
      if (top2_margin(r, V) < 6e-2) continue;
      EXPECT_EQ(argmax_lowest(graphed.logits[k].data() + i * V, V), ref.next[k][i]) << "step " << k << " row " << i;
    }
  }
  std::printf("[graphs %s] max rel error: vs padded eager %.3g, vs eager %.3g, startup vs lazy %.3g\n",
              GetParam().c_str(), worst_pad, worst_eager, worst_start);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDecodeGraphs, ::testing::Values("tiny_bf16", "tiny_fp8_partial", "tiny_d128_fp8"));

}  // namespace
}  // namespace moeserve::test
