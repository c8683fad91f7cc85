// The DeepSeek-V3 family's router on CUDA (k_route_grouped.cu: logits GEMV + per-token grouped
// top-k) against the CPU backend's moe_route (label gpu; skips without a device), at the real
// widths (H 7168) of Kimi-K2.5 (384 experts, one group, scaling 2.827) and DeepSeek-V3 (256
// experts, 8 groups, top 4 groups, scaling 2.5), T = 1, 8, 64 (the logits GEMV) and 300 (eager:
// the split-bf16 router GEMM, then the same top-k).
//
// ExactSelection: inputs whose logits are exact in any summation order (x has five non-zero
// columns of +-0.5, the gate is a multiple of 1/4; logits are k / 8 + 1 / 32 in [-2, 2]) and a
// bias of 0 or 1/8 (per group where there are groups), so many experts and groups tie exactly
// and the ids must equal the CPU's (ties: lower id) one for one; the only difference left is
// expf against std::exp (<= 2 ulp), far below the gaps of distinct choices and group sums
// (>= 4e-6). Random: normal inputs, near-ties may swap (>= 95% of ids agree). Graph: the op
// captured and replayed equals the eager op bit for bit. Timing: the op at batch 1 / 64 against
// the one-block-per-token generic kernel it replaces (printed).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/common/kernels_generic.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

constexpr int kH = 7168;

struct Family {
  const char* name;
  int E, K;
  RoutingSpec spec;
};
const Family kKimi{"kimi-k2.5", 384, 8, RoutingSpec{RouteScoring::Sigmoid, 1, 1, true, 2.827f}};
const Family kDsv3{"deepseek-v3", 256, 8, RoutingSpec{RouteScoring::Sigmoid, 8, 4, true, 2.5f}};

struct RouteCase {
  std::vector<float> x, gate, bias;  // [T, H], [E, H], [E]
};

RouteCase exact_inputs(const Family& f, int T, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  RouteCase c;
  c.gate.resize(size_t(f.E) * kH);
  std::uniform_int_distribution<int> q(-4, 4);
  for (auto& g : c.gate) g = 0.25f * float(q(rng));
  for (int e = 0; e < f.E; ++e) c.gate[size_t(e) * kH + kH - 1] = 1.f / 16;  // + 1/32 on every logit
  c.x.assign(size_t(T) * kH, 0.f);
  std::uniform_int_distribution<int> col(0, kH - 2), sign(0, 1);
  for (int t = 0; t < T; ++t) {
    c.x[size_t(t) * kH + kH - 1] = 0.5f;
    for (int j = 0; j < 4;) {
      const int k = col(rng);
      float& v = c.x[size_t(t) * kH + size_t(k)];
      if (v != 0.f) continue;
      v = sign(rng) ? 0.5f : -0.5f;
      ++j;
    }
  }
  const int G = std::max(1, f.spec.n_group), per = f.E / G;
  std::vector<float> gb(static_cast<size_t>(G));
  for (auto& b : gb) b = sign(rng) ? 0.125f : 0.f;
  c.bias.resize(size_t(f.E));
  for (int e = 0; e < f.E; ++e) c.bias[size_t(e)] = G > 1 ? gb[size_t(e / per)] : (sign(rng) ? 0.125f : 0.f);
  return c;
}

