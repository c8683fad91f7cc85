// Fused decode ops of the CUDA backend against host references or the CPU backend (the
// Backend defaults: the unfused ops composed): linear_multi (q/k/v in one launch),
// qk_norm_rope_write_kv (one kernel; at decode a cluster of 8 blocks per token),
// add_rms_norm_route and add_rms_norm_linear_multi, each at decode and at token counts that
// take the unfused path, plus the fused path switched off. Outputs are poisoned
// (NaN) first, so an unwritten element fails. Bounds as in the per-op tests (1e-2).
#include "backend/cpu/cpu_backend.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

Tensor poisoned(int64_t rows, int64_t cols) {
  return to_device(std::vector<float>(size_t(rows * cols), NAN), DType::BF16, {rows, cols});
}

class CudaLinearMulti : public ::testing::TestWithParam<int> {};

TEST_P(CudaLinearMulti, MatchesSeparateReference) {
  SKIP_WITHOUT_GPU();
  const int T = GetParam(), K = 512;
  std::mt19937 rng(T + 7);
  // q/k/v-like widths (the last not a multiple of 32: a partial 32-row block), and a bf16
  // weight variant that must fall back to separate launches.
  const std::vector<int> widths = {768, 128, 144};
  for (int variant = 0; variant < 3; ++variant) {
    const bool fp8 = variant != 2;
    gpu().tuning.fuse_linear_multi = variant != 1;
    std::vector<HostWeight> w;
    for (int n : widths) w.push_back(make_weight(n, K, fp8, rng));
    auto x = randn(size_t(T) * K, rng);
    Tensor dx = to_device(x, DType::BF16, {T, K});
    std::vector<Tensor> outs;
    for (int n : widths) outs.push_back(poisoned(T, n));
    const LinearWeight* ws[3] = {&w[0].dev, &w[1].dev, &w[2].dev};
    Tensor* os[3] = {&outs[0], &outs[1], &outs[2]};
    gpu().linear_multi(dx, ws, os, 3);
    for (int i = 0; i < 3; ++i) {
      auto ref = ref_linear(x, w[i].deq, T, widths[i], K);
      EXPECT_LT(rel_err(gpu().download_f32(outs[i]), ref), 1e-2) << "variant " << variant << " output " << i;
    }
  }
  gpu().tuning.fuse_linear_multi = true;
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaLinearMulti, ::testing::Values(1, 5, 64, 70));

struct QkCase {
  int T, Hq, Hkv, D, rot;
};
class CudaQkNormRopeWriteKv : public ::testing::TestWithParam<QkCase> {};

