// Small prefill ops (pf_router): the split-bf16 router GEMM, the warp top-k, the fused add +
// RMSNorm + FP8 quantisation of the q/k/v input and the vectorised QK-norm + RoPE + KV write,
// against the f64 / CPU references and the kernels they replace.
//
// Router bounds. The split gate hi + lo is within 2^-17 |w| of w per weight, bf16 x bf16
// products are exact in f32, so |logit - ref| <= 2^-17 sum|x w| + the f32 accumulation error
// (tensor-core order; ~K 2^-24 sum|x w| worst case, far less for random signs). The tests
// print the measured maximum and require it below 2^-15 sum|x w| (a loose multiple of the
// bound). Selection: an expert may differ from the reference only where the reference's
// biased scores of the two experts are closer than twice the measured score error.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/linear/cublaslt.h"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/common/kernels_prefill.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

struct RouterCase {
  std::vector<float> x, gate, bias;  // x bf16-exact [T, H], gate f32 [E, H], bias [E]
  int T, H, E, K;
};
RouterCase make_router_case(int T, int H, int E, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  RouterCase c{randn(size_t(T) * H, rng), randn(size_t(E) * H, rng, 0.02f, false), randn(E, rng, 0.1f, false), T, H, E,
               K};
  return c;
}

// f64 logits of token t (all experts) and sum |x w| per expert.
void ref_logits(const RouterCase& c, int t, std::vector<double>& l, std::vector<double>& mag) {
  l.assign(c.E, 0.0);
  mag.assign(c.E, 0.0);
  const float* xr = &c.x[size_t(t) * c.H];
  for (int e = 0; e < c.E; ++e) {
    const float* wr = &c.gate[size_t(e) * c.H];
    double a = 0, m = 0;
    for (int h = 0; h < c.H; ++h) {
      a += double(xr[h]) * wr[h];
      m += std::fabs(double(xr[h]) * wr[h]);
    }
    l[e] = a, mag[e] = m;
  }
}

// Tokens checked against the f64 reference (every one up to 1000, every 4th beyond).
int token_step(int T) { return T > 1000 ? 4 : 1; }

// Logits of the split-bf16 GEMM ([T, 2E] halves summed) and of the f32 GEMM, vs f64.
struct LogitErr {
  double split_abs = 0, split_rel = 0, f32_abs = 0, f32_rel = 0;
};
LogitErr measure_logits(const RouterCase& c) {
  CudaBackend& b = gpu();
  Tensor dx = to_device(c.x, DType::BF16, {c.T, c.H});
  Tensor dxf = to_device(c.x, DType::F32, {c.T, c.H});
  Tensor dg = to_device(c.gate, DType::F32, {c.E, c.H});
  Tensor w2 = b.alloc(DType::BF16, {2 * c.E, c.H});
  Tensor l2 = b.alloc(DType::F32, {c.T, 2 * c.E}), l1 = b.alloc(DType::F32, {c.T, c.E});
  Tensor ws = b.alloc(DType::U8, {int64_t(cuda::LtGemm::kWorkspaceBytes)});
  cuda::LtGemm lt;
  cuda::launch_split_gate_bf16(dg.ptr<float>(), w2.data, c.E, c.H, b.stream());
  EXPECT_TRUE(lt.bf16_nt_f32(c.T, 2 * c.E, c.H, dx.data, w2.data, l2.ptr<float>(), ws.data, ws.nbytes(), b.stream(), false));
  EXPECT_TRUE(lt.f32_nt(c.T, c.E, c.H, dxf.ptr<float>(), dg.ptr<float>(), l1.ptr<float>(), ws.data, ws.nbytes(), b.stream(), false));
  const auto g2 = b.download_f32(l2), g1 = b.download_f32(l1);
  LogitErr r;
  std::vector<double> l, mag;
  for (int t = 0; t < c.T; t += token_step(c.T)) {
    ref_logits(c, t, l, mag);
    for (int e = 0; e < c.E; ++e) {
      const double s = double(g2[size_t(t) * 2 * c.E + e]) + g2[size_t(t) * 2 * c.E + c.E + e];
      const double f = g1[size_t(t) * c.E + e];
      r.split_abs = std::max(r.split_abs, std::fabs(s - l[e]));
      r.split_rel = std::max(r.split_rel, std::fabs(s - l[e]) / mag[e]);
      r.f32_abs = std::max(r.f32_abs, std::fabs(f - l[e]));
      r.f32_rel = std::max(r.f32_rel, std::fabs(f - l[e]) / mag[e]);
    }
  }
  return r;
}

