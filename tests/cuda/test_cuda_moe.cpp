// Router, MoE experts (GEMV and grouped-GEMM paths, expert parallelism), GPU sampling and
// CUDA-graph capture of a small step, against host references.
// Thresholds: router weights 1e-4 abs where the choice matches (choices may differ only on
// near-ties, < 1e-4 apart in biased score); experts 2e-2 relative (bf16 activation of the
// intermediate as in the reference engines, bf16 output).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

#include "backend/cuda/common/kernels.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// T = 1, 6, 8 run the fused decode router (route_decode_kernel: logits, then the block-wide
// rank top-k in the last block) and, switched off, the two kernels; T = 20 (> 8 tokens)
// always the two kernels.
class CudaRouter : public ::testing::TestWithParam<std::tuple<int, bool>> {};
TEST_P(CudaRouter, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const int T = std::get<0>(GetParam());
  gpu().tuning.fuse_router = std::get<1>(GetParam());
  std::mt19937 rng(11 + T);
  const int H = 3072, E = 256, K = 8;
  auto x = randn(size_t(T) * H, rng);
  auto gate = randn(size_t(E) * H, rng, 0.02f, false);
  auto bias = randn(E, rng, 0.1f, false);
  MoeWeights moe;
  moe.gate = to_device(gate, DType::F32, {E, H});
  moe.score_bias = to_device(bias, DType::F32, {E});
  moe.num_experts = E, moe.top_k = K;
  MoeRouting r;
  gpu().moe_route(to_device(x, DType::BF16, {T, H}), moe, r);
  auto ids = gpu().download_f32(r.expert_ids), w = gpu().download_f32(r.weights);
  for (int t = 0; t < T; ++t) {
    std::vector<double> s(E), c(E);
    for (int e = 0; e < E; ++e) {
      double acc = 0;
      for (int h = 0; h < H; ++h) acc += double(x[size_t(t) * H + h]) * gate[size_t(e) * H + h];
      s[e] = sigmoid(acc);
      c[e] = s[e] + bias[e];
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c[a] > c[b]; });
    double sum = 0;
    for (int j = 0; j < K; ++j) sum += s[order[j]];
    for (int j = 0; j < K; ++j) {
      const int got = int(ids[size_t(t) * K + j]);
      if (got != order[j]) {
        EXPECT_NEAR(c[got], c[order[j]], 1e-4) << "token " << t << " slot " << j;
        continue;
      }
      EXPECT_NEAR(w[size_t(t) * K + j], s[order[j]] / sum, 1e-4);
    }
  }
  gpu().tuning.fuse_router = true;
}
INSTANTIATE_TEST_SUITE_P(Tokens, CudaRouter,
                         ::testing::Combine(::testing::Values(1, 6, 8, 20), ::testing::Values(true, false)));

struct MoeCase {
  int T, H, I, E_local, E, K, first_local;
  bool fp8;
  int pool = 0;  // > 0: local expert e uses weight set e % pool (top-8 of 256 at M2.5 widths)
};
class CudaMoeExperts : public ::testing::TestWithParam<MoeCase> {};