TEST_P(CudaQkNormRopeWriteKv, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const QkCase c = GetParam();
  auto cpu = make_cpu_backend();
  std::mt19937 rng(c.T * 31 + c.Hkv);
  const int bs = 16, blocks = (c.T + bs - 1) / bs + 2, QW = c.Hq * c.D, KW = c.Hkv * c.D;
  auto q = randn(size_t(c.T) * QW, rng), k = randn(size_t(c.T) * KW, rng), v = randn(size_t(c.T) * KW, rng);
  auto qn = randn(QW, rng, 0.5f), kn = randn(KW, rng, 0.5f);
  auto kc = randn(size_t(blocks) * bs * KW, rng), vc = randn(size_t(blocks) * bs * KW, rng);
  std::vector<int32_t> pos(c.T), slots(c.T);
  for (int t = 0; t < c.T; ++t) {
    pos[t] = 1000 + 37 * t;
    slots[t] = (t == 1) ? -1 : blocks * bs - 1 - t;  // token 1: padding, not written
  }
  for (int fused = 1; fused >= 0; --fused) {
    gpu().tuning.fuse_qk_write_kv = fused == 1;
    auto run = [&](Backend& b, bool on_gpu) {
      auto T_ = [&](const std::vector<float>& x, const Shape& s) {
        return on_gpu ? to_device(x, DType::BF16, s) : host_f32(x, s);
      };
      Tensor tq = T_(q, {c.T, QW}), tk = T_(k, {c.T, KW}), tv = T_(v, {c.T, KW});
      Tensor tqn = T_(qn, {QW}), tkn = T_(kn, {KW});
      Tensor tpos = on_gpu ? ints_to_device(pos, {c.T}) : host_i32(pos, {c.T});
      KVCacheLayer kv{T_(kc, {blocks, bs, c.Hkv, c.D}), T_(vc, {blocks, bs, c.Hkv, c.D})};
      AttentionMeta m;
      m.num_tokens = c.T, m.block_size = bs;
      m.slot_mapping = on_gpu ? ints_to_device(slots, {c.T}) : host_i32(slots, {c.T});
      QkNormRopeArgs qa;
      qa.q = &tq, qa.k = &tk, qa.q_norm_weight = &tqn, qa.k_norm_weight = &tkn, qa.positions = &tpos;
      qa.rope = {c.D, c.rot, 5e6f};
      b.qk_norm_rope_write_kv(qa, tv, kv, m);
      return std::vector<std::vector<float>>{b.download_f32(tq), b.download_f32(tk), b.download_f32(kv.k),
                                             b.download_f32(kv.v)};
    };
    auto g = run(gpu(), true);
    auto r = run(*cpu, false);
    const char* names[4] = {"q", "k", "k cache", "v cache"};
    for (int i = 0; i < 4; ++i) EXPECT_LT(rel_err(g[i], r[i]), 1e-2) << names[i] << " fused " << fused;
  }
  gpu().tuning.fuse_qk_write_kv = true;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaQkNormRopeWriteKv,
                         ::testing::Values(QkCase{1, 48, 8, 128, 64},    // M2.5 decode: cluster of 8
                                           QkCase{3, 48, 8, 128, 64},    // a few tokens
                                           QkCase{5, 4, 2, 64, 32},      // fewer heads than slices
                                           QkCase{70, 48, 8, 128, 64}));  // one block per token

class CudaAddNormRoute : public ::testing::TestWithParam<int> {};

// add_rms_norm_route on the separate ops (norm kernel + router; the fused k_route_dense.cu
// kernel: test_cuda_dense.cpp) against the CPU. (The first fused norm + router kernel, the
// "fused" variant here, left the tree: docs/bench/cuda_switch_inventory.md.)
TEST_P(CudaAddNormRoute, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const int T = GetParam(), H = 3072, E = 64, K = 8;
  auto cpu = make_cpu_backend();
  std::mt19937 rng(T * 5 + 1);
  auto res = randn(size_t(T) * H, rng), dx = randn(size_t(T) * H, rng), nw = randn(H, rng, 0.5f);
  auto gate = randn(size_t(E) * H, rng, 0.02f, false), bias = randn(E, rng, 0.01f, false);
  gpu().tuning.route_norm_dense = false;  // the previous kernels (k_route_dense.cu: test_cuda_dense.cpp)
  {
    const int fused = 0;
    auto run = [&](Backend& b, bool on_gpu) {
      auto T_ = [&](const std::vector<float>& x, const Shape& s) {
        return on_gpu ? to_device(x, DType::BF16, s) : host_f32(x, s);
      };
      Tensor tres = T_(res, {T, H}), tdx = T_(dx, {T, H}), tnw = T_(nw, {H});
      Tensor out = on_gpu ? poisoned(T, H) : b.alloc(DType::F32, {T, H});
      MoeWeights m;
      m.gate = on_gpu ? to_device(gate, DType::F32, {E, H}) : host_f32(gate, {E, H});
      m.score_bias = on_gpu ? to_device(bias, DType::F32, {E}) : host_f32(bias, {E});
      m.num_experts = E, m.top_k = K;
      MoeRouting r{b.alloc(DType::I32, {T, K}), b.alloc(DType::F32, {T, K})};
      b.add_rms_norm_route(tres, tdx, tnw, 1e-6f, out, m, r);
      return std::vector<std::vector<float>>{b.download_f32(tres), b.download_f32(out), b.download_f32(r.expert_ids),
                                             b.download_f32(r.weights)};
    };
    auto g = run(gpu(), true);
    auto c = run(*cpu, false);
    EXPECT_LT(rel_err(g[0], c[0]), 1e-2) << "residual, fused " << fused;
    EXPECT_LT(rel_err(g[1], c[1]), 1e-2) << "normed, fused " << fused;
    // Router against the CPU router on the GPU's (bf16) normed rows: the chosen sets agree
    // except near-ties (at most one swap per token), and the weights where they agree.
    MoeWeights cm;
    cm.gate = host_f32(gate, {E, H}), cm.score_bias = host_f32(bias, {E}), cm.num_experts = E, cm.top_k = K;
    MoeRouting cr{cpu->alloc(DType::I32, {T, K}), cpu->alloc(DType::F32, {T, K})};
    cpu->moe_route(host_f32(g[1], {T, H}), cm, cr);
    auto cids = cpu->download_f32(cr.expert_ids), cw = cpu->download_f32(cr.weights);
    for (int t = 0; t < T; ++t) {
      int common = 0;
      for (int a = 0; a < K; ++a)
        for (int b = 0; b < K; ++b) common += g[2][size_t(t) * K + a] == cids[size_t(t) * K + b];
      EXPECT_GE(common, K - 1) << "token " << t << ", fused " << fused;
      if (common == K)
        for (int a = 0; a < K; ++a)
          if (g[2][size_t(t) * K + a] == cids[size_t(t) * K + a])
            EXPECT_NEAR(g[3][size_t(t) * K + a], cw[size_t(t) * K + a], 1e-4) << "token " << t;
    }
  }
  gpu().tuning.route_norm_dense = true;
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaAddNormRoute, ::testing::Values(1, 3, 6));