// The case's router (f32 gate, score bias) on the device.
MoeWeights device_router(const RouterCase& c) {
  MoeWeights moe;
  moe.gate = to_device(c.gate, DType::F32, {c.E, c.H});
  moe.score_bias = to_device(c.bias, DType::F32, {c.E});
  moe.num_experts = c.E, moe.top_k = c.K;
  return moe;
}

// One moe_route on the test backend; the chosen ids and weights, downloaded.
void route_once(const Tensor& x, const MoeWeights& moe, std::vector<float>& ids, std::vector<float>& w) {
  MoeRouting r;
  gpu().moe_route(x, moe, r);
  ids = gpu().download_f32(r.expert_ids), w = gpu().download_f32(r.weights);
}

class CudaRouterPrefill : public ::testing::TestWithParam<int> {};

TEST_P(CudaRouterPrefill, SplitBf16MatchesReference) {
  SKIP_WITHOUT_GPU();
  const int T = GetParam(), H = 3072, E = 256, K = 8;
  const RouterCase c = make_router_case(T, H, E, K, 100 + T);
  const LogitErr le = measure_logits(c);
  std::printf("[router prefill] T=%d logits vs f64: split-bf16 max %.3e abs (%.3e of sum|xw|), f32 GEMM max %.3e abs "
              "(%.3e)\n",
              T, le.split_abs, le.split_rel, le.f32_abs, le.f32_rel);
  EXPECT_LT(le.split_rel, std::ldexp(1.0, -15));
  // Selection through the backend (default path: split-bf16 GEMM + warp top-k).
  CudaBackend& b = gpu();
  ASSERT_TRUE(b.tuning.router_split_bf16 && b.tuning.route_topk_warp != 0);
  const MoeWeights moe = device_router(c);
  MoeRouting r;
  b.moe_route(to_device(c.x, DType::BF16, {T, H}), moe, r);
  const auto ids = b.download_f32(r.expert_ids), w = b.download_f32(r.weights);
  // The CPU op (f32) on the same inputs.
  auto cpu = make_cpu_backend();
  MoeWeights hm;
  hm.gate = host_f32(c.gate, {E, H});
  hm.score_bias = host_f32(c.bias, {E});
  hm.num_experts = E, hm.top_k = K;
  MoeRouting hr;
  hr.expert_ids = Tensor::host(DType::I32, {T, K});
  hr.weights = Tensor::host(DType::F32, {T, K});
  cpu->moe_route(host_f32(c.x, {T, H}), hm, hr);
  const double tol = std::max(2 * 0.25 * le.split_abs, 1e-7);  // score error <= logit error / 4
  int diff_ref = 0, diff_cpu = 0, checked = 0;
  double min_gap_diff = INFINITY;
  std::vector<double> l, mag;
  for (int t = 0; t < T; t += token_step(T)) {
    ref_logits(c, t, l, mag);
    std::vector<double> s(E), cs(E);
    for (int e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-l[e])), cs[e] = s[e] + c.bias[e];
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b2) { return cs[a] > cs[b2]; });
    // Weights: the chosen experts' f64 scores renormalised over the chosen set (a near-tie
    // swap changes the set, hence every weight of the row).
    double sum = 0;
    for (int j = 0; j < K; ++j) sum += s[int(ids[size_t(t) * K + j])];
    for (int j = 0; j < K; ++j, ++checked) {
      const int got = int(ids[size_t(t) * K + j]);
      const int cg = hr.expert_ids.ptr<int32_t>()[size_t(t) * K + j];
      if (cg != got) ++diff_cpu;
      if (got != order[j]) {
        ++diff_ref;
        const double gap = std::fabs(cs[got] - cs[order[j]]);
        min_gap_diff = std::min(min_gap_diff, gap);
        EXPECT_LT(gap, tol) << "token " << t << " slot " << j << ": " << got << " vs " << order[j];
      }
      EXPECT_NEAR(w[size_t(t) * K + j], s[got] / sum, 1e-5) << "token " << t << " slot " << j;
    }
  }
  std::printf("[router prefill] T=%d: %d of %d slots differ from f64 (all at gaps < %.2e), %d from the CPU op\n", T,
              diff_ref, checked, tol, diff_cpu);
}
INSTANTIATE_TEST_SUITE_P(Tokens, CudaRouterPrefill, ::testing::Values(128, 1000, 8192));

