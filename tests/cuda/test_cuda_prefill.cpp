// Prefill paths of the CUDA backend (cuda_prefill.cpp): FP8 activation quantisation, FP8 x FP8
// linears (cuBLASLt block-scaled and the mma.sync kernel), the grouped FP8 expert GEMM and the
// router logits as an f32 GEMM, against host references.
//
// Bounds. Activations are rounded to e4m3 per (token, 128 columns): |q s - x| <= 2^-4 |x|
// per element (3 mantissa bits, round to nearest; subnormals below 2^-6 s are within
// 2^-10 s absolutely), so ||x_q - x|| <= 2^-4 ||x||, and for weights without structure
// aligned to the rounding error ||W (x_q - x)|| / ||W x|| ~ ||x_q - x|| / ||x|| <= 2^-4:
// - against the host GEMM of the host-quantised x (same rounding, exact dequantisation):
//   1e-2 (f32 accumulation in a different order, bf16 output);
// - against the unquantised reference (the CPU op): 2^-4 + 1e-2 = 0.0725 (measured values
//   are printed; random normal inputs land near 0.02-0.03);
// - experts quantise twice (x, then silu(g) * u): 2 x 0.0725 = 0.145 against the CPU op.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/linear/kernels_fp8.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

constexpr double kLinQuantBound = 0.0625 + 1e-2;

// Host emulation of k_quant.cu: s = amax / 448 (1 if zero), q = rn_e4m3(x / s).
std::vector<float> host_quant(const std::vector<float>& x, int R, int K, std::vector<uint8_t>* q = nullptr,
                              std::vector<float>* s = nullptr) {
  std::vector<float> deq(x.size());
  if (q) q->resize(x.size());
  if (s) s->resize(size_t(R) * (K / 128));
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < K / 128; ++g) {
      const float* xr = &x[size_t(r) * K + g * 128];
      float amax = 0.f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(xr[i]));
      const float sc = amax > 0.f ? amax / 448.f : 1.f;
      if (s) (*s)[size_t(r) * (K / 128) + g] = sc;
      for (int i = 0; i < 128; ++i) {
        const uint8_t b = f32_to_fp8_e4m3(xr[i] / sc);
        if (q) (*q)[size_t(r) * K + g * 128 + i] = b;
        deq[size_t(r) * K + g * 128 + i] = fp8_e4m3_to_f32(b) * sc;
      }
    }
  return deq;
}

TEST(CudaPrefill, QuantMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int R = 37, K = 384, G = K / 128;
  auto x = randn(size_t(R) * K, rng, 3.f);
  for (int i = 0; i < 128; ++i) x[size_t(5) * K + 128 + i] = 0.f;  // an all-zero group
  x[7] = 1e-30f;                                                      // subnormal territory
  std::vector<uint8_t> hq;
  std::vector<float> hs;
  host_quant(x, R, K, &hq, &hs);
  Tensor dx = to_device(x, DType::BF16, {R, K});
  // layout 0 / 1: row-major / row-fastest scales (one group per warp; the 4-groups-per-warp
  // variant left the tree: docs/bench/cuda_switch_inventory.md).
  for (int layout = 0; layout < 2; ++layout) {
    Tensor q = gpu().alloc(DType::F8_E4M3, {R, K}), s = gpu().alloc(DType::F32, {R * G});
    cuda::QuantParams p;
    p.x = dx.data, p.ldx = K, p.R = R, p.K = K, p.q = static_cast<uint8_t*>(q.data), p.s = s.ptr<float>();
    p.s_row = layout != 1 ? G : 1, p.s_grp = layout != 1 ? 1 : R;
    cuda::launch_quant_fp8(p, gpu().stream());
    std::vector<uint8_t> gq(size_t(R) * K);
    gpu().synchronize();
    cudaMemcpy(gq.data(), q.data, gq.size(), cudaMemcpyDeviceToHost);
    auto gs = gpu().download_f32(s);
    int bad = 0;
    for (size_t i = 0; i < gq.size(); ++i) bad += gq[i] != hq[i];
    EXPECT_EQ(bad, 0) << "layout " << layout;
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g)
        EXPECT_EQ(gs[size_t(r) * p.s_row + size_t(g) * p.s_grp], hs[size_t(r) * G + g]) << r << "," << g;
  }
}

struct PCase {
  int T, N, K;
};
class CudaPrefillLinear : public ::testing::TestWithParam<PCase> {};

