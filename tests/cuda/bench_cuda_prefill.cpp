// Microbenchmark of the prefill ops at M2.5 shapes and 8,192 tokens, old path vs new
// (run with MOESERVE_BENCH=1; otherwise skipped). Weights are device-random (fill_random),
// routing uniform random; times are medians of 5 event-timed runs after a warm-up.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>

#include "backend/cuda/kernels_fp8.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

double median_ms(const std::function<void()>& f) { return event_median_ms(f, 5); }

TEST(CudaPrefillBench, M25Shapes8k) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_BENCH")) GTEST_SKIP() << "set MOESERVE_BENCH=1";
  CudaBackend& b = gpu();
  const int T = 8192, H = 3072;
  Tensor x = b.alloc(DType::BF16, {T, H});
  b.fill_random(x, 3, 1.f);
  struct Lin {
    const char* name;
    int N, K;
  };
  for (const Lin& l : {Lin{"q_proj", 6144, 3072}, Lin{"k_proj", 1024, 3072}, Lin{"o_proj", 3072, 6144}}) {
    LinearWeight w = rand_fp8(l.N, l.K, 11);
    Tensor in = l.K == H ? x : b.alloc(DType::BF16, {T, l.K});
    if (l.K != H) b.fill_random(in, 4, 1.f);
    Tensor out = b.alloc(DType::BF16, {T, l.N});
    const double flop = 2.0 * T * l.N * l.K;
    double ms[4];
    for (int path = 0; path < 4; ++path) {  // bf16 mma, cuBLASLt FP8, FP8 mma.sync 64x128, FP8 wgmma 64x256
      b.use_fp8_act_gemm = path > 0;
      b.use_lt_fp8 = path == 1;
      cuda::g_fp8_gemm_wgmma = path == 3;
      ms[path] = median_ms([&] { b.linear(in, w, out); });
    }
    cuda::g_fp8_gemm_wgmma = true;
    std::printf("[bench] %-7s T=%d N=%d K=%d: bf16 mma %.3f ms (%.0f TF/s) | lt fp8 %.3f (%.0f) | mma fp8 %.3f (%.0f) | wgmma %.3f (%.0f)\n",
                l.name, T, l.N, l.K, ms[0], flop / ms[0] / 1e9, ms[1], flop / ms[1] / 1e9, ms[2], flop / ms[2] / 1e9,
                ms[3], flop / ms[3] / 1e9);
  }
  b.use_fp8_act_gemm = true;
  b.use_lt_fp8 = true;

  // Causal attention of one 8k sequence, 48 q / 8 kv heads x 128, paged cache of 16-token blocks.
  {
    const int Hq = 48, Hkv = 8, D = 128;
    PagedPrefill pp = make_paged_prefill(T, Hq, Hkv, D, 16);
    Tensor out = b.alloc(DType::BF16, {T, Hq * D});
    AttentionArgs a{&pp.q, &pp.kv, &pp.meta, Hq, Hkv, D, 0.088f, &out};
    const double flop = 4.0 * double(T) * (T + 1) / 2 * D * Hq;
    b.use_attention_wgmma = false;
    b.use_attention_prefill = false;
    const double old_ms = median_ms([&] { b.attention(a); });
    b.use_attention_prefill = true;
    const double new_ms = median_ms([&] { b.attention(a); });
    b.use_attention_wgmma = true;
    const double wg_ms = median_ms([&] { b.attention(a); });
    std::printf("[bench] attention T=%d causal: tc %.3f ms (%.0f TF/s) | pipelined %.3f ms (%.0f TF/s) | wgmma%s %.3f ms (%.0f TF/s)\n",
                T, old_ms, flop / old_ms / 1e9, new_ms, flop / new_ms / 1e9,
                cuda::attention_wgmma_available() ? "" : " (unavailable: fallback)", wg_ms, flop / wg_ms / 1e9);
  }

  // Router.
  {
    const int E = 256, K = 8;
    MoeWeights moe;
    moe.gate = b.alloc(DType::F32, {E, H});
    b.fill_random(moe.gate, 21, 0.02f);
    moe.num_experts = E, moe.top_k = K;
    MoeRouting r{b.alloc(DType::I32, {T, K}), b.alloc(DType::F32, {T, K})};
    const int saved = b.router_gemm_min_tokens;
    b.router_gemm_min_tokens = 0;
    const double old_ms = median_ms([&] { b.moe_route(x, moe, r); });
    b.router_gemm_min_tokens = saved;
    const double new_ms = median_ms([&] { b.moe_route(x, moe, r); });
    std::printf("[bench] router  T=%d E=%d: CUDA-core %.3f ms | f32 GEMM + top-k %.3f ms\n", T, E, old_ms, new_ms);
  }

  // Experts: 256 experts, top-8, I = 1536, uniform random routing.
  {
    const int E = 256, K = 8, I = 1536;
    MoeWeights moe;
    moe.num_experts = E, moe.top_k = K;
    for (int e = 0; e < E; ++e)
      moe.experts.push_back({rand_fp8(I, H, 100 + 3 * e), rand_fp8(I, H, 101 + 3 * e), rand_fp8(H, I, 102 + 3 * e)});
    std::mt19937 rng(9);
    std::vector<int32_t> ids(size_t(T) * K);
    std::vector<float> wts(ids.size(), 0.125f);
    for (int t = 0; t < T; ++t) {
      std::vector<int> all(E);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int j = 0; j < K; ++j) ids[size_t(t) * K + j] = all[j];
    }
    MoeRouting r{ints_to_device(ids, {T, K}), to_device(wts, DType::F32, {T, K})};
    Tensor out = b.alloc(DType::BF16, {T, H});
    const double flop = 2.0 * 3 * T * K * double(H) * I;
    b.use_fp8_act_gemm = false;
    const double old_ms = median_ms([&] { b.moe_experts(x, moe, r, out); });
    b.use_fp8_act_gemm = true;
    cuda::g_fp8_gemm_wgmma = false;
    const double new_ms = median_ms([&] { b.moe_experts(x, moe, r, out); });
    cuda::g_fp8_gemm_wgmma = true;
    const int saved_tile_m = cuda::g_fp8_wgmma_tile_m;
    const bool saved_wide = cuda::g_fp8_wgmma_wide;
    cuda::g_fp8_wgmma_tile_m = 64, cuda::g_fp8_wgmma_wide = false;
    const double wg_ms = median_ms([&] { b.moe_experts(x, moe, r, out); });
    cuda::g_fp8_wgmma_tile_m = 128;
    const double wg2_ms = median_ms([&] { b.moe_experts(x, moe, r, out); });
    cuda::g_fp8_wgmma_tile_m = saved_tile_m, cuda::g_fp8_wgmma_wide = saved_wide;
    std::printf("[bench] experts T=%d E=%d k=%d I=%d: bf16 mma %.3f ms (%.0f TF/s) | fp8 mma.sync %.3f ms (%.0f) | "
                "wgmma 64x256 %.3f ms (%.0f) | wgmma 128x192 %.3f ms (%.0f)\n",
                T, E, K, I, old_ms, flop / old_ms / 1e9, new_ms, flop / new_ms / 1e9, wg_ms, flop / wg_ms / 1e9, wg2_ms,
                flop / wg2_ms / 1e9);
  }
}

