// Batch-1 dense decode kernels against host references, the CPU backend and the previous
// CUDA paths (same process, switches flipped): the dense GEMV of k_gemv_dense.cu for
// linear_multi (q/k/v segments) and add_rms_norm_linear_multi (fused norm), and the fused
// add + RMSNorm + router of k_route_dense.cu. Each case checks that the new kernel really ran
// (launch counters) and is called twice on fresh inputs, so a last-block counter that was not
// reset (what a graph replay would see) fails the second call. T = 1, 2, 4, 8 with the M2.5
// widths and small / odd widths (partial 8- and 16-row blocks, 1 chunk, pieces of unequal
// length). Bounds: 1e-2 relative against the references (as the per-op tests), 5e-3 against
// the old path (both round to bf16; the f32 sums differ only in order).
#include <algorithm>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/common/kernels.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

// The backend's defaults (restored after each test).
// (Single linears on the dense kernel, CudaLinearDense, left with that opt-in path:
// docs/bench/cuda_switch_inventory.md.)
const int kDefaultDense = 1;

Tensor poisoned(int64_t rows, int64_t cols) {
  return to_device(std::vector<float>(size_t(rows * cols), NAN), DType::BF16, {rows, cols});
}

// linear_multi (q/k/v in one launch) on the dense kernel against references and the old path.
class CudaLinearMultiDense : public ::testing::TestWithParam<int> {};

TEST_P(CudaLinearMultiDense, MatchesReferenceAndOldPath) {
  SKIP_WITHOUT_GPU();
  const int T = GetParam();
  for (int shape = 0; shape < 2; ++shape) {
    const int K = shape == 0 ? 3072 : 640;
    // M2.5 q/k/v; small widths with a partial 16-row group (144)
    const std::vector<int> widths = shape == 0 ? std::vector<int>{6144, 1024, 1024} : std::vector<int>{768, 128, 144};
    std::mt19937 rng(T * 17 + shape);
    std::vector<HostWeight> w;
    for (int n : widths) w.push_back(make_weight(n, K, true, rng));
    auto x = randn(size_t(T) * K, rng);
    Tensor dx = to_device(x, DType::BF16, {T, K});
    std::vector<std::vector<float>> got[2];
    for (int dense = 1; dense >= 0; --dense) {
      gpu().tuning.gemv_dense_max_tokens = dense ? 8 : 0;
      std::vector<Tensor> outs;
      for (int n : widths) outs.push_back(poisoned(T, n));
      const LinearWeight* ws[3] = {&w[0].dev, &w[1].dev, &w[2].dev};
      Tensor* os[3] = {&outs[0], &outs[1], &outs[2]};
      const uint64_t before = gpu().gemv_dense_launches;
      gpu().linear_multi(dx, ws, os, 3);
      if (dense && cuda::code_arch() >= 900) {
        EXPECT_EQ(gpu().gemv_dense_launches, before + 1);
      }
      for (int i = 0; i < 3; ++i) {
        got[dense].push_back(gpu().download_f32(outs[i]));
        auto ref = ref_linear(x, w[i].deq, T, widths[i], K);
        EXPECT_LT(rel_err(got[dense][i], ref), 1e-2) << "dense " << dense << " shape " << shape << " output " << i;
      }
    }
    for (int i = 0; i < 3; ++i) EXPECT_LT(rel_err(got[1][i], got[0][i]), 5e-3) << "shape " << shape << " output " << i;
  }
  gpu().tuning.gemv_dense_max_tokens = kDefaultDense;
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaLinearMultiDense, ::testing::Values(1, 2, 4, 8));

// add_rms_norm_linear_multi with the norm inside the dense kernel against host references
// and the unfused old path (norm kernel + tensor-core GEMV).
class CudaAddNormLinearMultiDense : public ::testing::TestWithParam<int> {};