// The previous prefill router (f32 GEMM + route_kernel) and the new one choose the same
// experts except where the f64 scores are closer than the two paths' error.
TEST(CudaRouterPrefill, SameAsF32Path) {
  SKIP_WITHOUT_GPU();
  const int T = 512, H = 3072, E = 256, K = 8;
  const RouterCase c = make_router_case(T, H, E, K, 7);
  CudaBackend& b = gpu();
  const MoeWeights moe = device_router(c);
  Tensor dx = to_device(c.x, DType::BF16, {T, H});
  std::vector<float> ids[2], w[2];
  for (int path = 0; path < 2; ++path) {
    b.tuning.router_split_bf16 = path == 0;
    b.tuning.route_topk_warp = path == 0 ? 2 : 0;
    route_once(dx, moe, ids[path], w[path]);
  }
  b.tuning.router_split_bf16 = true;
  b.tuning.route_topk_warp = 2;
  int diff = 0;
  std::vector<double> l, mag;
  for (int t = 0; t < T; ++t) {
    bool row_diff = false;
    for (int j = 0; j < K; ++j) row_diff |= ids[0][size_t(t) * K + j] != ids[1][size_t(t) * K + j];
    if (!row_diff) {
      for (int j = 0; j < K; ++j) EXPECT_NEAR(w[0][size_t(t) * K + j], w[1][size_t(t) * K + j], 1e-5);
      continue;
    }
    ++diff;
    ref_logits(c, t, l, mag);
    for (int j = 0; j < K; ++j) {
      const int a = int(ids[0][size_t(t) * K + j]), bb = int(ids[1][size_t(t) * K + j]);
      if (a == bb) continue;
      const double ca = 1.0 / (1.0 + std::exp(-l[a])) + c.bias[a], cb = 1.0 / (1.0 + std::exp(-l[bb])) + c.bias[bb];
      EXPECT_LT(std::fabs(ca - cb), 1e-5) << "token " << t << " slot " << j;
    }
  }
  std::printf("[router prefill] split-bf16 + warp top-k vs f32 GEMM + route_kernel: %d of %d tokens differ\n", diff, T);
}

// The gate split once per gate tensor (gate_split_cache) gives the same routing, bit for bit,
// as the split per call; a new gate (possibly at a freed gate's address) is split anew, and
// the splits of freed gates are dropped.
TEST(CudaRouterPrefill, GateSplitCacheSameAsPerCall) {
  SKIP_WITHOUT_GPU();
  const int T = 256, H = 3072, E = 256, K = 8;
  CudaBackend& b = gpu();
  ASSERT_TRUE(b.tuning.router_split_bf16);
  for (int round = 0; round < 3; ++round) {
    const RouterCase c = make_router_case(T, H, E, K, 300 + round);
    const MoeWeights moe = device_router(c);
    Tensor dx = to_device(c.x, DType::BF16, {T, H});
    std::vector<float> ids[3], w[3];
    for (int path = 0; path < 3; ++path) {  // per call, cache miss, cache hit
      b.tuning.gate_split_cache = path > 0;
      route_once(dx, moe, ids[path], w[path]);
    }
    b.tuning.gate_split_cache = true;
    for (int path = 1; path < 3; ++path) {
      EXPECT_EQ(ids[path], ids[0]) << "round " << round << " path " << path;
      EXPECT_EQ(0, std::memcmp(w[path].data(), w[0].data(), w[0].size() * 4)) << "round " << round << " path " << path;
    }
    EXPECT_EQ(b.gate_split_count(), 1u);  // the freed gates of earlier rounds and tests dropped at the miss
  }
}

// Warp top-k vs route_kernel on identical logits: same ids and weights bit for bit, including
// exact ties (lower id first), -inf / NaN logits, E not a multiple of 32, the split layout.
TEST(CudaRouterPrefill, WarpTopkSameAsRouteKernel) {
  SKIP_WITHOUT_GPU();
  CudaBackend& b = gpu();
  for (const auto& [T, E, K, split] : {std::tuple{300, 256, 8, false}, std::tuple{77, 200, 6, true},
                                       std::tuple{64, 64, 32, false}, std::tuple{33, 256, 8, true}}) {
    std::mt19937 rng(T + E);
    const int ld = split ? 2 * E : E;
    auto lg = randn(size_t(T) * ld, rng, 2.f, false);
    for (int t = 0; t < T; t += 5)  // ties: a token of equal logits, one with a repeated value
      for (int e = 0; e < ld; ++e) lg[size_t(t) * ld + e] = t % 10 == 0 ? 0.25f : (e % 3 ? lg[size_t(t) * ld + e] : 1.f);
    lg[size_t(1) * ld + 3] = -INFINITY;
    lg[size_t(2) * ld + 4] = NAN;
    auto bias = randn(E, rng, 0.1f, false);
    Tensor dl = to_device(lg, DType::F32, {T, ld}), db = to_device(bias, DType::F32, {E});
    std::vector<float> ids[3], w[3];
    for (int k = 0; k < 3; ++k) {  // 0: route_kernel, 1: shuffle rounds, 2: redux rounds
      Tensor di = b.alloc(DType::I32, {T, K}), dw = b.alloc(DType::F32, {T, K});
      cuda::RouteParams p;
      p.T = T, p.E = E, p.top_k = K, p.bias = db.ptr<float>();
      p.logits = dl.ptr<float>(), p.logits_split = split;
      p.ids = di.ptr<int32_t>(), p.weights = dw.ptr<float>();
      p.topk_warp = k;
      cuda::launch_moe_route_topk(p, b.stream());
      ids[k] = b.download_f32(di), w[k] = b.download_f32(dw);
    }
    b.tuning.route_topk_warp = 2;
    for (int k = 1; k < 3; ++k) {
      int bad = 0;
      for (size_t i = 0; i < ids[0].size(); ++i)
        bad += ids[0][i] != ids[k][i] || std::memcmp(&w[0][i], &w[k][i], 4) != 0;
      EXPECT_EQ(bad, 0) << "variant " << k << " T=" << T << " E=" << E << " K=" << K << " split=" << split;
    }
  }
}