TEST_P(CudaPrefillLinear, Fp8ActivationsWithinBound) {
  SKIP_WITHOUT_GPU();
  const PCase c = GetParam();
  std::mt19937 rng(c.T + 7 * c.N + c.K);
  HostWeight w = make_weight(c.N, c.K, true, rng);
  auto x = randn(size_t(c.T) * c.K, rng);
  Tensor dx = to_device(x, DType::BF16, {c.T, c.K});
  const auto ref = ref_linear(x, w.deq, c.T, c.N, c.K);
  const auto ref_q = ref_linear(host_quant(x, c.T, c.K), w.deq, c.T, c.N, c.K);
  CudaBackend& b = gpu();
  // path 0: default (cuBLASLt where it applies, rows past the last multiple of 8 on the
  // grouped kernel), 1: grouped kernel only (wgmma on sm_90a for >= 128 rows), 2: mma.sync
  // 64 x 128 kernel only.
  // Without FP8 mma.sync code (code_arch() < 890: an arch-80 build, or sm_89/sm_120 running
  // sm_80 code) the kernel-only paths do not exist and the default path is cuBLASLt (library
  // code, Hopper) or the exact bf16 GEMM, so either reference may be the one matched.
  const bool fp8_kernels = cuda::code_arch() >= 890;
  for (int path = 0; path < 3; ++path) {
    if (!fp8_kernels && path > 0) continue;
    b.tuning.use_lt_fp8 = path == 0;
    b.tuning.fp8_gemm_wgmma = path != 2;
    Tensor out = to_device(std::vector<float>(size_t(c.T) * c.N, NAN), DType::BF16, {c.T, c.N});
    b.linear(dx, w.dev, out);
    const auto got = b.download_f32(out);
    const double eq = rel_err(got, ref_q), e = rel_err(got, ref);
    std::printf("[prefill linear] T=%d N=%d K=%d path %d: vs quantised ref %.2e, vs exact ref %.2e\n", c.T, c.N, c.K,
                path, eq, e);
    EXPECT_LT(fp8_kernels ? eq : std::min(eq, e), 1e-2) << "path " << path;
    EXPECT_LT(e, kLinQuantBound) << "path " << path;
  }
  b.tuning.use_lt_fp8 = true;
  b.tuning.fp8_gemm_wgmma = true;
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaPrefillLinear,
                         ::testing::Values(PCase{128, 512, 512},    // smallest T on the path, K/128 = 4
                                           PCase{200, 384, 384},    // K/128 = 3: no cuBLASLt, mma.sync kernel
                                           PCase{333, 1024, 3072},  // k/v proj shape: cuBLASLt on 328 rows, kernel on 5
                                           PCase{136, 1536, 6144},  // o_proj's K
                                           PCase{150, 200, 256}));  // N not a multiple of 128 (kernel, edge cols)

// Router logits through the f32 GEMM: the same experts as the exact reference except on
// near-ties (< 1e-4 apart in biased score), weights within 1e-4.
TEST(CudaPrefill, RouterGemmMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  const int T = 300, H = 3072, E = 256, K = 8;
  auto x = randn(size_t(T) * H, rng);
  auto gate = randn(size_t(E) * H, rng, 0.02f, false);
  auto bias = randn(E, rng, 0.1f, false);
  MoeWeights moe;
  moe.gate = to_device(gate, DType::F32, {E, H});
  moe.score_bias = to_device(bias, DType::F32, {E});
  moe.num_experts = E, moe.top_k = K;
  MoeRouting r;
  ASSERT_GE(T, gpu().tuning.router_gemm_min_tokens);
  gpu().moe_route(to_device(x, DType::BF16, {T, H}), moe, r);
  auto ids = gpu().download_f32(r.expert_ids), w = gpu().download_f32(r.weights);
  int mismatches = 0;
  for (int t = 0; t < T; ++t) {
    std::vector<double> s(E), cs(E);
    for (int e = 0; e < E; ++e) {
      double acc = 0;
      for (int h = 0; h < H; ++h) acc += double(x[size_t(t) * H + h]) * gate[size_t(e) * H + h];
      s[e] = 1.0 / (1.0 + std::exp(-acc));
      cs[e] = s[e] + bias[e];
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cs[a] > cs[b]; });
    double sum = 0;
    for (int j = 0; j < K; ++j) sum += s[order[j]];
    for (int j = 0; j < K; ++j) {
      const int got = int(ids[size_t(t) * K + j]);
      if (got != order[j]) {
        ++mismatches;
        EXPECT_NEAR(cs[got], cs[order[j]], 1e-4) << "token " << t << " slot " << j;
        continue;
      }
      EXPECT_NEAR(w[size_t(t) * K + j], s[order[j]] / sum, 1e-4);
    }
  }
  std::printf("[prefill router] %d near-tie slot differences of %d\n", mismatches, T * K);
}

