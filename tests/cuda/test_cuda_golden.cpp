// Golden fixtures on the CUDA backend (label gpu): the registry's model (MiniMax-M2, Qwen3-MoE,
// DeepSeek-V3 / Kimi-K2, the INT4 fixture on the W4A16 expert kernels of k_moe_int4.cu)
// in the RankExecutor on CudaBackend
// against the Hugging Face transformers float32 reference logits of tests/fixtures/golden/.
//
// Teacher forcing: step 0 prefills the prompt, step k decodes the reference's generated token
// k-1, so every step's logits are compared with the reference row of the same context even
// when a greedy id would flip. The bound is stated for bf16 activations and KV (and FP8
// weights dequantised exactly): max|logits - ref| / max|ref| <= kBound per step. Greedy ids
// (argmax, lowest index on ties) must equal the reference's except at steps where the
// reference's own top-2 margin is below 2 * kBound * max|ref| (a bf16-sized error may then
// legitimately swap the two).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#include "tools/generate.h"
#include "runtime/model_executor.h"
#include "../model/golden_fixture.h"

namespace moeserve::test {
namespace {

namespace fs = std::filesystem;
constexpr double kBound = 2e-2;
// The DeepSeek-V3 family's MLA path rounds two more RMSNorm outputs to bf16 per layer (q_a and
// the latent) than MiniMax's attention; measured worst 0.0224 on a step without a routing
// near-tie (kimi_tiny_yarn step 3, session 15).
constexpr double kBoundMla = 3e-2;
// Routing near-ties: a step whose reference routing margin (scripts/golden_route_margins.py:
// the smallest gap between a chosen and an unchosen group / expert score over its tokens and
// layers, in the fixture's route_margins.json) is below kRouteTie may choose other experts under
// a bf16-sized error, which changes its logits by far more than a bf16 error: such a step is
// reported, not checked, and the steps after it (whose context holds that token's changed K/V)
// are checked against kBoundAfterTie.
constexpr double kRouteTie = 1e-2;
constexpr double kBoundAfterTie = 5e-2;

struct Case {
  std::string name;
  int block_size;
  bool mla = false;
};

// route_margins.json's per-step margins, or empty when the fixture has none.
std::vector<double> route_margins(const fs::path& d) {
  std::ifstream f(d / "route_margins.json");
  if (!f) return {};
  return nlohmann::json::parse(f).at("route_margin_per_step").get<std::vector<double>>();
}

class CudaGolden : public ::testing::TestWithParam<Case> {};

TEST_P(CudaGolden, TeacherForcedMatchesReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  const fs::path d = test::golden_fixture(c.name);
  const GoldenRef g = load_golden(c.name);
  const auto &prompt = g.prompt, &gen = g.generated;
  const auto& ref = g.logits;
  const int64_t V = g.vocab;
  ASSERT_TRUE(!gen.empty() && int64_t(ref.size()) == int64_t(gen.size()) * V) << d;

  ExecutorOptions eo;
  eo.model_dir = d.string();
  eo.block_size = c.block_size;
  eo.num_kv_blocks = 64;
  RankExecutor exec(make_cuda_backend(0), eo);
  ASSERT_EQ(exec.info().vocab_size, V);

  const int total = int(prompt.size() + gen.size());
  SequenceStep s;
  s.seq_id = 1;
  for (int b = 0; b < (total + c.block_size - 1) / c.block_size; ++b) s.block_table.push_back(63 - b);  // not 0..n
  int flips = 0;
  const std::vector<double> margins = route_margins(d);
  bool after_tie = false;
  for (size_t k = 0; k < gen.size(); ++k) {
    const bool tie = k < margins.size() && margins[k] < kRouteTie;
    s.tokens = k == 0 ? prompt : std::vector<int32_t>{gen[k - 1]};
    s.start_pos = k == 0 ? 0 : int32_t(prompt.size() + k - 1);
    StepBatch batch;
    batch.seqs.push_back(s);
    const StepResult r = exec.execute(batch);
    ASSERT_EQ(int64_t(r.logits.size()), V);
    const float* want = ref.data() + k * V;
    double num = 0, den = 0;
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_TRUE(std::isfinite(r.logits[v])) << "step " << k << " id " << v;
      num = std::max(num, double(std::fabs(r.logits[v] - want[v])));
      den = std::max(den, double(std::fabs(want[v])));
    }
    const double err = num / den;
    const double bound = after_tie ? kBoundAfterTie : (c.mla ? kBoundMla : kBound);
    if (!tie) {
      EXPECT_LE(err, bound) << c.name << " step " << k;
    }
    // Reference top-2 margin at this step.
    std::vector<float> sorted(want, want + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const double margin = double(sorted[0] - sorted[1]);
    const int32_t got = argmax_lowest(r.logits.data(), int(V));
    if (got != gen[k]) {
      ++flips;
      if (!tie) {
        EXPECT_LT(margin, 2 * bound * den) << c.name << " step " << k << ": greedy id " << got << " vs reference "
                                          << gen[k] << " with top-2 margin " << margin << " (err " << err << ")";
      }
    }
    std::printf("[golden cuda] %s step %zu: rel err %.3g (bound %.0e), ref top-2 margin %.3g, greedy %s%s\n",
                c.name.c_str(), k, err, bound, margin / den, got == gen[k] ? "same" : "FLIPPED",
                tie ? ", routing near-tie (margin below 1e-2): not checked" : "");
    after_tie = after_tie || tie;
  }
  std::printf("[golden cuda] %s: %d greedy flips in %zu steps (bound %.0e)\n", c.name.c_str(), flips, gen.size(), kBound);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden,
                         ::testing::Values(Case{"tiny_bf16", 16}, Case{"tiny_fp8_b128", 16}, Case{"tiny_fp8_partial", 4},
                                           // Qwen3-MoE: the generic routing / per-head QK-norm / YaRN
                                           // kernels and the dense SwiGLU layers on CUDA.
                                           Case{"qwen3_tiny_bf16", 16}, Case{"qwen3_tiny_fp8", 4},
                                           Case{"qwen3_tiny_yarn", 16},
                                           // DeepSeek-V3 / Kimi-K2: MLA (k_mla.cu), shared experts,
                                           // grouped sigmoid routing, dense first layers, YaRN.
                                           Case{"dsv3_tiny_bf16", 16, true}, Case{"dsv3_tiny_fp8", 4, true},
                                           Case{"dsv3_tiny_yarn", 16, true}, Case{"kimi_tiny_yarn", 16, true},
                                           // INT4 pack-quantized routed experts (W4A16, k_moe_int4.cu).
                                           Case{"dsv3_tiny_int4", 16, true}),
                         [](const auto& info) { return info.param.name; });

// Two sequences in one batch (prefill of one while the other decodes) give each sequence the
// logits it gets alone: the executor's packed metadata and per-sequence block tables.
TEST(CudaGoldenBatch, MixedBatchEqualsSingle) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const fs::path d = test::golden_fixture("tiny_fp8_b128");
  std::ifstream f(d / "golden.json");
  ASSERT_TRUE(f.good()) << d;
  const auto prompt = nlohmann::json::parse(f)["prompt_ids"].get<std::vector<int32_t>>();
  ExecutorOptions eo;
  eo.model_dir = d.string();
  eo.block_size = 4;
  eo.num_kv_blocks = 32;
  RankExecutor exec(make_cuda_backend(0), eo);
  auto seq = [&](int64_t id, std::vector<int32_t> toks, int start, int first_block) {
    SequenceStep s;
    s.seq_id = id;
    s.tokens = std::move(toks);
    s.start_pos = start;
    for (int b = 0; b < 8; ++b) s.block_table.push_back(first_block + b);
    return s;
  };
  // Alone: A prefill, then A decodes token 5.
  StepBatch a0, a1;
  a0.seqs.push_back(seq(1, prompt, 0, 0));
  exec.execute(a0);
  a1.seqs.push_back(seq(1, {5}, int(prompt.size()), 0));
  const auto alone = exec.execute(a1).logits;
  // Batched: B prefills (other blocks) in the same step as A's decode (recomputed into A's blocks).
  StepBatch both;
  both.seqs.push_back(seq(1, {5}, int(prompt.size()), 0));
  both.seqs.push_back(seq(2, std::vector<int32_t>(prompt.rbegin(), prompt.rend()), 0, 16));
  const auto r = exec.execute(both).logits;
  ASSERT_EQ(r.size(), 2 * alone.size());
  double num = 0, den = 0;
  for (size_t v = 0; v < alone.size(); ++v) {
    num = std::max(num, double(std::fabs(r[v] - alone[v])));
    den = std::max(den, double(std::fabs(alone[v])));
  }
  // Same math per row; only the GEMV/GEMM path choice (row count) may change rounding.
  EXPECT_LE(num / den, 2e-2);
}

}  // namespace
}  // namespace moeserve::test