// The two grouped expert GEMMs alone (no quantisation, align or combine) at 8,192 tokens,
// 256 experts, top-8, uniform random routing: mma.sync kernel vs wgmma kernel.
TEST(CudaPrefillBench, GroupedGemm8k) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_BENCH")) GTEST_SKIP() << "set MOESERVE_BENCH=1";
  CudaBackend& b = gpu();
  const int T = 8192, E = 256, K = 8, H = 3072, I = 1536, P = T * K;
  std::mt19937 rng(9);
  std::vector<int> count(E, 0);
  for (int t = 0; t < T; ++t) {
    std::vector<int> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < K; ++j) ++count[all[j]];
  }
  std::vector<int32_t> rows(P);
  std::uniform_int_distribution<int> ut(0, T - 1);
  for (auto& v : rows) v = ut(rng);
  Tensor d_rows = ints_to_device(rows, {P});
  // Tile tables of 64 and 128 rows per expert (as the MoE align builds them).
  auto make_table = [&](int h, std::vector<Tensor>& t) {
    std::vector<int32_t> te, tb, tn;
    for (int e = 0, r0 = 0; e < E; r0 += count[e++])
      for (int r = r0; r < r0 + count[e]; r += h) te.push_back(e), tb.push_back(r), tn.push_back(std::min(r0 + count[e], r + h));
    const int n = int(te.size());
    t = {ints_to_device(te, {n}), ints_to_device(tb, {n}), ints_to_device(tn, {n}), ints_to_device({n}, {1})};
    return n;
  };
  std::vector<Tensor> t64, t128;
  const int nt = make_table(64, t64), nt128 = make_table(128, t128);
  std::vector<LinearWeight> keep;
  std::vector<cuda::ExpertPtrs> ptrs(E);
  for (int e = 0; e < E; ++e) {
    keep.push_back(rand_fp8(I, H, 100 + 3 * e));
    keep.push_back(rand_fp8(I, H, 101 + 3 * e));
    keep.push_back(rand_fp8(H, I, 102 + 3 * e));
    const size_t n = keep.size();
    ptrs[e] = {keep[n - 3].weight.data, keep[n - 2].weight.data, keep[n - 1].weight.data,
               keep[n - 3].scale_inv.ptr<float>(), keep[n - 2].scale_inv.ptr<float>(), keep[n - 1].scale_inv.ptr<float>()};
  }
  void* d_ptrs = nullptr;
  ASSERT_EQ(cudaMalloc(&d_ptrs, sizeof(cuda::ExpertPtrs) * E), cudaSuccess);
  cudaMemcpy(d_ptrs, ptrs.data(), sizeof(cuda::ExpertPtrs) * E, cudaMemcpyHostToDevice);
  Tensor xq = b.alloc(DType::F8_E4M3, {T, H}), xs = b.alloc(DType::F32, {T, H / 128});
  Tensor aq = b.alloc(DType::F8_E4M3, {P, I}), as = b.alloc(DType::F32, {P, I / 128});
  b.fill_random(xq, 1, 1.f), b.fill_random(xs, 2, 1.f / 64), b.fill_random(aq, 3, 1.f), b.fill_random(as, 4, 1.f / 64);
  Tensor act = b.alloc(DType::BF16, {P, I}), y = b.alloc(DType::F32, {P, H});
  Tensor wts = b.alloc(DType::F32, {P});
  b.fill_random(wts, 5, 1.f);
  cuda::LinParams up;
  up.mode = cuda::LinMode::kSwiglu, up.ldx = H, up.x_rows = d_rows.ptr<int32_t>(), up.M = P;
  up.experts = static_cast<const cuda::ExpertPtrs*>(d_ptrs), up.N = I, up.K = H, up.s_cols = H / 128;
  auto use_table = [&](cuda::LinParams& p, std::vector<Tensor>& t, int n, int h) {
    p.tile_expert = t[0].ptr<int32_t>(), p.tile_begin = t[1].ptr<int32_t>(), p.tile_end = t[2].ptr<int32_t>();
    p.num_tiles = t[3].ptr<int32_t>(), p.max_tiles = n, p.tile_rows = h;
  };
  use_table(up, t64, nt, 64);
  up.out = act.data, up.ldo = I;
  cuda::LinParams down = up;
  down.mode = cuda::LinMode::kDown, down.ldx = I, down.x_rows = nullptr, down.N = H, down.K = I, down.s_cols = I / 128;
  down.out = y.data, down.ldo = H, down.out_f32 = true, down.row_scale = wts.ptr<float>();
  const cuda::Fp8Act xa{static_cast<const uint8_t*>(xq.data), xs.ptr<float>()};
  const cuda::Fp8Act aa{static_cast<const uint8_t*>(aq.data), as.ptr<float>()};
  const double f_up = 2.0 * P * H * 2.0 * I, f_down = 2.0 * P * double(I) * H;
  double ms[4][2] = {};
  const bool saved_wide = cuda::g_fp8_wgmma_wide;
  const bool wg = cuda::gemm_fp8_wgmma_supported(up) && cuda::gemm_fp8_wgmma_supported(down);
  for (int path = 0; path < (wg ? 4 : 1); ++path) {  // mma.sync, wgmma 64 x 256, 128 x 192, 128 x 256
    cuda::g_fp8_gemm_wgmma = path > 0;
    cuda::g_fp8_wgmma_wide = path == 3;
    if (path == 2) use_table(up, t128, nt128, 128), use_table(down, t128, nt128, 128);
    ms[path][0] = median_ms([&] { cuda::launch_gemm_fp8(up, xa, b.stream()); });
    ms[path][1] = median_ms([&] { cuda::launch_gemm_fp8(down, aa, b.stream()); });
  }
  cuda::g_fp8_gemm_wgmma = true;
  cuda::g_fp8_wgmma_wide = saved_wide;
  const char* names[4] = {"mma.sync", "wgmma 64x256", "wgmma 128x192", "wgmma 128x256"};
  for (int path = 0; path < (wg ? 4 : 1); ++path)
    std::printf("[bench] grouped gemm T=%d E=%d k=%d tiles64=%d tiles128=%d %-14s: up %.3f ms (%.0f TF/s) | down %.3f ms (%.0f) | both %.3f ms (%.0f TF/s)\n",
                T, E, K, nt, nt128, names[path], ms[path][0], f_up / ms[path][0] / 1e9, ms[path][1], f_down / ms[path][1] / 1e9,
                ms[path][0] + ms[path][1], (f_up + f_down) / (ms[path][0] + ms[path][1]) / 1e9);
  cudaFree(d_ptrs);
}