TEST_P(CudaMoeExperts, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const MoeCase c = GetParam();
  std::mt19937 rng(c.T + c.H + c.E_local * 3 + c.first_local);
  MoeWeights moe;
  moe.num_experts = c.E, moe.top_k = c.K, moe.first_local_expert = c.first_local;
  std::vector<HostWeight> w1, w3, w2;
  const int nsets = c.pool > 0 ? c.pool : c.E_local;
  for (int e = 0; e < nsets; ++e) {
    w1.push_back(make_weight(c.I, c.H, c.fp8, rng));
    w3.push_back(make_weight(c.I, c.H, c.fp8, rng));
    w2.push_back(make_weight(c.H, c.I, c.fp8, rng));
  }
  for (int e = 0; e < c.E_local; ++e)
    moe.experts.push_back({w1[e % nsets].dev, w3[e % nsets].dev, w2[e % nsets].dev});
  auto x = randn(size_t(c.T) * c.H, rng);
  // Routing: distinct random global experts per token, random positive weights.
  std::vector<int32_t> ids(size_t(c.T) * c.K);
  std::vector<float> wts(ids.size());
  std::uniform_real_distribution<float> uw(0.05f, 1.f);
  for (int t = 0; t < c.T; ++t) {
    std::vector<int> all(c.E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < c.K; ++j) ids[size_t(t) * c.K + j] = all[j], wts[size_t(t) * c.K + j] = uw(rng);
  }
  MoeRouting r{ints_to_device(ids, {c.T, c.K}), to_device(wts, DType::F32, {c.T, c.K})};
  Tensor dx = to_device(x, DType::BF16, {c.T, c.H});
  // Reference (intermediate rounded to bf16 like the kernels and the reference engines).
  std::vector<float> ref(size_t(c.T) * c.H, 0.f);
  std::map<int, std::vector<float>> cache;
  for (int t = 0; t < c.T; ++t) {
    std::vector<float> xt(x.begin() + size_t(t) * c.H, x.begin() + size_t(t + 1) * c.H);
    for (int j = 0; j < c.K; ++j) {
      int e = ids[size_t(t) * c.K + j] - c.first_local;
      if (e < 0 || e >= c.E_local) continue;
      e %= nsets;
      auto g = ref_linear(xt, w1[e].deq, 1, c.I, c.H), u = ref_linear(xt, w3[e].deq, 1, c.I, c.H);
      std::vector<float> a(c.I);
      for (int i = 0; i < c.I; ++i) a[i] = bf16_to_f32(f32_to_bf16(float(g[i] / (1 + std::exp(-double(g[i]))) * u[i])));
      auto y = ref_linear(a, w2[e].deq, 1, c.H, c.I);
      for (int h = 0; h < c.H; ++h) ref[size_t(t) * c.H + h] += wts[size_t(t) * c.K + j] * y[h];
    }
  }
  // Default dispatch (GEMV kernels with the tensor-core FP8 GEMV where supported), the
  // f32 CUDA-core GEMV, then the grouped GEMM forced, then the direct pairs forced at any T
  // (default: T == 1 only). (The streaming expert GEMVs of k_moe_gemv.cu and their modes left
  // with the kernels: docs/bench/cuda_switch_inventory.md.)
  std::vector<std::vector<float>> results(4);
  for (int mode = 0; mode < 4; ++mode) {
    const int saved = gpu().tuning.moe_gemv_max_tokens, saved_direct = gpu().tuning.moe_direct_max_tokens;
    gpu().tuning.moe_gemv_max_tokens = mode == 2 ? 0 : saved;
    gpu().tuning.moe_direct_max_tokens = mode == 3 ? 1 << 20 : mode == 0 ? saved_direct : 0;
    gpu().tuning.use_gemv_tc = mode != 1;
    Tensor out = to_device(std::vector<float>(size_t(c.T) * c.H, NAN), DType::BF16, {c.T, c.H});
    gpu().moe_experts(dx, moe, r, out);
    gpu().tuning.moe_gemv_max_tokens = saved;
    gpu().tuning.moe_direct_max_tokens = saved_direct;
    gpu().tuning.use_gemv_tc = true;
    auto got = gpu().download_f32(out);
    results[mode] = got;
    // The grouped GEMM from fp8_act_min_tokens rows quantises x and silu(g) * u to FP8 (each
    // within 2^-4 relative): the documented expert bound 2 x (2^-4 + 1e-2); measured 0.043 at
    // T = 250 / 300 on the H200. Every other path keeps bf16 activations: 2e-2.
    const bool fp8_act = c.fp8 && gpu().tuning.use_fp8_act_gemm && c.T >= gpu().tuning.fp8_act_min_tokens &&
                         (mode == 2 || c.T > gpu().tuning.moe_gemv_max_tokens);
    EXPECT_LT(rel_err(got, ref), fp8_act ? 2 * (0.0625 + 1e-2) : 2e-2) << "mode " << mode;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaMoeExperts,
    ::testing::Values(MoeCase{1, 3072, 1536, 16, 16, 8, 0, true},     // M2.5 expert shapes, decode
                      MoeCase{3, 3072, 1536, 12, 12, 8, 0, true},     // repeated experts across tokens
                      MoeCase{40, 256, 128, 16, 16, 4, 0, true},      // many pairs per expert
                      MoeCase{150, 256, 192, 8, 8, 2, 0, true},       // GEMV tiles; mode 2: grouped GEMM
                      MoeCase{250, 512, 256, 32, 32, 8, 0, true},     // top-8 at batch 250 (GEMV up to 256)
                      MoeCase{300, 256, 128, 16, 16, 4, 0, true},     // > moe_gemv_max_tokens: FP8 grouped GEMM
                      MoeCase{9, 256, 128, 6, 16, 4, 5, true},        // EP: local experts 5..10 of 16
                      MoeCase{1, 256, 128, 6, 16, 4, 5, true},        // EP at decode (direct pairs)
                      MoeCase{7, 320, 96, 5, 5, 2, 0, false},         // bf16 experts
                      MoeCase{16, 128, 32, 8, 8, 2, 0, false},        // bf16, I = 32 (tiny_bf16 at expert TP=2)
                      MoeCase{4, 128, 32, 8, 8, 2, 0, false},
                      MoeCase{5, 200, 72, 4, 4, 2, 0, true},          // odd sizes (scalar paths)
                      // Top-8 of 256 at M2.5 widths (2 weight sets shared by the experts:
                      // quick to build), top-8 of 16 (experts repeated across tokens), small
                      // widths, EP.
                      MoeCase{1, 3072, 1536, 256, 256, 8, 0, true, 2},
                      MoeCase{2, 3072, 1536, 256, 256, 8, 0, true, 2},
                      MoeCase{8, 3072, 1536, 256, 256, 8, 0, true, 2},
                      MoeCase{2, 3072, 1536, 16, 16, 8, 0, true, 2},
                      MoeCase{8, 3072, 1536, 16, 16, 8, 0, true, 2},
                      MoeCase{1, 256, 128, 16, 16, 8, 0, true},
                      MoeCase{2, 512, 256, 16, 16, 8, 0, true},
                      MoeCase{8, 768, 384, 16, 16, 8, 0, true},
                      MoeCase{2, 256, 128, 6, 16, 4, 5, true},
                      MoeCase{8, 768, 384, 6, 16, 8, 5, true}));

TEST(CudaSample, GreedyAndDistribution) {
  SKIP_WITHOUT_GPU();
  const int V = 8, R = 4096;
  const std::vector<float> p = {0.30f, 0.25f, 0.2f, 0.1f, 0.08f, 0.04f, 0.02f, 0.01f};
  std::vector<float> logits(size_t(R) * V);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) logits[size_t(r) * V + v] = std::log(p[(v + 3) % V]);  // token 5 most likely
  Tensor dl = to_device(logits, DType::F32, {R, V});
  Tensor out = gpu().alloc(DType::I32, {R});
  auto run = [&](float temp, int top_k, float top_p) {
    std::vector<GpuSamplingParams> sp(R);
    for (int r = 0; r < R; ++r) sp[r] = {temp, top_k, top_p, uint64_t(r) * 7919u + 13u};
    gpu().sample(dl, sp, out);
    std::vector<double> freq(V, 0);
    for (float id : gpu().download_f32(out)) {
      EXPECT_TRUE(id >= 0 && id < V);
      freq[int(id)] += 1.0 / R;
    }
    return freq;
  };
  auto f = run(0.f, 0, 1.f);
  EXPECT_EQ(f[5], 1.0);
  f = run(1.f, 0, 1.f);
  for (int v = 0; v < V; ++v) EXPECT_NEAR(f[v], p[(v + 3) % V], 0.025) << v;
  f = run(1.f, 3, 1.f);  // top-3: tokens 5, 6, 7 with 0.30 / 0.25 / 0.20 renormalised
  EXPECT_NEAR(f[5], 0.4, 0.03);
  EXPECT_NEAR(f[6], 0.25 / 0.75, 0.03);
  EXPECT_NEAR(f[7], 0.2 / 0.75, 0.03);
  f = run(1.f, 0, 0.5f);  // top-p 0.5: 0.30 + 0.25 >= 0.5 -> tokens 5 and 6
  EXPECT_NEAR(f[5], 0.30 / 0.55, 0.03);
  EXPECT_NEAR(f[6], 0.25 / 0.55, 0.03);
  EXPECT_NEAR(f[5] + f[6], 1.0, 1e-9);
  f = run(1.f, 1, 1.f);  // top-1 is greedy
  EXPECT_EQ(f[5], 1.0);
}

