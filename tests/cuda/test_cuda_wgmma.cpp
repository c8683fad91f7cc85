// The grouped FP8 GEMM kernels called directly (k_gemm_fp8.cu's mma.sync kernel everywhere; on
// sm_90a also k_gemm_fp8_wgmma.cu with 64-row tile tables (64 x 256 tiles) and with 128-row
// tables (128 x 256 tiles)), in all three modes, against a host reference built from the same quantised
// activations and the exact weight dequantisation. Expert row counts include 0, 1, 63/64/65
// (tile edges) and thousands (more tiles than SMs: the persistent loop wraps). Errors are
// measured per expert so a single wrong row of a 1-row expert cannot hide in a global norm.
//
// Bound: the reference is computed in double from the dequantised operands, so the kernels
// differ only by f32 accumulation order and bf16 output rounding (2^-9 relative): 1e-2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/linear/kernels_fp8.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

struct GCase {
  cuda::LinMode mode;
  int K, N;
  std::vector<int> rows;  // rows per expert; empty: kStore without a tile table, M = table_rows
  int table_rows = 0;
};

float silu_f(float g) { return g / (1.f + std::exp(-g)); }

class CudaFp8GroupedGemm : public ::testing::TestWithParam<GCase> {};

TEST_P(CudaFp8GroupedGemm, KernelsMatchHost) {
  SKIP_WITHOUT_GPU();
  const GCase c = GetParam();
  const bool swiglu = c.mode == cuda::LinMode::kSwiglu, table = !c.rows.empty();
  const int E = table ? int(c.rows.size()) : 1;
  int P = table ? 0 : c.table_rows;
  std::vector<int> begin(E + 1, 0);
  for (int e = 0; e < E && table; ++e) begin[e + 1] = begin[e] + c.rows[e];
  if (table) P = begin[E];
  if (!table) begin[1] = P;
  std::mt19937 rng(c.K * 31 + c.N + P);

  // Activations: swiglu gathers token rows (T tokens) through x_rows; else row r is row r.
  const int T = swiglu ? 97 : std::max(P, 1);
  std::vector<int32_t> x_rows(P);
  std::uniform_int_distribution<int> ut(0, T - 1);
  for (auto& r : x_rows) r = swiglu ? ut(rng) : 0;  // unused unless swiglu
  const auto x = randn(size_t(T) * c.K, rng);
  Tensor dx = to_device(x, DType::BF16, {T, c.K});
  const int G = c.K / 128;
  Tensor q = gpu().alloc(DType::F8_E4M3, {T, c.K}), s = gpu().alloc(DType::F32, {T, G});
  cuda::QuantParams qp;
  qp.x = dx.data, qp.ldx = c.K, qp.R = T, qp.K = c.K, qp.q = static_cast<uint8_t*>(q.data), qp.s = s.ptr<float>();
  qp.s_row = G, qp.s_grp = 1;
  cuda::launch_quant_fp8(qp, gpu().stream());
  gpu().synchronize();
  std::vector<uint8_t> hq(size_t(T) * c.K);
  cudaMemcpy(hq.data(), q.data, hq.size(), cudaMemcpyDeviceToHost);
  const auto hs = gpu().download_f32(s);
  std::vector<float> xd(hq.size());  // the kernels' exact activation values
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < c.K; ++k) xd[size_t(t) * c.K + k] = fp8_e4m3_to_f32(hq[size_t(t) * c.K + k]) * hs[size_t(t) * G + k / 128];

  // Weights: per expert W1, W3 [N, K] (swiglu) or W2 [N, K].
  std::vector<HostWeight> w1, w3;
  std::vector<cuda::ExpertPtrs> ptrs(E);
  for (int e = 0; e < E; ++e) {
    w1.push_back(make_weight(c.N, c.K, true, rng));
    if (swiglu) w3.push_back(make_weight(c.N, c.K, true, rng));
    const LinearWeight& a = w1.back().dev;
    const LinearWeight& b = swiglu ? w3.back().dev : a;
    ptrs[e] = {a.weight.data, b.weight.data, a.weight.data, a.scale_inv.ptr<float>(), b.scale_inv.ptr<float>(),
               a.scale_inv.ptr<float>()};
  }
  std::vector<float> row_scale(P);
  std::uniform_real_distribution<float> uw(0.1f, 1.f);
  for (auto& v : row_scale) v = uw(rng);

  // Host reference [P, N].
  std::vector<float> ref(size_t(P) * c.N);
  for (int e = 0; e < E; ++e)
    for (int r = begin[e]; r < begin[e + 1]; ++r) {
      const float* xr = &xd[size_t(swiglu ? x_rows[r] : r) * c.K];
      for (int n = 0; n < c.N; ++n) {
        double g = 0, u = 0;
        const float* a = &w1[e].deq[size_t(n) * c.K];
        for (int k = 0; k < c.K; ++k) g += double(xr[k]) * a[k];
        if (swiglu) {
          const float* b = &w3[e].deq[size_t(n) * c.K];
          for (int k = 0; k < c.K; ++k) u += double(xr[k]) * b[k];
        }
        ref[size_t(r) * c.N + n] = swiglu ? silu_f(float(g)) * float(u)
                                  : c.mode == cuda::LinMode::kDown ? float(g) * row_scale[r] : float(g);
      }
    }

  // Tile tables of 64 rows (mma.sync, wgmma 64 x 256) and 128 rows (wgmma 128 x 192) per
  // expert, as the MoE align builds them, each with 3 spare grid rows.
  auto make_table = [&](int h, std::vector<Tensor>& t) {
    std::vector<int32_t> te, tb, tn;
    for (int e = 0; e < E && table; ++e)
      for (int r = begin[e]; r < begin[e + 1]; r += h)
        te.push_back(e), tb.push_back(r), tn.push_back(std::min(begin[e + 1], r + h));
    const int n = int(te.size());
    for (int i = 0; i < 3; ++i) te.push_back(0), tb.push_back(0), tn.push_back(0);
    t = {ints_to_device(te, {n + 3}), ints_to_device(tb, {n + 3}), ints_to_device(tn, {n + 3}), ints_to_device({n}, {1})};
    return n;
  };
  std::vector<Tensor> t64, t128;
  const int n64 = make_table(64, t64), n128 = make_table(128, t128);
  Tensor d_rows = ints_to_device(x_rows.empty() ? std::vector<int32_t>{0} : x_rows, {std::max(P, 1)});
  Tensor d_scale = to_device(row_scale.empty() ? std::vector<float>{0.f} : row_scale, DType::F32, {std::max(P, 1)});
  void* d_ptrs = nullptr;
  ASSERT_EQ(cudaMalloc(&d_ptrs, sizeof(cuda::ExpertPtrs) * E), cudaSuccess);
  cudaMemcpy(d_ptrs, ptrs.data(), sizeof(cuda::ExpertPtrs) * E, cudaMemcpyHostToDevice);

  cuda::LinParams p;
  p.mode = c.mode;
  p.ldx = c.K, p.x_rows = swiglu ? d_rows.ptr<int32_t>() : nullptr, p.M = P;
  p.N = c.N, p.K = c.K, p.bo = p.bi = 128, p.s_cols = G, p.fp8 = true;
  auto use_table = [&](std::vector<Tensor>& t, int n, int h) {
    p.tile_expert = t[0].ptr<int32_t>(), p.tile_begin = t[1].ptr<int32_t>(), p.tile_end = t[2].ptr<int32_t>();
    p.num_tiles = t[3].ptr<int32_t>(), p.max_tiles = n + 3, p.tile_rows = h;
  };
  if (table) {
    p.experts = static_cast<const cuda::ExpertPtrs*>(d_ptrs);
    use_table(t64, n64, 64);
  } else {
    p.w = w1[0].dev.weight.data, p.s = w1[0].dev.scale_inv.ptr<float>();
  }
  p.ldo = c.N, p.out_f32 = c.mode == cuda::LinMode::kDown;
  p.row_scale = c.mode == cuda::LinMode::kDown ? d_scale.ptr<float>() : nullptr;
  const cuda::Fp8Act act{static_cast<const uint8_t*>(q.data), s.ptr<float>()};

  int cc_major = 0;
  cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0);
  const bool wgmma = cuda::gemm_fp8_wgmma_supported(p);
  if (cc_major == 9) {
    EXPECT_TRUE(wgmma) << "sm_90 device but the wgmma kernel is not available";
  }
  std::vector<std::vector<float>> outs;
  const char* names[3] = {"mma.sync", "wgmma 64x256", "wgmma 128x256"};
  // 0: mma.sync, 1: wgmma 64-row tiles, 2: wgmma 128-row tiles (tile tables only: plain row
  // ranges always take 64 x 256). (The 128 x 192 tiles and the fused quantising epilogue left
  // the tree: docs/bench/cuda_switch_inventory.md.)
  for (int path = 0; path < (!wgmma ? 1 : table ? 3 : 2); ++path) {
    Tensor out = to_device(std::vector<float>(size_t(std::max(P, 1)) * c.N, NAN),
                           p.out_f32 ? DType::F32 : DType::BF16, {std::max(P, 1), c.N});
    p.out = out.data;
    if (table && path == 2) use_table(t128, n128, 128);
    p.fp8_wgmma = false;  // launch_gemm_fp8: the mma.sync kernel
    if (path == 0)
      cuda::launch_gemm_fp8(p, act, gpu().stream());
    else
      cuda::launch_gemm_fp8_wgmma(p, act, gpu().stream());
    p.fp8_wgmma = true;
    gpu().synchronize();
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    auto got = gpu().download_f32(out);
    got.resize(size_t(P) * c.N);
    for (int e = 0; e < E; ++e) {
      if (begin[e + 1] == begin[e]) continue;
      const size_t lo = size_t(begin[e]) * c.N, hi = size_t(begin[e + 1]) * c.N;
      const double err = rel_err(std::vector<float>(got.begin() + lo, got.begin() + hi),
                                 std::vector<float>(ref.begin() + lo, ref.begin() + hi));
      EXPECT_LT(err, 1e-2) << names[path] << " expert " << e << " (" << begin[e + 1] - begin[e]
                           << " rows)";
      if (err >= 1e-2) {  // the first few bad elements, to tell a layout bug from a scale bug
        int shown = 0;
        for (size_t i = lo; i < hi && shown < 6; ++i)
          if (!(std::fabs(got[i] - ref[i]) <= 0.05f * std::fabs(ref[i]) + 1e-3f)) {
            std::printf("  bad [row %zu, col %zu]: got %g ref %g\n", i / c.N, i % c.N, got[i], ref[i]);
            ++shown;
          }
      }
    }
    std::printf("[fp8 grouped] mode %d K=%d N=%d P=%d E=%d %s: vs host %.2e\n", int(c.mode), c.K, c.N, P, E,
                names[path], rel_err(got, ref));
    outs.push_back(std::move(got));
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    const double d = rel_err(outs[i], outs[0]);
    std::printf("[fp8 grouped] %s vs mma.sync %.2e\n", names[i], d);
    EXPECT_LT(d, 1e-2);
  }

  cudaFree(d_ptrs);
}

using cuda::LinMode;
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaFp8GroupedGemm,
    ::testing::Values(GCase{LinMode::kSwiglu, 256, 128, {0, 1, 63, 64, 65, 200, 0, 130}},
                      GCase{LinMode::kDown, 256, 384, {0, 1, 63, 64, 65, 200, 0, 130}},  // N % 256 == 128
                      GCase{LinMode::kSwiglu, 3072, 1536, {1, 65, 300}},                   // M2.5 gate/up
                      GCase{LinMode::kDown, 1536, 3072, {1, 65, 300}},                     // M2.5 down
                      GCase{LinMode::kSwiglu, 384, 256, {5000, 3, 3000}},                  // > 132 tiles
                      GCase{LinMode::kStore, 512, 384, {}, 333},                           // no tile table
                      GCase{LinMode::kStore, 256, 256, {}, 0}));                           // empty

}  // namespace
}  // namespace moeserve::test