// Where the prefill expert op's time goes at 8,192 tokens (M2.5: 256 experts, top-8, H 3072,
// I 1536, uniform random routing): each kernel of moe_experts timed alone, launched with the
// same parameters the op builds, then the whole op under the path switches.
TEST(CudaPrefillBench, ExpertBreakdown8k) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_BENCH")) GTEST_SKIP() << "set MOESERVE_BENCH=1";
  CudaBackend& b = gpu();
  const int T = 8192, E = 256, K = 8, H = 3072, I = 1536, P = T * K;
  cudaStream_t st = b.stream();
  Tensor x = b.alloc(DType::BF16, {T, H});
  b.fill_random(x, 3, 1.f);
  MoeWeights moe;
  moe.num_experts = E, moe.top_k = K;
  std::vector<cuda::ExpertPtrs> ptrs(E);
  for (int e = 0; e < E; ++e) {
    moe.experts.push_back({rand_fp8(I, H, 100 + 3 * e), rand_fp8(I, H, 101 + 3 * e), rand_fp8(H, I, 102 + 3 * e)});
    const ExpertWeights& w = moe.experts.back();
    ptrs[e] = {w.w1.weight.data, w.w3.weight.data, w.w2.weight.data, w.w1.scale_inv.ptr<float>(),
               w.w3.scale_inv.ptr<float>(), w.w2.scale_inv.ptr<float>()};
  }
  std::mt19937 rng(9);
  std::vector<int32_t> ids(size_t(T) * K);
  std::vector<float> wts(ids.size(), 0.125f);
  for (int t = 0; t < T; ++t) {
    std::vector<int> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < K; ++j) ids[size_t(t) * K + j] = all[j];
  }
  MoeRouting r{ints_to_device(ids, {T, K}), to_device(wts, DType::F32, {T, K})};
  void* d_ptrs = nullptr;
  ASSERT_EQ(cudaMalloc(&d_ptrs, sizeof(cuda::ExpertPtrs) * E), cudaSuccess);
  cudaMemcpy(d_ptrs, ptrs.data(), sizeof(cuda::ExpertPtrs) * E, cudaMemcpyHostToDevice);

  // Buffers as moe_experts lays them out.
  const int max_tiles = cuda::moe_max_tiles(P, cuda::kGemmTileM, E);
  Tensor meta = b.alloc(DType::I32, {2 * P + 3 * max_tiles + 1});
  Tensor sw = b.alloc(DType::F32, {P});
  int32_t* m = meta.ptr<int32_t>();
  cuda::MoeAlignParams a;
  a.ids = r.expert_ids.ptr<int32_t>(), a.weights = r.weights.ptr<float>();
  a.T = T, a.top_k = K, a.first_local = 0, a.num_local = E, a.tile_rows = cuda::kGemmTileM;
  a.sorted_token = m, a.pair_pos = m + P, a.tile_expert = m + 2 * P, a.tile_begin = a.tile_expert + max_tiles;
  a.tile_end = a.tile_begin + max_tiles, a.num_tiles = a.tile_end + max_tiles, a.sorted_weight = sw.ptr<float>();
  Tensor xq = b.alloc(DType::F8_E4M3, {T, H}), xs = b.alloc(DType::F32, {T, H / 128});
  Tensor act = b.alloc(DType::BF16, {P, I}), aq = b.alloc(DType::F8_E4M3, {P, I}), as = b.alloc(DType::F32, {P, I / 128});
  Tensor y = b.alloc(DType::F32, {P, H}), out = b.alloc(DType::BF16, {T, H});
  cuda::QuantParams qx;
  qx.x = x.data, qx.ldx = H, qx.R = T, qx.K = H, qx.q = static_cast<uint8_t*>(xq.data), qx.s = xs.ptr<float>();
  qx.s_row = H / 128, qx.s_grp = 1;
  cuda::QuantParams qa = qx;
  qa.x = act.data, qa.ldx = I, qa.R = P, qa.K = I, qa.q = static_cast<uint8_t*>(aq.data), qa.s = as.ptr<float>();
  qa.s_row = I / 128;
  cuda::LinParams up;
  up.mode = cuda::LinMode::kSwiglu, up.ldx = H, up.x_rows = a.sorted_token, up.M = P;
  up.experts = static_cast<const cuda::ExpertPtrs*>(d_ptrs), up.N = I, up.K = H, up.s_cols = H / 128;
  up.tile_expert = a.tile_expert, up.tile_begin = a.tile_begin, up.tile_end = a.tile_end, up.num_tiles = a.num_tiles;
  up.max_tiles = max_tiles, up.tile_rows = cuda::kGemmTileM, up.out = act.data, up.ldo = I;
  cuda::LinParams upq = up;
  upq.out_q = static_cast<uint8_t*>(aq.data), upq.out_qs = as.ptr<float>();
  cuda::LinParams down = up;
  down.mode = cuda::LinMode::kDown, down.ldx = I, down.x_rows = nullptr, down.N = H, down.K = I, down.s_cols = I / 128;
  down.out = y.data, down.ldo = H, down.out_f32 = true, down.row_scale = a.sorted_weight;
  cuda::LinParams down16 = down;
  down16.out_f32 = false;
  const cuda::Fp8Act xa{static_cast<const uint8_t*>(xq.data), xs.ptr<float>()};
  const cuda::Fp8Act aa{static_cast<const uint8_t*>(aq.data), as.ptr<float>()};
  const bool wg = cuda::gemm_fp8_wgmma_supported(up) && cuda::gemm_fp8_wgmma_supported(upq);
  if (!wg) GTEST_SKIP() << "no sm_90a wgmma kernel";
  cuda::launch_quant_fp8(qx, st);
  cuda::launch_moe_align(a, st);
  b.synchronize();
  const double f_up = 2.0 * P * H * 2.0 * I, f_down = 2.0 * P * double(I) * H;
  const double t_qx = median_ms([&] { cuda::launch_quant_fp8(qx, st); });
  const double t_align = median_ms([&] { cuda::launch_moe_align(a, st); });
  cuda::MoeAlignParams am = a;  // multi-block align, scratch in the pair-row buffer
  am.scratch = static_cast<int32_t*>(y.data), am.scratch_bytes = size_t(P) * H * 4;
  const double t_align_multi = median_ms([&] { cuda::launch_moe_align(am, st); });
  const double t_up = median_ms([&] { cuda::launch_gemm_fp8_wgmma(up, xa, st); });
  const bool saved_batch = cuda::g_quant_fp8_batch;
  cuda::g_quant_fp8_batch = false;
  const double t_qa = median_ms([&] { cuda::launch_quant_fp8(qa, st); });
  cuda::g_quant_fp8_batch = true;
  const double t_qa1 = median_ms([&] { cuda::launch_quant_fp8(qa, st); });
  const double t_qx1 = median_ms([&] { cuda::launch_quant_fp8(qx, st); });
  cuda::g_quant_fp8_batch = saved_batch;
  const double t_upq = median_ms([&] { cuda::launch_gemm_fp8_wgmma(upq, xa, st); });
  const double t_down = median_ms([&] { cuda::launch_gemm_fp8_wgmma(down, aa, st); });
  const double t_down16 = median_ms([&] { cuda::launch_gemm_fp8_wgmma(down16, aa, st); });
  const int32_t* pp = a.pair_pos;
  const double t_comb = median_ms([&] { cuda::launch_moe_combine(y.ptr<float>(), pp, T, K, H, out.data, true, st); });
  const double t_comb4 = median_ms([&] { cuda::launch_moe_combine4(y.data, false, pp, T, K, H, out.data, true, st); });
  const double t_comb16 = median_ms([&] { cuda::launch_moe_combine4(y.data, true, pp, T, K, H, out.data, true, st); });
  // The same GEMMs on 128 x 256 tiles (their own 128-row tile table).
  const int max_tiles2 = cuda::moe_max_tiles(P, 128, E);
  Tensor meta2 = b.alloc(DType::I32, {2 * P + 3 * max_tiles2 + 1});
  Tensor sw2 = b.alloc(DType::F32, {P});
  cuda::MoeAlignParams a2 = a;
  int32_t* m2 = meta2.ptr<int32_t>();
  a2.tile_rows = 128, a2.sorted_token = m2, a2.pair_pos = m2 + P, a2.tile_expert = m2 + 2 * P;
  a2.tile_begin = a2.tile_expert + max_tiles2, a2.tile_end = a2.tile_begin + max_tiles2;
  a2.num_tiles = a2.tile_end + max_tiles2, a2.sorted_weight = sw2.ptr<float>();
  cuda::launch_moe_align(a2, st);
  auto table2 = [&](cuda::LinParams q) {
    q.tile_expert = a2.tile_expert, q.tile_begin = a2.tile_begin, q.tile_end = a2.tile_end, q.num_tiles = a2.num_tiles;
    q.max_tiles = max_tiles2, q.tile_rows = 128;
    if (q.x_rows) q.x_rows = a2.sorted_token;
    if (q.row_scale) q.row_scale = a2.sorted_weight;
    return q;
  };
  const cuda::LinParams upq2 = table2(upq), down2 = table2(down);
  const bool saved_wide = cuda::g_fp8_wgmma_wide;
  const int saved_tile_m = cuda::g_fp8_wgmma_tile_m;
  cuda::g_fp8_wgmma_wide = true;
  const double t_upq2 = median_ms([&] { cuda::launch_gemm_fp8_wgmma(upq2, xa, st); });
  cuda::LinParams up2 = upq2;
  up2.out_q = nullptr, up2.out_qs = nullptr;
  const double t_up2 = median_ms([&] { cuda::launch_gemm_fp8_wgmma(up2, xa, st); });
  const double t_down2 = median_ms([&] { cuda::launch_gemm_fp8_wgmma(down2, aa, st); });
  cuda::g_fp8_wgmma_wide = saved_wide;
  std::printf("[bench] expert GEMMs 128x256 tiles: up bf16-out %.3f ms (%.0f TF/s) | up fused-quant %.3f ms (%.0f TF/s) | down f32-out %.3f ms (%.0f TF/s) "
              "| both %.0f TF/s (64x256: %.0f)\n",
              t_up2, f_up / t_up2 / 1e9, t_upq2, f_up / t_upq2 / 1e9, t_down2, f_down / t_down2 / 1e9, (f_up + f_down) / (t_upq2 + t_down2) / 1e9,
              (f_up + f_down) / (t_upq + t_down) / 1e9);
  std::printf("[bench] quantisation, 4 groups per warp (MOESERVE_QUANT_BATCH=1): x %.3f ms | act %.3f ms\n", t_qx1, t_qa1);
  std::printf("[bench] expert pieces T=%d E=%d k=%d H=%d I=%d: quant x %.3f ms | align %.3f (multi-block %.3f) | up bf16-out %.3f (%.0f TF/s) "
              "| quant act %.3f | up fused-quant %.3f (%.0f TF/s) | down f32-out %.3f (%.0f TF/s) | down bf16-out %.3f "
              "(%.0f TF/s) | combine f32 scalar %.3f | combine f32 x4 %.3f | combine bf16 x4 %.3f\n",
              T, E, K, H, I, t_qx, t_align, t_align_multi, t_up, f_up / t_up / 1e9, t_qa, t_upq, f_up / t_upq / 1e9, t_down,
              f_down / t_down / 1e9, t_down16, f_down / t_down16 / 1e9, t_comb, t_comb4, t_comb16);
  // The whole op: before (separate quantisation, f32 pair rows, scalar combine), the new
  // default (fused quantisation, vectorised combine), and + bf16 pair rows.
  // Configurations interleaved, 3 rounds, best median each (GPU clocks drift under load).
  const bool saved_fused = b.moe_fused_quant;
  struct Cfg {
    const char* name;
    bool fused, ybf16, vec, multi, wide;
  };
  const double flop = f_up + f_down;
  const Cfg cfgs[] = {Cfg{"before", false, false, false, false, false},
                      Cfg{"fused quant", true, false, false, false, false},
                      Cfg{"fused + x4 + multi align", true, false, true, true, false},
                      Cfg{"unfused + x4 + multi align", false, false, true, true, false},
                      Cfg{"+ bf16 pair rows", true, true, true, true, false},
                      Cfg{"128x256 unfused", false, false, true, true, true},
                      Cfg{"128x256 fused", true, false, true, true, true},
                      Cfg{"128x256 fused bf16 pairs", true, true, true, true, true}};
  constexpr int kCfgs = sizeof(cfgs) / sizeof(cfgs[0]);
  double best[kCfgs];
  for (int rep = 0; rep < 3; ++rep)
    for (int i = 0; i < kCfgs; ++i) {
      const Cfg& c = cfgs[i];
      b.moe_fused_quant = c.fused, b.moe_ypair_bf16 = c.ybf16, b.moe_combine_vec = c.vec, b.moe_align_multi = c.multi;
      cuda::g_fp8_wgmma_tile_m = c.wide ? 128 : 64;
      cuda::g_fp8_wgmma_wide = c.wide;
      const double ms = median_ms([&] { b.moe_experts(x, moe, r, out); });
      best[i] = rep == 0 ? ms : std::min(best[i], ms);
    }
  for (int i = 0; i < kCfgs; ++i)
    std::printf("[bench] moe_experts T=%d %-30s %.3f ms (%.0f TF/s)\n", T, cfgs[i].name, best[i], flop / best[i] / 1e9);
  b.moe_fused_quant = saved_fused, b.moe_ypair_bf16 = false, b.moe_combine_vec = true, b.moe_align_multi = true;
  cuda::g_fp8_wgmma_tile_m = saved_tile_m;
  cuda::g_fp8_wgmma_wide = saved_wide;
  cudaFree(d_ptrs);
}