// Grouped FP8 expert GEMM against the CPU backend's moe_experts (fp32, exact dequantisation).
struct ECase {
  int T, H, I, E, K, skew;  // skew: route only to experts < E / 2 (the rest get 0 tokens)
};
class CudaPrefillExperts : public ::testing::TestWithParam<ECase> {};

TEST_P(CudaPrefillExperts, MatchesCpuOp) {
  SKIP_WITHOUT_GPU();
  const ECase c = GetParam();
  std::mt19937 rng(c.T * 3 + c.E);
  auto cpu = make_cpu_backend();
  MoeWeights moe, hmoe;
  moe.num_experts = hmoe.num_experts = c.E;
  moe.top_k = hmoe.top_k = c.K;
  add_random_experts(c.E, c.H, c.I, rng, moe, hmoe);
  auto x = randn(size_t(c.T) * c.H, rng);
  std::vector<int32_t> ids(size_t(c.T) * c.K);
  std::vector<float> wts(ids.size());
  std::uniform_real_distribution<float> uw(0.05f, 1.f);
  const int pool = c.skew ? c.E / 2 : c.E;
  for (int t = 0; t < c.T; ++t) {
    std::vector<int> all(pool);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < c.K; ++j) ids[size_t(t) * c.K + j] = all[j], wts[size_t(t) * c.K + j] = uw(rng);
  }
  Tensor hx = Tensor::host(DType::F32, {c.T, c.H});
  std::copy(x.begin(), x.end(), hx.ptr<float>());
  MoeRouting hr{Tensor::host(DType::I32, {c.T, c.K}), Tensor::host(DType::F32, {c.T, c.K})};
  std::copy(ids.begin(), ids.end(), hr.expert_ids.ptr<int32_t>());
  std::copy(wts.begin(), wts.end(), hr.weights.ptr<float>());
  Tensor hout = Tensor::host(DType::F32, {c.T, c.H});
  cpu->moe_experts(hx, hmoe, hr, hout);
  std::vector<float> ref(hout.ptr<float>(), hout.ptr<float>() + hout.numel());

  MoeRouting r{ints_to_device(ids, {c.T, c.K}), to_device(wts, DType::F32, {c.T, c.K})};
  Tensor dx = to_device(x, DType::BF16, {c.T, c.H});
  // mode 2: the default (FP8 activations; on sm_90a the wgmma kernel on 128 x 256 tiles of
  // the 128-row tile table, else mma.sync), 1: FP8 mma.sync 64 x 128 only, 0: bf16
  // activations. (The 128 x 192 tiles, the fused SiLU * up quantisation, bf16 pair rows and
  // the forced scalar combine / single-block align left the tree with their switches:
  // docs/bench/cuda_switch_inventory.md.)
  // Every case on the grouped GEMMs (decode-sized T would otherwise take the GEMV tiles).
  const int saved_gemv = gpu().tuning.moe_gemv_max_tokens;
  gpu().tuning.moe_gemv_max_tokens = 0;
  for (int mode : {2, 1, 0}) {
    gpu().tuning.use_fp8_act_gemm = mode > 0;
    gpu().tuning.fp8_gemm_wgmma = mode >= 2;
    Tensor out = to_device(std::vector<float>(size_t(c.T) * c.H, NAN), DType::BF16, {c.T, c.H});
    gpu().moe_experts(dx, moe, r, out);
    const std::vector<float> got = gpu().download_f32(out);
    const double e = rel_err(got, ref);
    std::printf("[prefill experts] T=%d H=%d I=%d E=%d k=%d skew=%d mode=%d: vs CPU op %.2e\n", c.T, c.H, c.I, c.E,
                c.K, c.skew, mode, e);
    EXPECT_LT(e, mode > 0 ? 2 * kLinQuantBound : 2e-2) << "mode " << mode;
  }
  gpu().tuning.use_fp8_act_gemm = true;
  gpu().tuning.fp8_gemm_wgmma = true;
  gpu().tuning.moe_gemv_max_tokens = saved_gemv;
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaPrefillExperts,
                         ::testing::Values(ECase{130, 256, 128, 8, 2, 0},     // just above the threshold
                                           ECase{300, 384, 256, 16, 4, 1},    // half the experts get 0 tokens
                                           ECase{160, 3072, 1536, 32, 4, 0},   // M2.5 expert shapes
                                           // 258 pairs over 96 experts: many with 0, 1 or 2 rows
                                           ECase{129, 256, 384, 96, 2, 0},
                                           // 8 experts x ~500 rows: several 64-row tiles each, tails
                                           ECase{1000, 384, 256, 8, 4, 0},
                                           // 8,400 pairs: the multi-block align (9 blocks), half
                                           // the experts without rows
                                           ECase{2100, 256, 128, 64, 4, 1}));

}  // namespace
}  // namespace moeserve::test