// Fused (add +) RMSNorm + FP8 quantisation vs launch_rms_norm + launch_quant_fp8: bit-identical
// residual, normed output, e4m3 values and scales, in both scale layouts.
TEST(CudaNormQuant, SameAsUnfused) {
  SKIP_WITHOUT_GPU();
  CudaBackend& b = gpu();
  for (const auto& [R, K, with_res, kmajor] : {std::tuple{37, 3072, true, false}, std::tuple{64, 3072, false, true},
                                              std::tuple{9, 384, true, true}, std::tuple{200, 4096, true, false}}) {
    std::mt19937 rng(R * 31 + K);
    auto x = randn(size_t(R) * K, rng, 2.f), res = randn(size_t(R) * K, rng), nw = randn(K, rng, 0.5f);
    for (int i = 0; i < 128; ++i) x[size_t(2) * K + i] = 0.f, res[size_t(2) * K + i] = 0.f;  // a zero group
    const int G = K / 128;
    const int64_t s_row = kmajor ? G : 1, s_grp = kmajor ? 1 : R;
    std::vector<uint8_t> q[2];
    std::vector<float> s[2], o[2], rs[2];
    for (int path = 0; path < 2; ++path) {
      Tensor dx = to_device(x, DType::BF16, {R, K}), dr = to_device(res, DType::BF16, {R, K});
      Tensor dw = to_device(nw, DType::BF16, {K}), dout = b.alloc(DType::BF16, {R, K});
      Tensor dq = b.alloc(DType::F8_E4M3, {R, K}), ds = b.alloc(DType::F32, {R * G});
      if (path == 0) {
        cuda::NormQuantParams p;
        p.x = dx.data, p.residual = with_res ? dr.data : nullptr, p.w = dw.data, p.out = dout.data;
        p.q = static_cast<uint8_t*>(dq.data), p.s = ds.ptr<float>(), p.s_row = s_row, p.s_grp = s_grp;
        p.R = R, p.K = K, p.eps = 1e-6f;
        ASSERT_TRUE(cuda::norm_quant_supported(p));
        cuda::launch_norm_quant_fp8(p, b.stream());
      } else {
        cuda::RmsNormParams n;
        n.x = dx.data, n.residual = with_res ? dr.data : nullptr, n.weight = dw.data, n.out = dout.data;
        n.rows = R, n.cols = K, n.eps = 1e-6f;
        cuda::launch_rms_norm(n, b.stream());
        cuda::QuantParams qp;
        qp.x = dout.data, qp.ldx = K, qp.R = R, qp.K = K, qp.q = static_cast<uint8_t*>(dq.data), qp.s = ds.ptr<float>();
        qp.s_row = s_row, qp.s_grp = s_grp;
        cuda::launch_quant_fp8(qp, b.stream());
      }
      q[path].resize(size_t(R) * K);
      b.synchronize();
      cudaMemcpy(q[path].data(), dq.data, q[path].size(), cudaMemcpyDeviceToHost);
      s[path] = b.download_f32(ds), o[path] = b.download_f32(dout), rs[path] = b.download_f32(dr);
    }
    EXPECT_EQ(q[0], q[1]) << R << "x" << K;
    EXPECT_EQ(0, std::memcmp(s[0].data(), s[1].data(), s[0].size() * 4)) << R << "x" << K;
    EXPECT_EQ(0, std::memcmp(o[0].data(), o[1].data(), o[0].size() * 4)) << R << "x" << K;
    EXPECT_EQ(0, std::memcmp(rs[0].data(), rs[1].data(), rs[0].size() * 4)) << R << "x" << K;
  }
}