TEST_P(CudaAddNormLinearMultiDense, MatchesReferenceAndOldPath) {
  SKIP_WITHOUT_GPU();
  const int T = GetParam();
  for (int shape = 0; shape < 2; ++shape) {
    const int K = shape == 0 ? 3072 : 384;
    const std::vector<int> widths = shape == 0 ? std::vector<int>{6144, 1024, 1024} : std::vector<int>{40, 16, 200};
    std::mt19937 rng(T * 13 + 3 + shape);
    auto res = randn(size_t(T) * K, rng), dx = randn(size_t(T) * K, rng), nw = randn(K, rng, 0.5f);
    std::vector<HostWeight> w;
    for (int n : widths) w.push_back(make_weight(n, K, true, rng));
    std::vector<float> r_ref(size_t(T) * K), xn_ref(size_t(T) * K);
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int h = 0; h < K; ++h) {
        const float v = bf16_to_f32(f32_to_bf16(res[size_t(t) * K + h] + dx[size_t(t) * K + h]));
        r_ref[size_t(t) * K + h] = v;
        ss += double(v) * v;
      }
      const double r = 1.0 / std::sqrt(ss / K + 1e-6);
      for (int h = 0; h < K; ++h)
        xn_ref[size_t(t) * K + h] = bf16_to_f32(f32_to_bf16(float(r_ref[size_t(t) * K + h] * r * nw[h])));
    }
    std::vector<std::vector<float>> got[2];
    for (int dense = 1; dense >= 0; --dense) {
      gpu().tuning.gemv_dense_max_tokens = dense ? 8 : 0;
      for (int rep = 0; rep < 2; ++rep) {  // rep 1: the counter must have been reset
        Tensor tres = to_device(res, DType::BF16, {T, K}), tdx = to_device(dx, DType::BF16, {T, K});
        Tensor tnw = to_device(nw, DType::BF16, {K}), xn = poisoned(T, K);
        std::vector<Tensor> outs;
        for (int n : widths) outs.push_back(poisoned(T, n));
        const LinearWeight* ws[3] = {&w[0].dev, &w[1].dev, &w[2].dev};
        Tensor* os[3] = {&outs[0], &outs[1], &outs[2]};
        const uint64_t before = gpu().gemv_dense_launches;
        gpu().add_rms_norm_linear_multi(tres, tdx, tnw, 1e-6f, xn, ws, os, 3);
        if (dense && cuda::code_arch() >= 900) {  // shape 1 (widths % 16 != 0): norm kernel + 3 GEMVs
          EXPECT_EQ(gpu().gemv_dense_launches, before + (shape == 0 ? 1 : 0));
        }
        EXPECT_LT(rel_err(gpu().download_f32(tres), r_ref), 1e-2) << "residual, dense " << dense;
        EXPECT_LT(rel_err(gpu().download_f32(xn), xn_ref), 1e-2) << "normed, dense " << dense;
        std::vector<std::vector<float>> o;
        for (int i = 0; i < 3; ++i) {
          o.push_back(gpu().download_f32(outs[i]));
          auto ref = ref_linear(xn_ref, w[i].deq, T, widths[i], K);
          EXPECT_LT(rel_err(o[i], ref), 1e-2) << "output " << i << ", dense " << dense << " shape " << shape;
        }
        if (rep == 0) {
          got[dense] = o;
        } else {
          EXPECT_EQ(o, got[dense]) << "second call differs, dense " << dense;
        }
      }
    }
    for (int i = 0; i < 3; ++i) EXPECT_LT(rel_err(got[1][i], got[0][i]), 5e-3) << "shape " << shape << " output " << i;
  }
  gpu().tuning.gemv_dense_max_tokens = kDefaultDense;
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaAddNormLinearMultiDense, ::testing::Values(1, 2, 4, 8));

// add_rms_norm_route on k_route_dense.cu: against the CPU backend (norm, residual, router on
// the GPU's normed rows) and against the old path (norm kernel + decode router: the logits
// are summed in the same order, the norm's sum of squares not). Gate rows 5 and 9 are equal with equal biases (a
// tie: the lower id first); variant 1 also puts a NaN into gate row 3 (NaN ranks last; old
// path only, the CPU's order of a NaN is not defined).
struct RouteCase {
  int T, H, E, K;
};
class CudaAddNormRouteDense : public ::testing::TestWithParam<RouteCase> {};