// Prefill attention at M2.5 shapes (48 q / 8 kv heads x 128, 16-token blocks, shuffled block
// table): whole causal prompts and a chunk after a cached prefix. TF/s count causal FLOPs
// (4 D Hq per visible (query, key) pair). Also checks the wgmma output against the pipelined
// kernel's at these long shapes (the op tests cover them against the host reference).
TEST(CudaPrefillBench, Attention) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_BENCH")) GTEST_SKIP() << "set MOESERVE_BENCH=1";
  CudaBackend& b = gpu();
  struct AShape {
    int seqs, qlen, ctx;  // per sequence
  };
  const int Hq = 48, Hkv = 8, D = 128, bs = 16;
  // MOESERVE_BENCH_ATTN_SHAPE=i: only shape i (e.g. 1 = 8k causal, for a profiler run).
  const char* only = std::getenv("MOESERVE_BENCH_ATTN_SHAPE");
  int shape_idx = -1;
  for (const AShape sh : {AShape{1, 1024, 1024}, AShape{1, 8192, 8192}, AShape{2, 4096, 4096}, AShape{1, 2048, 8192},
                          AShape{1, 16384, 16384}}) {
    if (only && std::atoi(only) != ++shape_idx) continue;
    const int T = sh.seqs * sh.qlen, per = (sh.ctx + bs - 1) / bs, nb = per * sh.seqs;
    Tensor q = b.alloc(DType::BF16, {T, Hq * D}), out = b.alloc(DType::BF16, {T, Hq * D});
    b.fill_random(q, 41, 1.f);
    KVCacheLayer kv{b.alloc(DType::BF16, {nb, bs, Hkv, D}), b.alloc(DType::BF16, {nb, bs, Hkv, D})};
    b.fill_random(kv.k, 42, 1.f);
    b.fill_random(kv.v, 43, 1.f);
    std::vector<int32_t> table(nb), qs(sh.seqs + 1), cl(sh.seqs, sh.ctx);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(2));
    for (int i = 0; i <= sh.seqs; ++i) qs[i] = i * sh.qlen;
    AttentionMeta m;
    m.num_seqs = sh.seqs, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = per;
    m.max_query_len = sh.qlen, m.max_context_len = sh.ctx;
    m.query_start = ints_to_device(qs, {sh.seqs + 1});
    m.context_lens = ints_to_device(cl, {sh.seqs});
    m.block_tables = ints_to_device(table, {sh.seqs, per});
    AttentionArgs a{&q, &kv, &m, Hq, Hkv, D, 0.088f, &out};
    double pairs = 0;
    for (int i = 0; i < sh.qlen; ++i) pairs += sh.ctx - sh.qlen + i + 1;
    const double flop = 4.0 * pairs * sh.seqs * D * Hq;
    b.use_attention_wgmma = false;
    const double pipe_ms = median_ms([&] { b.attention(a); });
    const std::vector<float> ref = b.download_f32(out);
    b.use_attention_wgmma = true;
    std::printf("[bench] attention %d x (q %d, ctx %d): pipelined %.3f ms (%.0f TF/s) | wgmma%s", sh.seqs, sh.qlen,
                sh.ctx, pipe_ms, flop / pipe_ms / 1e9, cuda::attention_wgmma_available() ? "" : " (unavailable: fallback)");
    // Warp-specialised kernel (default: cp.async page loader, overlap, ping-pong, 2 stages,
    // persistent grid; opt-in TMA) and its variants, then the previous two-warpgroup kernel: sequential /
    // overlapped with ping-pong order; mbarrier + ping-pong (opt-in).
    struct V {
      const char* name;
      bool ws = true, ws_ovl = true, ws_pp = true;
      int ws_st = 2;
      bool persist = true, page = true, tma = false;
      bool ovl = false, mbar = false;
    };
    auto mk = [](const char* n, auto f) {
      V v;
      v.name = n;
      f(v);
      return v;
    };
    const V vars[] = {mk("ws", [](V&) {}),
                      mk("ws_tma", [](V& v) { v.tma = true; }),
                      mk("ws3", [](V& v) { v.ws_st = 3; }),
                      mk("ws_seq", [](V& v) { v.ws_ovl = false; }),
                      mk("ws_nopp", [](V& v) { v.ws_pp = false; }),
                      mk("ws_grid", [](V& v) { v.persist = false; }),
                      mk("ws_tma_grid", [](V& v) { v.tma = true, v.persist = false; }),
                      mk("ws_genload", [](V& v) { v.page = false; }),
                      mk("old seq+pp", [](V& v) { v.ws = false; }),
                      mk("old overlap+pp", [](V& v) { v.ws = false, v.ovl = true; }),
                      mk("old mbar+pp", [](V& v) { v.ws = false, v.mbar = true; })};
    for (const V& v : vars) {
      if (v.mbar && std::getenv("MOESERVE_TEST_NO_MBAR")) continue;
      cuda::g_attn_ws = v.ws, cuda::g_attn_ws_overlap = v.ws_ovl, cuda::g_attn_ws_pp = v.ws_pp, cuda::g_attn_ws_stages = v.ws_st;
      cuda::g_attn_ws_persistent = v.persist, cuda::g_attn_ws_page_loader = v.page, cuda::g_attn_ws_tma = v.tma;
      cuda::g_attn_wgmma_overlap = v.ovl, cuda::g_attn_wgmma_order = true, cuda::g_attn_wgmma_mbar = v.mbar;
      const double ms = median_ms([&] { b.attention(a); });
      const double err = rel_err(b.download_f32(out), ref);
      std::printf(" | %s %.3f ms (%.0f TF/s, diff %.1e)", v.name, ms, flop / ms / 1e9, err);
      EXPECT_LT(err, 1e-2) << v.name;
    }
    cuda::g_attn_ws = true, cuda::g_attn_ws_overlap = true, cuda::g_attn_ws_pp = true, cuda::g_attn_ws_stages = 2;
    cuda::g_attn_ws_persistent = true, cuda::g_attn_ws_page_loader = true, cuda::g_attn_ws_tma = false;
    std::printf("\n");
    cuda::g_attn_wgmma_overlap = false;
    cuda::g_attn_wgmma_order = true;
    cuda::g_attn_wgmma_mbar = false;
  }
}

}  // namespace
}  // namespace moeserve::test