// add_rms_norm_linear_multi / linear_multi at prefill sizes: one fused norm + quantisation
// shared by q/k/v equals the unfused path (norm kernel, one quantisation per weight) bit for bit.
TEST(CudaNormQuant, NormLinearMultiSameAsUnfused) {
  SKIP_WITHOUT_GPU();
  CudaBackend& b = gpu();
  const int T = 256, K = 3072;
  const int Ns[3] = {1536, 256, 256};
  std::mt19937 rng(3);
  std::vector<HostWeight> w;
  for (int N : Ns) w.push_back(make_weight(N, K, true, rng));
  const LinearWeight* ws[3] = {&w[0].dev, &w[1].dev, &w[2].dev};
  auto x = randn(size_t(T) * K, rng), res = randn(size_t(T) * K, rng), nw = randn(K, rng, 0.5f);
  Tensor dw = to_device(nw, DType::BF16, {K});
  for (int norm = 0; norm < 2; ++norm) {
    std::vector<float> got[2][4];
    for (int path = 0; path < 2; ++path) {
      b.tuning.prefill_norm_quant = path == 0;
      Tensor dx = to_device(x, DType::BF16, {T, K}), dr = to_device(res, DType::BF16, {T, K});
      Tensor out = b.alloc(DType::BF16, {T, K});
      Tensor o[3] = {b.alloc(DType::BF16, {T, Ns[0]}), b.alloc(DType::BF16, {T, Ns[1]}), b.alloc(DType::BF16, {T, Ns[2]})};
      Tensor* outs[3] = {&o[0], &o[1], &o[2]};
      if (norm)
        b.add_rms_norm_linear_multi(dr, dx, dw, 1e-6f, out, ws, outs, 3);
      else
        b.linear_multi(dx, ws, outs, 3);
      for (int i = 0; i < 3; ++i) got[path][i] = b.download_f32(o[i]);
      got[path][3] = b.download_f32(norm ? out : dx);
    }
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(0, std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * 4)) << "norm " << norm << " out " << i;
    // And within the FP8 bound of the exact linear of the (normed) input.
    const auto ref = ref_linear(got[0][3], w[0].deq, T, Ns[0], K);
    EXPECT_LT(rel_err(got[0][0], ref), 0.0725);
  }
  b.tuning.prefill_norm_quant = true;
}