TEST_P(CudaAddNormRouteDense, MatchesCpuAndOldPath) {
  SKIP_WITHOUT_GPU();
  const RouteCase c = GetParam();
  const int T = c.T, H = c.H, E = c.E, K = c.K;
  auto cpu = make_cpu_backend();
  const bool runs = T <= 4;  // T > 4: the old path even when switched on
  for (int variant = 0; variant < (K < E ? 2 : 1); ++variant) {  // K == E: the NaN row would be chosen
    std::mt19937 rng(T * 5 + E + variant);
    auto res = randn(size_t(T) * H, rng), dx = randn(size_t(T) * H, rng), nw = randn(H, rng, 0.5f);
    auto gate = randn(size_t(E) * H, rng, 0.02f, false), bias = randn(E, rng, 0.01f, false);
    std::copy(gate.begin() + 5 * H, gate.begin() + 6 * H, gate.begin() + 9 * H);
    bias[9] = bias[5];
    if (variant == 1) gate[size_t(3) * H + 7] = NAN;
    // cfg 2: the fused kernel (at T = 1 with its one-token tail), 1: the fused kernel with the
    // block_rank_topk tail, 0: the old path.
    std::vector<std::vector<float>> got[3];
    for (int cfg = 2; cfg >= 0; --cfg) {
      const int dense = cfg >= 1;
      gpu().tuning.route_norm_dense = dense == 1;
      gpu().tuning.route_fast_tail = cfg == 2;
      for (int rep = 0; rep < 2; ++rep) {
        Tensor tres = to_device(res, DType::BF16, {T, H}), tdx = to_device(dx, DType::BF16, {T, H});
        Tensor tnw = to_device(nw, DType::BF16, {H}), out = poisoned(T, H);
        MoeWeights m;
        m.gate = to_device(gate, DType::F32, {E, H});
        m.score_bias = to_device(bias, DType::F32, {E});
        m.num_experts = E, m.top_k = K;
        MoeRouting r{gpu().alloc(DType::I32, {T, K}), gpu().alloc(DType::F32, {T, K})};
        const uint64_t before = gpu().route_dense_launches;
        gpu().add_rms_norm_route(tres, tdx, tnw, 1e-6f, out, m, r);
        EXPECT_EQ(gpu().route_dense_launches, before + (dense && runs ? 1 : 0));
        std::vector<std::vector<float>> g = {gpu().download_f32(tres), gpu().download_f32(out),
                                             gpu().download_f32(r.expert_ids), gpu().download_f32(r.weights)};
        if (rep == 0) {
          got[cfg] = g;
        } else {
          EXPECT_EQ(g, got[cfg]) << "second call differs, cfg " << cfg;
        }
      }
    }
    gpu().tuning.route_fast_tail = true;
    // The one-token tail (loads first, per-warp argmax top-k) against block_rank_topk: the same
    // residual, normed row, ids and weights, bit for bit (ties and the NaN row included).
    EXPECT_EQ(got[2], got[1]) << "one-token tail vs block_rank_topk tail";
    // Against the old path: the same residual; normed rows equal up to the norm's summation
    // order (a bf16 rounding flip here and there); the same experts (a near-tie aside) and
    // weights where they agree.
    EXPECT_EQ(got[1][0], got[0][0]) << "residual vs old path";
    EXPECT_LT(rel_err(got[1][1], got[0][1]), 1e-3) << "normed vs old path";
    for (int t = 0; t < T; ++t) {
      int same = 0;
      for (int a = 0; a < K; ++a) {
        if (got[1][2][size_t(t) * K + a] != got[0][2][size_t(t) * K + a]) continue;
        ++same;
        EXPECT_NEAR(got[1][3][size_t(t) * K + a], got[0][3][size_t(t) * K + a], 1e-5) << "token " << t;
      }
      EXPECT_GE(same, K - 2) << "token " << t << " vs old path";
    }
    const auto& g = got[2];
    // Norm and residual against the CPU backend.
    Tensor cres = host_f32(res, {T, H}), cout = cpu->alloc(DType::F32, {T, H});
    cpu->add_rms_norm(cres, host_f32(dx, {T, H}), host_f32(nw, {H}), 1e-6f, cout);
    EXPECT_LT(rel_err(g[0], cpu->download_f32(cres)), 1e-2);
    EXPECT_LT(rel_err(g[1], cpu->download_f32(cout)), 1e-2);
    for (int t = 0; t < T; ++t) {
      std::vector<int> ids(g[2].begin() + t * K, g[2].begin() + (t + 1) * K);
      if (variant == 1) {
        EXPECT_EQ(std::count(ids.begin(), ids.end(), 3), 0) << "NaN logit chosen";
      }
      const auto p5 = std::find(ids.begin(), ids.end(), 5), p9 = std::find(ids.begin(), ids.end(), 9);
      if (p9 != ids.end()) {
        EXPECT_TRUE(p5 != ids.end() && p5 < p9) << "tie: expert 5 must rank before 9";
      }
    }
    if (variant == 1) continue;
    // Router against the CPU router on the GPU's (bf16) normed rows.
    MoeWeights cm;
    cm.gate = host_f32(gate, {E, H}), cm.score_bias = host_f32(bias, {E}), cm.num_experts = E, cm.top_k = K;
    MoeRouting cr{cpu->alloc(DType::I32, {T, K}), cpu->alloc(DType::F32, {T, K})};
    cpu->moe_route(host_f32(g[1], {T, H}), cm, cr);
    auto cids = cpu->download_f32(cr.expert_ids), cw = cpu->download_f32(cr.weights);
    for (int t = 0; t < T; ++t) {
      int common = 0;
      for (int a = 0; a < K; ++a)
        for (int b = 0; b < K; ++b) common += g[2][size_t(t) * K + a] == cids[size_t(t) * K + b];
      EXPECT_GE(common, K - 1) << "token " << t;
      if (common == K)
        for (int a = 0; a < K; ++a)
          if (g[2][size_t(t) * K + a] == cids[size_t(t) * K + a])
            EXPECT_NEAR(g[3][size_t(t) * K + a], cw[size_t(t) * K + a], 1e-4) << "token " << t;
    }
  }
  gpu().tuning.route_norm_dense = true;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAddNormRouteDense,
                         ::testing::Values(RouteCase{1, 3072, 256, 8},  // M2.5 decode
                                           RouteCase{2, 3072, 256, 8}, RouteCase{4, 3072, 256, 8},
                                           RouteCase{8, 3072, 256, 8},   // above the fused limit: old path
                                           RouteCase{3, 384, 60, 4},     // E not a multiple of 8
                                           RouteCase{1, 384, 60, 4},     // one-token tail with padding lanes
                                           RouteCase{1, 3072, 128, 8},   // 16 blocks
                                           RouteCase{1, 4096, 32, 32}));  // widest H, top_k 32

}  // namespace
}  // namespace moeserve::test
