// Microbenchmark of the prefill ops at M2.5 shapes and 8,192 tokens, old path vs new
// (run with MOESERVE_BENCH=1; otherwise skipped). Weights are device-random (fill_random),
// routing uniform random; times are medians of 5 event-timed runs after a warm-up.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>

#include "backend/cuda/linear/kernels_fp8.h"
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
      b.tuning.use_fp8_act_gemm = path > 0;
      b.tuning.use_lt_fp8 = path == 1;
      b.tuning.fp8_gemm_wgmma = path == 3;
      ms[path] = median_ms([&] { b.linear(in, w, out); });
    }
    b.tuning.fp8_gemm_wgmma = true;
    std::printf("[bench] %-7s T=%d N=%d K=%d: bf16 mma %.3f ms (%.0f TF/s) | lt fp8 %.3f (%.0f) | mma fp8 %.3f (%.0f) | wgmma %.3f (%.0f)\n",
                l.name, T, l.N, l.K, ms[0], flop / ms[0] / 1e9, ms[1], flop / ms[1] / 1e9, ms[2], flop / ms[2] / 1e9,
                ms[3], flop / ms[3] / 1e9);
  }
  b.tuning.use_fp8_act_gemm = true;
  b.tuning.use_lt_fp8 = true;

  // Causal attention of one 8k sequence, 48 q / 8 kv heads x 128, paged cache of 16-token blocks.
  {
    const int Hq = 48, Hkv = 8, D = 128;
    PagedPrefill pp = make_paged_prefill(T, Hq, Hkv, D, 16);
    Tensor out = b.alloc(DType::BF16, {T, Hq * D});
    AttentionArgs a{&pp.q, &pp.kv, &pp.meta, Hq, Hkv, D, 0.088f, &out};
    const double flop = 4.0 * double(T) * (T + 1) / 2 * D * Hq;
    b.tuning.use_attention_wgmma = false;
    b.tuning.use_attention_prefill = false;
    const double old_ms = median_ms([&] { b.attention(a); });
    b.tuning.use_attention_prefill = true;
    const double new_ms = median_ms([&] { b.attention(a); });
    b.tuning.use_attention_wgmma = true;
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
    const int saved = b.tuning.router_gemm_min_tokens;
    b.tuning.router_gemm_min_tokens = 0;
    const double old_ms = median_ms([&] { b.moe_route(x, moe, r); });
    b.tuning.router_gemm_min_tokens = saved;
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
    b.tuning.use_fp8_act_gemm = false;
    const double old_ms = median_ms([&] { b.moe_experts(x, moe, r, out); });
    b.tuning.use_fp8_act_gemm = true;
    b.tuning.fp8_gemm_wgmma = false;
    const double new_ms = median_ms([&] { b.moe_experts(x, moe, r, out); });
    b.tuning.fp8_gemm_wgmma = true;
    const double wg_ms = median_ms([&] { b.moe_experts(x, moe, r, out); });  // default: wgmma 128 x 256
    std::printf("[bench] experts T=%d E=%d k=%d I=%d: bf16 mma %.3f ms (%.0f TF/s) | fp8 mma.sync %.3f ms (%.0f) | "
                "default (wgmma 128x256) %.3f ms (%.0f)\n",
                T, E, K, I, old_ms, flop / old_ms / 1e9, new_ms, flop / new_ms / 1e9, wg_ms, flop / wg_ms / 1e9);
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
  double ms[3][2] = {};
  const bool wg = cuda::gemm_fp8_wgmma_supported(up) && cuda::gemm_fp8_wgmma_supported(down);
  for (int path = 0; path < (wg ? 3 : 1); ++path) {  // mma.sync, wgmma 64 x 256, 128 x 256
    b.tuning.fp8_gemm_wgmma = path > 0;
    if (path == 2) use_table(up, t128, nt128, 128), use_table(down, t128, nt128, 128);
    ms[path][0] = median_ms([&] { cuda::launch_gemm_fp8(up, xa, b.stream()); });
    ms[path][1] = median_ms([&] { cuda::launch_gemm_fp8(down, aa, b.stream()); });
  }
  b.tuning.fp8_gemm_wgmma = true;
  const char* names[3] = {"mma.sync", "wgmma 64x256", "wgmma 128x256"};
  for (int path = 0; path < (wg ? 3 : 1); ++path)
    std::printf("[bench] grouped gemm T=%d E=%d k=%d tiles64=%d tiles128=%d %-14s: up %.3f ms (%.0f TF/s) | down %.3f ms (%.0f) | both %.3f ms (%.0f TF/s)\n",
                T, E, K, nt, nt128, names[path], ms[path][0], f_up / ms[path][0] / 1e9, ms[path][1], f_down / ms[path][1] / 1e9,
                ms[path][0] + ms[path][1], (f_up + f_down) / (ms[path][0] + ms[path][1]) / 1e9);
  cudaFree(d_ptrs);
}

// (ExpertBreakdown8k, the per-kernel A/B of the fused quantisation, 4 groups per warp, bf16
// pair rows and the combine variants, left the tree with those paths; its last figures are in
// docs/bench/log.md and docs/bench/cuda_switch_inventory.md.)

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
    b.tuning.use_attention_wgmma = false;
    const double pipe_ms = median_ms([&] { b.attention(a); });
    const std::vector<float> ref = b.download_f32(out);
    b.tuning.use_attention_wgmma = true;
    std::printf("[bench] attention %d x (q %d, ctx %d): pipelined %.3f ms (%.0f TF/s) | wgmma%s", sh.seqs, sh.qlen,
                sh.ctx, pipe_ms, flop / pipe_ms / 1e9, cuda::attention_wgmma_available() ? "" : " (unavailable: fallback)");
    // The default (the warp-specialised kernel; its variants and the previous two-warpgroup
    // kernel left the tree: docs/bench/cuda_switch_inventory.md).
    {
      const double ms = median_ms([&] { b.attention(a); });
      const double err = rel_err(b.download_f32(out), ref);
      std::printf(" | ws %.3f ms (%.0f TF/s, diff %.1e)", ms, flop / ms / 1e9, err);
      EXPECT_LT(err, 1e-2) << "ws";
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace moeserve::test