// Vectorised prefill QK-norm + RoPE + KV write vs the generic kernel (same launcher, switch
// off): outputs within one bf16 rounding step (the row sums are added in another order), the
// cache rows equal to the returned k rows, and both within the host reference's bound.
TEST(CudaQkRopePrefill, SameAsGenericKernel) {
  SKIP_WITHOUT_GPU();
  CudaBackend& b = gpu();
  struct C {
    int T, Hq, Hkv, D, rot;
    bool sums;
  };
  for (const C c : {C{600, 48, 8, 128, 64, false}, C{520, 6, 2, 64, 32, true}, C{512, 8, 4, 128, 128, false}}) {
    ASSERT_GE(c.T, cuda::kQkRopeVecMinTokens);
    std::mt19937 rng(c.T + c.D);
    const int Wq = c.Hq * c.D, Wk = c.Hkv * c.D, slots = c.T + 50;
    auto q = randn(size_t(c.T) * Wq, rng), k = randn(size_t(c.T) * Wk, rng), v = randn(size_t(c.T) * Wk, rng);
    auto wq = randn(Wq, rng, 0.5f), wk = randn(Wk, rng, 0.5f);
    std::vector<float> pos(c.T), slot(c.T), qs(c.T, float(Wq) * 2.6f), ks(c.T, float(Wk) * 1.4f);
    for (int t = 0; t < c.T; ++t) pos[t] = float(rng() % 8192), slot[t] = t % 7 == 3 ? -1.f : float((t * 37) % slots);
    Tensor dwq = to_device(wq, DType::BF16, {Wq}), dwk = to_device(wk, DType::BF16, {Wk});
    Tensor dpos = to_device(pos, DType::I32, {c.T}), dslot = to_device(slot, DType::I32, {c.T});
    Tensor dqs = to_device(qs, DType::F32, {c.T}), dks = to_device(ks, DType::F32, {c.T});
    Tensor dv = to_device(v, DType::BF16, {c.T, Wk});
    std::vector<float> gq[2], gk[2], gkc[2], gvc[2];
    for (int path = 0; path < 2; ++path) {
      Tensor dq = to_device(q, DType::BF16, {c.T, Wq}), dk = to_device(k, DType::BF16, {c.T, Wk});
      Tensor kc = b.alloc(DType::BF16, {slots, Wk}), vc = b.alloc(DType::BF16, {slots, Wk});
      cuda::QkNormRopeParams p;
      p.q = dq.data, p.k = dk.data, p.q_w = dwq.data, p.k_w = dwk.data, p.positions = dpos.ptr<int32_t>();
      p.T = c.T, p.q_width = Wq, p.k_width = Wk, p.q_full = c.sums ? 2 * Wq : Wq, p.k_full = c.sums ? 2 * Wk : Wk;
      p.q_sumsq = c.sums ? dqs.ptr<float>() : nullptr, p.k_sumsq = c.sums ? dks.ptr<float>() : nullptr;
      p.head_dim = c.D, p.rotary_dim = c.rot, p.theta = 5e6f, p.eps = 1e-6f;
      p.v = dv.data, p.kc = kc.data, p.vc = vc.data, p.slots = dslot.ptr<int32_t>(), p.num_slots = slots;
      p.rope_vec = path == 0;
      ASSERT_EQ(cuda::qk_rope_vec_supported(p), path == 0);
      cuda::launch_qk_norm_rope(p, b.stream());
      gq[path] = b.download_f32(dq), gk[path] = b.download_f32(dk);
      gkc[path] = b.download_f32(kc), gvc[path] = b.download_f32(vc);
    }
    b.tuning.qk_rope_vec = true;
    auto close = [](const std::vector<float>& a, const std::vector<float>& r, const char* what) {
      int off = 0;
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != r[i]) {
          ++off;
          EXPECT_LE(std::fabs(a[i] - r[i]), std::ldexp(std::fabs(r[i]), -7) + 1e-30) << what << " " << i;
        }
      std::printf("[qk rope prefill] %s: %d of %zu elements differ by one bf16 step\n", what, off, a.size());
      EXPECT_LT(off, int(a.size() / 100) + 1) << what;
    };
    close(gq[0], gq[1], "q");
    close(gk[0], gk[1], "k");
    close(gkc[0], gkc[1], "k cache");
    EXPECT_EQ(gvc[0], gvc[1]);
    for (int t = 0; t < c.T; ++t) {
      if (slot[t] < 0) continue;
      for (int i = 0; i < Wk; ++i) ASSERT_EQ(gkc[0][size_t(slot[t]) * Wk + i], gk[0][size_t(t) * Wk + i]);
    }
  }
}

// The 16-byte-load quantiser vs launch_quant_fp8: same bits, both scale layouts, a strided x.
TEST(CudaNormQuant, QuantVecSameAsQuant) {
  SKIP_WITHOUT_GPU();
  CudaBackend& b = gpu();
  for (const auto& [R, K, ldx, kmajor] : {std::tuple{37, 6144, 6144, false}, std::tuple{300, 3072, 3200, true},
                                         std::tuple{5, 128, 136, false}, std::tuple{16, 8192, 8192, true},
                                         std::tuple{1000, 1536, 1536, true}}) {  // the experts' intermediate (row-major scales)
    std::mt19937 rng(R + K);
    auto x = randn(size_t(R) * ldx, rng, 3.f);
    for (int i = 0; i < 128; ++i) x[size_t(R / 2) * ldx + i] = 0.f;  // a zero group
    Tensor dx = to_device(x, DType::BF16, {R, ldx});
    const int G = K / 128;
    std::vector<uint8_t> q[2];
    std::vector<float> s[2];
    for (int path = 0; path < 2; ++path) {  // vec (1 row / block; 2 rows left the tree), k_quant.cu
      Tensor dq = b.alloc(DType::F8_E4M3, {R, K}), ds = b.alloc(DType::F32, {R * G});
      cuda::QuantParams p;
      p.x = dx.data, p.ldx = ldx, p.R = R, p.K = K, p.q = static_cast<uint8_t*>(dq.data), p.s = ds.ptr<float>();
      p.s_row = kmajor ? G : 1, p.s_grp = kmajor ? 1 : R;
      if (path == 0) {
        ASSERT_TRUE(cuda::quant_vec_supported(p));
        cuda::launch_quant_fp8_vec(p, b.stream());
      } else {
        cuda::launch_quant_fp8(p, b.stream());
      }
      q[path].resize(size_t(R) * K);
      b.synchronize();
      cudaMemcpy(q[path].data(), dq.data, q[path].size(), cudaMemcpyDeviceToHost);
      s[path] = b.download_f32(ds);
    }
    EXPECT_EQ(q[0], q[1]) << R << "x" << K;
    EXPECT_EQ(0, std::memcmp(s[0].data(), s[1].data(), s[0].size() * 4)) << R << "x" << K;
  }
}