RouteCase random_inputs(const Family& f, int T, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  RouteCase c;
  c.x = randn(size_t(T) * kH, rng);
  c.gate = randn(size_t(f.E) * kH, rng, 0.02f, false);
  c.bias = randn(size_t(f.E), rng, 0.05f, false);
  return c;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

void set_moe(MoeWeights& m, const Family& f) { m.num_experts = f.E, m.top_k = f.K, m.route = f.spec; }

Routed run_cpu(const Family& f, const RouteCase& c, int T) {
  auto cpu = make_cpu_backend();
  MoeWeights m;
  m.gate = host_f32(c.gate, {f.E, kH}), m.score_bias = host_f32(c.bias, {f.E});
  set_moe(m, f);
  MoeRouting r{cpu->alloc(DType::I32, {T, f.K}), cpu->alloc(DType::F32, {T, f.K})};
  cpu->moe_route(host_f32(c.x, {T, kH}), m, r);
  Routed out;
  out.ids.assign(r.expert_ids.ptr<int32_t>(), r.expert_ids.ptr<int32_t>() + T * f.K);
  out.w.assign(r.weights.ptr<float>(), r.weights.ptr<float>() + T * f.K);
  return out;
}

struct GpuRoute {
  MoeWeights m;
  Tensor x;
  MoeRouting r;
  GpuRoute(const Family& f, const RouteCase& c, int T) {
    m.gate = to_device(c.gate, DType::F32, {f.E, kH}), m.score_bias = to_device(c.bias, DType::F32, {f.E});
    set_moe(m, f);
    x = to_device(c.x, DType::BF16, {T, kH});  // bf16-exact inputs
    r = MoeRouting{gpu().alloc(DType::I32, {T, f.K}), gpu().alloc(DType::F32, {T, f.K})};
  }
  void run() { gpu().moe_route(x, m, r); }
  // gemm = false: the logits GEMV even where eager steps take the router GEMM (T >= 64).
  void run(bool gemm) {
    const int keep = gpu().tuning.router_gemm_min_tokens;
    if (!gemm) gpu().tuning.router_gemm_min_tokens = 1 << 30;
    run();
    gpu().tuning.router_gemm_min_tokens = keep;
  }
  Routed get() {
    gpu().synchronize();
    Routed out;
    for (float v : gpu().download_f32(r.expert_ids)) out.ids.push_back(int32_t(v));
    out.w = gpu().download_f32(r.weights);
    return out;
  }
};

class CudaRouteGrouped : public ::testing::TestWithParam<int> {};

TEST_P(CudaRouteGrouped, ExactSelection) {
  SKIP_WITHOUT_GPU();
  const int T = GetParam();
  for (const Family* f : {&kKimi, &kDsv3}) {
    const RouteCase c = exact_inputs(*f, T, 100 + T + f->E);
    const Routed ref = run_cpu(*f, c, T);
    GpuRoute g(*f, c, T);
    for (bool gemm : {false, true}) {
      if (gemm && T < gpu().tuning.router_gemm_min_tokens) continue;
      g.run(gemm);
      const Routed got = g.get();
      SCOPED_TRACE(gemm ? "router GEMM" : "logits GEMV");
      int diff = 0;
      double werr = 0;
      for (int i = 0; i < T * f->K; ++i) {
        diff += got.ids[size_t(i)] != ref.ids[size_t(i)];
        werr = std::max(werr, double(std::fabs(got.w[size_t(i)] - ref.w[size_t(i)])) / std::fabs(ref.w[size_t(i)]));
      }
      EXPECT_EQ(diff, 0) << f->name << " T=" << T << ": ids differ from the CPU reference";
      EXPECT_LE(werr, 1e-5) << f->name << " T=" << T << ": weights";
      for (int t = 0; t < T; ++t)  // distinct ids per token
        for (int a = 0; a < f->K; ++a)
          for (int b = a + 1; b < f->K; ++b) ASSERT_NE(got.ids[size_t(t * f->K + a)], got.ids[size_t(t * f->K + b)]);
    }
  }
}

TEST_P(CudaRouteGrouped, RandomInputs) {
  SKIP_WITHOUT_GPU();
  const int T = GetParam();
  for (const Family* f : {&kKimi, &kDsv3}) {
    const RouteCase c = random_inputs(*f, T, 7 + T + f->E);
    const Routed ref = run_cpu(*f, c, T);
    GpuRoute g(*f, c, T);
    for (bool gemm : {false, true}) {
      if (gemm && T < gpu().tuning.router_gemm_min_tokens) continue;
      g.run(gemm);
      const Routed got = g.get();
      SCOPED_TRACE(gemm ? "router GEMM" : "logits GEMV");
      int same = 0;
      for (int i = 0; i < T * f->K; ++i) {
        if (got.ids[size_t(i)] != ref.ids[size_t(i)]) continue;
        ++same;
        EXPECT_NEAR(got.w[size_t(i)], ref.w[size_t(i)], 2e-4 * f->spec.routed_scaling_factor) << f->name << " " << i;
      }
      // Logits summed in another order may swap near-tied experts.
      EXPECT_GE(same, T * f->K * 95 / 100) << f->name << " T=" << T << ": ids agree " << same << " / " << T * f->K;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaRouteGrouped, ::testing::Values(1, 8, 64, 300));

TEST(CudaRouteGroupedGraph, ReplayEqualsEager) {
  SKIP_WITHOUT_GPU();
  for (int T : {1, 8, 64}) {
    for (const Family* f : {&kKimi, &kDsv3}) {
      const RouteCase c = random_inputs(*f, T, 3 + T);
      GpuRoute g(*f, c, T);
      g.run(false);  // eager, the path the capture takes (T < 128: no router GEMM); sizes the workspace
      const Routed eager = g.get();
      const uint64_t fallbacks = gpu().graph_fallbacks();
      gpu().begin_capture();
      g.run();
      CudaGraph graph = gpu().end_capture();
      gpu().fill_random(g.r.weights, 5, 1.f);
      graph.replay(gpu().stream());
      const Routed replayed = g.get();
      EXPECT_EQ(replayed.ids, eager.ids) << f->name << " T=" << T;
      EXPECT_EQ(replayed.w, eager.w) << f->name << " T=" << T;
      EXPECT_EQ(gpu().graph_fallbacks(), fallbacks);
    }
  }
}

// The op at decode batches: the new router against the generic kernel it replaces (printed).
TEST(CudaRouteGroupedTiming, DecodeBatches) {
  SKIP_WITHOUT_GPU();
  for (const Family* f : {&kKimi, &kDsv3}) {
    for (int T : {1, 8, 64}) {
      const RouteCase c = random_inputs(*f, T, 1);
      GpuRoute g(*f, c, T);
      const double ms = event_median_ms([&] { g.run(false); }, 20);  // the path decode graphs take
      cuda::GenericRouteParams p;
      p.x = g.x.data, p.x_bf16 = true, p.gate = g.m.gate.data, p.gate_bf16 = false;
      p.bias = g.m.score_bias.ptr<float>(), p.T = T, p.H = kH, p.E = f->E, p.top_k = f->K, p.spec = f->spec;
      p.ids = g.r.expert_ids.ptr<int32_t>(), p.weights = g.r.weights.ptr<float>();
      const double old_ms = event_median_ms([&] { cuda::launch_moe_route_generic(p, gpu().stream()); }, 20);
      const double gate_mb = double(f->E) * kH * 4 / 1e6;
      std::printf("[route %s T=%d] grouped %.4f ms (%.0f GB/s of the %.1f MB gate) | generic %.4f ms\n", f->name, T,
                  ms, gate_mb / ms, gate_mb, old_ms);
    }
  }
}

}  // namespace
}  // namespace moeserve::test