class CudaAddNormLinearMulti : public ::testing::TestWithParam<int> {};

// add_rms_norm_linear_multi on the separate ops (norm kernel + tensor-core GEMV; the dense
// kernel with the norm inside: test_cuda_dense.cpp) against host references. (The norm inside
// k_gemv_tc.cu's blocks, the "fused" variant here, left the tree.)
TEST_P(CudaAddNormLinearMulti, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const int T = GetParam(), K = 3072;
  const std::vector<int> widths = {768, 128, 144};
  std::mt19937 rng(T * 13 + 3);
  auto res = randn(size_t(T) * K, rng), dx = randn(size_t(T) * K, rng), nw = randn(K, rng, 0.5f);
  std::vector<HostWeight> w;
  for (int n : widths) w.push_back(make_weight(n, K, true, rng));
  // Host reference: residual rounded to bf16 (as stored), normed row rounded to bf16.
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
  const int saved_dense = gpu().tuning.gemv_dense_max_tokens;
  gpu().tuning.gemv_dense_max_tokens = 0;  // the previous kernels (k_gemv_dense.cu: test_cuda_dense.cpp)
  {
    const int fused = 0;
    Tensor tres = to_device(res, DType::BF16, {T, K}), tdx = to_device(dx, DType::BF16, {T, K});
    Tensor tnw = to_device(nw, DType::BF16, {K}), xn = poisoned(T, K);
    std::vector<Tensor> outs;
    for (int n : widths) outs.push_back(poisoned(T, n));
    const LinearWeight* ws[3] = {&w[0].dev, &w[1].dev, &w[2].dev};
    Tensor* os[3] = {&outs[0], &outs[1], &outs[2]};
    gpu().add_rms_norm_linear_multi(tres, tdx, tnw, 1e-6f, xn, ws, os, 3);
    EXPECT_LT(rel_err(gpu().download_f32(tres), r_ref), 1e-2) << "residual, fused " << fused;
    EXPECT_LT(rel_err(gpu().download_f32(xn), xn_ref), 1e-2) << "normed, fused " << fused;
    for (int i = 0; i < 3; ++i) {
      auto ref = ref_linear(xn_ref, w[i].deq, T, widths[i], K);
      EXPECT_LT(rel_err(gpu().download_f32(outs[i]), ref), 1e-2) << "output " << i << ", fused " << fused;
    }
  }
  gpu().tuning.gemv_dense_max_tokens = saved_dense;
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaAddNormLinearMulti, ::testing::Values(1, 3, 6));

}  // namespace
}  // namespace moeserve::test