// Timings of the ops above at M2.5 shapes and 8,192 tokens, previous path vs new (run with
// MOESERVE_BENCH=1; otherwise skipped). Medians of 7 event-timed runs after a warm-up.
double med_ms(const std::function<void()>& f) { return event_median_ms(f, 7); }

TEST(CudaSmallPrefillBench, M25Ops8k) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_BENCH")) GTEST_SKIP() << "set MOESERVE_BENCH=1";
  CudaBackend& b = gpu();
  const int T = 8192, H = 3072, E = 256, K = 8, QW = 6144, KW = 1024;
  Tensor x = b.alloc(DType::BF16, {T, H}), res = b.alloc(DType::BF16, {T, H}), xn = b.alloc(DType::BF16, {T, H});
  Tensor nw = b.alloc(DType::BF16, {H});
  b.fill_random(x, 1, 1.f);
  b.fill_random(res, 2, 1.f);
  b.fill_random(nw, 3, 1.f);
  auto pr = [](const char* what, double old_ms, double new_ms) {
    std::printf("[small bench] %-34s old %.4f ms  new %.4f ms  (x30 layers: %.2f -> %.2f ms)\n", what, old_ms, new_ms,
                30 * old_ms, 30 * new_ms);
  };
  // Norms and quantisation alone.
  {
    const double norm = med_ms([&] { b.add_rms_norm(res, x, nw, 1e-6f, xn); });
    Tensor q = b.alloc(DType::F8_E4M3, {T, QW}), sc = b.alloc(DType::F32, {T * (QW / 128)});
    cuda::QuantParams qp;
    qp.x = xn.data, qp.ldx = H, qp.R = T, qp.K = H, qp.q = static_cast<uint8_t*>(q.data), qp.s = sc.ptr<float>();
    qp.s_row = 1, qp.s_grp = T;
    const double quant = med_ms([&] { cuda::launch_quant_fp8(qp, b.stream()); });
    cuda::NormQuantParams nq;
    nq.x = x.data, nq.residual = res.data, nq.w = nw.data, nq.out = xn.data, nq.q = qp.q, nq.s = qp.s;
    nq.s_row = 1, nq.s_grp = T, nq.R = T, nq.K = H;
    const double fused = med_ms([&] { cuda::launch_norm_quant_fp8(nq, b.stream()); });
    pr("add_rms_norm + 3 x quant | fused", norm + 3 * quant, fused);
    Tensor att = b.alloc(DType::BF16, {T, QW});
    qp.x = att.data, qp.ldx = QW, qp.K = QW;
    const double oq = med_ms([&] { cuda::launch_quant_fp8(qp, b.stream()); });
    const double oqv = med_ms([&] { cuda::launch_quant_fp8_vec(qp, b.stream()); });
    qp.x = xn.data, qp.ldx = H, qp.K = H;
    const double qv = med_ms([&] { cuda::launch_quant_fp8_vec(qp, b.stream()); });
    std::printf("[small bench] add_rms_norm %.4f ms, quant [T,3072] %.4f ms (vec %.4f), quant [T,6144] (o_proj input) "
                "%.4f ms (vec %.4f)\n",
                norm, quant, qv, oq, oqv);
  }
  // Router: logits + top-k.
  {
    MoeWeights moe;
    moe.gate = b.alloc(DType::F32, {E, H});
    moe.score_bias = b.alloc(DType::F32, {E});
    b.fill_random(moe.gate, 21, 0.02f);
    b.fill_random(moe.score_bias, 22, 0.1f);
    moe.num_experts = E, moe.top_k = K;
    MoeRouting r{b.alloc(DType::I32, {T, K}), b.alloc(DType::F32, {T, K})};
    b.tuning.router_split_bf16 = false;
    b.tuning.route_topk_warp = 0;
    const double old_ms = med_ms([&] { b.moe_route(xn, moe, r); });
    b.tuning.router_split_bf16 = true;
    b.tuning.route_topk_warp = 2;
    const double new_ms = med_ms([&] { b.moe_route(xn, moe, r); });
    pr("router (f32 GEMM+topk | split+warp)", old_ms, new_ms);
    Tensor l2 = b.alloc(DType::F32, {T, 2 * E}), w2 = b.alloc(DType::BF16, {2 * E, H});
    Tensor ws = b.alloc(DType::U8, {int64_t(cuda::LtGemm::kWorkspaceBytes)});
    cuda::LtGemm lt;
    const double split = med_ms([&] { cuda::launch_split_gate_bf16(moe.gate.ptr<float>(), w2.data, E, H, b.stream()); });
    const double gemm = med_ms([&] { lt.bf16_nt_f32(T, 2 * E, H, xn.data, w2.data, l2.ptr<float>(), ws.data, ws.nbytes(), b.stream(), false); });
    cuda::RouteParams p;
    p.T = T, p.E = E, p.top_k = K, p.bias = moe.score_bias.ptr<float>(), p.logits = l2.ptr<float>(), p.logits_split = true;
    p.ids = r.expert_ids.ptr<int32_t>(), p.weights = r.weights.ptr<float>();
    double tk[3];
    for (int k = 0; k < 3; ++k) {
      p.topk_warp = k;
      tk[k] = med_ms([&] { cuda::launch_moe_route_topk(p, b.stream()); });
    }
    b.tuning.route_topk_warp = 2;
    std::printf("[small bench] router parts: gate split %.4f ms, bf16 GEMM [%d,%d]x[%d,%d]^T %.4f ms (%.0f TF/s), "
                "top-k route_kernel %.4f ms, warp shuffle %.4f ms, warp redux %.4f ms\n",
                split, T, H, 2 * E, H, gemm, 2.0 * T * 2 * E * H / gemm / 1e9, tk[0], tk[1], tk[2]);
  }
  // q/k/v with their input norm.
  {
    LinearWeight wq = rand_fp8(QW, H, 31), wk = rand_fp8(KW, H, 33), wv = rand_fp8(KW, H, 35);
    const LinearWeight* ws[3] = {&wq, &wk, &wv};
    Tensor q = b.alloc(DType::BF16, {T, QW}), k = b.alloc(DType::BF16, {T, KW}), v = b.alloc(DType::BF16, {T, KW});
    Tensor* outs[3] = {&q, &k, &v};
    b.tuning.prefill_norm_quant = false;
    const double old_ms = med_ms([&] { b.add_rms_norm_linear_multi(res, x, nw, 1e-6f, xn, ws, outs, 3); });
    b.tuning.prefill_norm_quant = true;
    const double new_ms = med_ms([&] { b.add_rms_norm_linear_multi(res, x, nw, 1e-6f, xn, ws, outs, 3); });
    pr("norm + q/k/v (unfused | fused)", old_ms, new_ms);
    double g[3];
    for (int i = 0; i < 3; ++i) g[i] = med_ms([&] { b.linear(xn, *ws[i], *outs[i]); });
    std::printf("[small bench] linear() incl. quant: q %.4f ms, k %.4f, v %.4f\n", g[0], g[1], g[2]);
    // QK-norm + RoPE + KV write.
    const int bs = 16, nb = T / bs;
    KVCacheLayer kv{b.alloc(DType::BF16, {nb, bs, 8, 128}), b.alloc(DType::BF16, {nb, bs, 8, 128})};
    std::vector<float> pos(T);
    std::iota(pos.begin(), pos.end(), 0.f);
    Tensor dpos = to_device(pos, DType::I32, {T}), slots = to_device(pos, DType::I32, {T});
    Tensor qn = b.alloc(DType::BF16, {QW}), kn = b.alloc(DType::BF16, {KW});
    b.fill_random(qn, 41, 1.f);
    b.fill_random(kn, 42, 1.f);
    QkNormRopeArgs a;
    a.q = &q, a.k = &k, a.q_norm_weight = &qn, a.k_norm_weight = &kn, a.positions = &dpos;
    a.rope = {128, 64, 5e6f};
    AttentionMeta m;
    m.slot_mapping = slots;
    b.tuning.qk_rope_vec = false;
    const double qk_old = med_ms([&] { b.qk_norm_rope_write_kv(a, v, kv, m); });
    b.tuning.qk_rope_vec = true;
    const double qk_new = med_ms([&] { b.qk_norm_rope_write_kv(a, v, kv, m); });
    pr("qk-norm + RoPE + KV write", qk_old, qk_new);
    // o_proj (quant + GEMM) for reference.
    LinearWeight wo = rand_fp8(H, QW, 51);
    Tensor o = b.alloc(DType::BF16, {T, H});
    b.tuning.prefill_quant_vec = false;
    const double op_old = med_ms([&] { b.linear(q, wo, o); });
    b.tuning.prefill_quant_vec = true;
    const double op = med_ms([&] { b.linear(q, wo, o); });
    pr("o_proj incl. quant (k_quant | vec)", op_old, op);
  }
}

}  // namespace
}  // namespace moeserve::test