// A captured step (norm -> FP8 linear -> router -> experts) replays to the same result as
// eager execution, with new inputs written into the same buffers.
TEST(CudaGraph, CapturedStepMatchesEager) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  const int T = 4, H = 256, I = 128, E = 8, K = 2;
  HostWeight lw = make_weight(H, H, true, rng);
  MoeWeights moe;
  moe.gate = to_device(randn(size_t(E) * H, rng, 0.05f, false), DType::F32, {E, H});
  moe.num_experts = E, moe.top_k = K;
  std::vector<HostWeight> keep;
  for (int e = 0; e < E; ++e) {
    keep.push_back(make_weight(I, H, true, rng));
    keep.push_back(make_weight(I, H, true, rng));
    keep.push_back(make_weight(H, I, true, rng));
    moe.experts.push_back({keep[keep.size() - 3].dev, keep[keep.size() - 2].dev, keep.back().dev});
  }
  Tensor norm_w = to_device(randn(H, rng, 0.5f), DType::BF16, {H});
  Tensor x = gpu().alloc(DType::BF16, {T, H}), h = gpu().alloc(DType::BF16, {T, H}),
         y = gpu().alloc(DType::BF16, {T, H}), out = gpu().alloc(DType::BF16, {T, H});
  MoeRouting r{gpu().alloc(DType::I32, {T, K}), gpu().alloc(DType::F32, {T, K})};
  auto step = [&] {
    gpu().rms_norm(x, norm_w, 1e-6f, h);
    gpu().linear(h, lw.dev, y);
    gpu().moe_route(y, moe, r);
    gpu().moe_experts(y, moe, r, out);
  };
  auto in1 = randn(size_t(T) * H, rng), in2 = randn(size_t(T) * H, rng);
  std::vector<uint16_t> raw(in1.size());
  auto put = [&](const std::vector<float>& v) {
    for (size_t i = 0; i < v.size(); ++i) raw[i] = f32_to_bf16(v[i]);
    gpu().copy_from_host(x, raw.data(), raw.size() * 2);
  };
  put(in2);
  step();  // eager run sizes workspaces and builds the expert table
  auto eager2 = gpu().download_f32(out);
  gpu().begin_capture();
  step();
  CudaGraph g = gpu().end_capture();
  put(in1);
  step();
  auto eager1 = gpu().download_f32(out);
  put(in2);
  g.replay(gpu().stream());
  EXPECT_EQ(gpu().download_f32(out), eager2);
  put(in1);
  g.replay(gpu().stream());
  EXPECT_EQ(gpu().download_f32(out), eager1);
}

}  // namespace
}  // namespace moeserve::test
