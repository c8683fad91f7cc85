// The op specs of backend/op_specs.h on the CPU reference backend, each against a direct
// double-precision computation written here: routing (softmax / sigmoid, bias, grouped top-k,
// renormalisation, scaling), QK-norm modes, RoPE styles and scalings, silu_mul / dense_mlp,
// and attention with a V head dim different from K's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"

namespace moeserve {
namespace {

using testing::f32_tensor;
using testing::i32_tensor;
using testing::randn;

struct RouteRef {
  std::vector<int> ids;
  std::vector<double> w;
};

// Direct routing reference of one token.
RouteRef route_ref(const std::vector<double>& logits, const std::vector<double>& bias, const RoutingSpec& s, int K) {
  const int E = int(logits.size());
  std::vector<double> sc(E), choice(E);
  if (s.scoring == RouteScoring::Softmax) {
    double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
    for (int i = 0; i < E; ++i) z += std::exp(logits[i] - mx);
    for (int i = 0; i < E; ++i) sc[i] = std::exp(logits[i] - mx) / z;
  } else {
    for (int i = 0; i < E; ++i) sc[i] = 1 / (1 + std::exp(-logits[i]));
  }
  for (int i = 0; i < E; ++i) choice[i] = sc[i] + (bias.empty() ? 0 : bias[i]);
  std::vector<char> allowed(E, 1);
  if (s.n_group > 1) {
    const int per = E / s.n_group;
    std::vector<std::pair<double, int>> gs;
    for (int g = 0; g < s.n_group; ++g) {
      std::vector<double> c(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(c.rbegin(), c.rend());
      gs.push_back({bias.empty() ? c[0] : c[0] + c[1], -g});
    }
    std::sort(gs.rbegin(), gs.rend());
    std::fill(allowed.begin(), allowed.end(), 0);
    for (int r = 0; r < s.topk_group; ++r)
      for (int i = 0; i < per; ++i) allowed[-gs[r].second * per + i] = 1;
  }
  std::vector<int> order;
  for (int i = 0; i < E; ++i)
    if (allowed[i]) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
  RouteRef r;
  double sum = 0;
  for (int k = 0; k < K; ++k) r.ids.push_back(order[k]), sum += sc[order[k]];
  for (int k = 0; k < K; ++k) r.w.push_back(sc[r.ids[k]] / (s.renormalize ? sum : 1.0) * s.routed_scaling_factor);
  return r;
}

void check_routing(const RoutingSpec& spec, bool bias, int E, int K) {
  auto be = make_cpu_backend();
  std::mt19937 rng(7 + E + K + int(spec.scoring) * 13 + spec.n_group);
  const int T = 9, H = 24;
  const auto x = randn(rng, size_t(T * H)), g = randn(rng, size_t(E * H), 0.5f), b = randn(rng, size_t(E), 0.2f);
  MoeWeights moe;
  moe.gate = f32_tensor(g, {E, H});
  if (bias) moe.score_bias = f32_tensor(b, {E});
  moe.num_experts = E;
  moe.top_k = K;
  moe.route = spec;
  MoeRouting out{be->alloc(DType::I32, {T, K}), be->alloc(DType::F32, {T, K})};
  be->moe_route(f32_tensor(x, {T, H}), moe, out);
  for (int t = 0; t < T; ++t) {
    std::vector<double> lg(E), bv;
    for (int e = 0; e < E; ++e) {
      double a = 0;
      for (int h = 0; h < H; ++h) a += double(x[size_t(t * H + h)]) * g[size_t(e * H + h)];
      lg[e] = a;
    }
    if (bias) bv.assign(b.begin(), b.end());
    const RouteRef r = route_ref(lg, bv, spec, K);
    for (int k = 0; k < K; ++k) {
      EXPECT_EQ(out.expert_ids.ptr<int32_t>()[t * K + k], r.ids[k]) << "token " << t << " k " << k;
      EXPECT_NEAR(out.weights.ptr<float>()[t * K + k], r.w[k], 1e-5) << "token " << t << " k " << k;
    }
  }
}

TEST(CpuOpSpecs, SoftmaxRoutingRenormalisedOrNot) {
  check_routing(RoutingSpec{RouteScoring::Softmax, 1, 1, true, 1.f}, false, 16, 4);   // Qwen3 norm_topk_prob
  check_routing(RoutingSpec{RouteScoring::Softmax, 1, 1, false, 1.f}, false, 16, 4);  // Qwen3 default
}

TEST(CpuOpSpecs, SigmoidBiasGroupedScaled) {
  check_routing(RoutingSpec{RouteScoring::Sigmoid, 1, 1, true, 1.f}, true, 12, 3);   // MiniMax-M2
  check_routing(RoutingSpec{RouteScoring::Sigmoid, 4, 2, true, 2.5f}, true, 16, 4);  // DeepSeek-V3 style
  check_routing(RoutingSpec{RouteScoring::Softmax, 4, 2, false, 1.f}, false, 16, 3);  // grouped, no bias
}

TEST(CpuOpSpecs, GroupedRoutingRejectsBadGroups) {
  auto be = make_cpu_backend();
  MoeWeights moe;
  moe.gate = f32_tensor(std::vector<float>(10 * 4, 0.1f), {10, 4});
  moe.num_experts = 10, moe.top_k = 2;
  moe.route = RoutingSpec{RouteScoring::Sigmoid, 4, 2, true, 1.f};  // 10 experts in 4 groups
  MoeRouting out{be->alloc(DType::I32, {1, 2}), be->alloc(DType::F32, {1, 2})};
  EXPECT_THROW(be->moe_route(f32_tensor(std::vector<float>(4, 1.f), {1, 4}), moe, out), Error);
}

// Reference q/k norm + RoPE of one row of `heads` heads.
std::vector<double> norm_rope_ref(const std::vector<float>& row, const std::vector<float>& w, QkNormMode mode,
                                  const RopeSpec& r, int pos, float eps) {
  const int D = r.head_dim, W = int(row.size());
  std::vector<double> x(row.begin(), row.end());
  if (mode == QkNormMode::FullWidth) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1 / std::sqrt(ss / W + eps);
    for (int j = 0; j < W; ++j) x[j] = x[j] * inv * w[j];
  } else if (mode == QkNormMode::PerHead) {
    for (int h = 0; h < W / D; ++h) {
      double ss = 0;
      for (int j = 0; j < D; ++j) ss += x[h * D + j] * x[h * D + j];
      const double inv = 1 / std::sqrt(ss / D + eps);
      for (int j = 0; j < D; ++j) x[h * D + j] = x[h * D + j] * inv * w[j];
    }
  }
  std::vector<double> out = x;
  const int rd = r.rotary_dim;
  for (int h = 0; h < W / D; ++h)
    for (int i = 0; i < rd / 2; ++i) {
      double f = std::pow(double(r.theta), -2.0 * i / rd);
      if (r.scaling == RopeScaling::Linear) f /= r.factor;
      const double a = pos * f;
      const double c = std::cos(a), s = std::sin(a);
      const int j0 = r.style == RopeStyle::NeoX ? i : 2 * i, j1 = r.style == RopeStyle::NeoX ? i + rd / 2 : 2 * i + 1;
      out[h * D + j0] = x[h * D + j0] * c - x[h * D + j1] * s;
      out[h * D + j1] = x[h * D + j1] * c + x[h * D + j0] * s;
    }
  return out;
}

void check_qk(QkNormMode mode, RopeSpec rope) {
  auto be = make_cpu_backend();
  std::mt19937 rng(3 + int(mode) * 7 + int(rope.style) * 3 + int(rope.scaling));
  const int T = 5, Hq = 4, Hkv = 2, D = rope.head_dim;
  auto qv = randn(rng, size_t(T * Hq * D)), kv = randn(rng, size_t(T * Hkv * D));
  const int wq = mode == QkNormMode::PerHead ? D : Hq * D, wk = mode == QkNormMode::PerHead ? D : Hkv * D;
  auto qw = randn(rng, size_t(wq), 0.2f), kw = randn(rng, size_t(wk), 0.2f);
  for (auto& v : qw) v += 1.f;
  for (auto& v : kw) v += 1.f;
  Tensor q = f32_tensor(qv, {T, Hq * D}), k = f32_tensor(kv, {T, Hkv * D});
  Tensor qn = f32_tensor(qw, {wq}), kn = f32_tensor(kw, {wk});
  std::vector<int32_t> pos{0, 3, 17, 100, 1000};
  Tensor p = i32_tensor(pos, {T});
  QkNormRopeArgs a;
  a.q = &q, a.k = &k, a.q_norm_weight = &qn, a.k_norm_weight = &kn, a.positions = &p;
  a.rope = rope, a.norm = mode, a.eps = 1e-6f;
  be->qk_norm_rope(a);
  double max_err = 0;
  for (int t = 0; t < T; ++t) {
    auto rq = norm_rope_ref({qv.begin() + t * Hq * D, qv.begin() + (t + 1) * Hq * D}, qw, mode, rope, pos[t], 1e-6f);
    auto rk = norm_rope_ref({kv.begin() + t * Hkv * D, kv.begin() + (t + 1) * Hkv * D}, kw, mode, rope, pos[t], 1e-6f);
    for (int j = 0; j < Hq * D; ++j) max_err = std::max(max_err, std::fabs(q.ptr<float>()[t * Hq * D + j] - rq[j]));
    for (int j = 0; j < Hkv * D; ++j) max_err = std::max(max_err, std::fabs(k.ptr<float>()[t * Hkv * D + j] - rk[j]));
  }
  // Angles up to 1000 rad in float32 (as HF computes them): ~1e-4 absolute in cos/sin.
  EXPECT_LT(max_err, 2e-3) << "mode " << int(mode) << " style " << int(rope.style);
}

TEST(CpuOpSpecs, QkNormModesAndRopeStyles) {
  check_qk(QkNormMode::PerHead, RopeSpec{16, 16, 1e6f});                     // Qwen3
  check_qk(QkNormMode::FullWidth, RopeSpec{16, 8, 5e6f});                    // MiniMax-M2 partial
  check_qk(QkNormMode::None, RopeSpec{16, 16, 1e4f, RopeStyle::GptJ});       // interleaved pairs
  check_qk(QkNormMode::PerHead, RopeSpec{16, 12, 1e4f, RopeStyle::GptJ});    // partial GPT-J
  RopeSpec lin{16, 16, 1e4f};
  lin.scaling = RopeScaling::Linear, lin.factor = 4.f;
  check_qk(QkNormMode::PerHead, lin);
}

// YaRN: inv_freq blends the interpolated and extrapolated frequencies (HF's formula), cos/sin
// scaled by attention_factor. Checked on the frequency function and on the op.
TEST(CpuOpSpecs, YarnFrequenciesAndAttentionFactor) {
  RopeSpec r{64, 64, 10000.f};
  r.scaling = RopeScaling::Yarn, r.factor = 4.f, r.original_max_position = 4096;
  r.attention_factor = yarn_attention_factor(4.0, 0, 0);
  EXPECT_NEAR(r.attention_factor, 0.1 * std::log(4.0) + 1, 1e-6);
  // HF: low = floor(64 ln(4096 / (32 2pi)) / (2 ln 1e4)) = floor(10.47) = 10, high = ceil(64 ln(4096/(2pi)) /
  // (2 ln 1e4)) = ceil(22.51) = 23; ramp(i) = (i - 10) / 13 clamped; extrapolation weight 1 - ramp.
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(10000.0, -2.0 * i / 64);
    const double ramp = std::clamp((i - 10.0) / 13.0, 0.0, 1.0);
    const double want = base / 4 * ramp + base * (1 - ramp);
    EXPECT_NEAR(rope_inv_freq(r, i), want, 1e-6 * base + 1e-9) << i;
  }
  auto be = make_cpu_backend();
  std::vector<float> qv(64, 0.f), kv(64, 0.f);
  qv[0] = 1.f, kv[0] = 1.f;
  Tensor q = f32_tensor(qv, {1, 64}), k = f32_tensor(kv, {1, 64});
  Tensor p = i32_tensor({5}, {1});
  QkNormRopeArgs a;
  a.q = &q, a.k = &k, a.positions = &p, a.rope = r, a.norm = QkNormMode::None;
  be->qk_norm_rope(a);
  // Dim 0 (i = 0: pure extrapolation) becomes attention_factor * cos(5), dim 32 its sin.
  EXPECT_NEAR(q.ptr<float>()[0], r.attention_factor * std::cos(5.0), 1e-5);
  EXPECT_NEAR(q.ptr<float>()[32], r.attention_factor * std::sin(5.0), 1e-5);
}

TEST(CpuOpSpecs, DenseMlpIsSwiGlu) {
  auto be = make_cpu_backend();
  std::mt19937 rng(5);
  const int T = 3, H = 8, I = 6;
  auto x = randn(rng, size_t(T * H)), w1 = randn(rng, size_t(I * H)), w3 = randn(rng, size_t(I * H)),
       w2 = randn(rng, size_t(H * I));
  ExpertWeights w{{f32_tensor(w1, {I, H}), {}, 0, 0}, {f32_tensor(w3, {I, H}), {}, 0, 0}, {f32_tensor(w2, {H, I}), {}, 0, 0}};
  Tensor g = be->alloc(DType::F32, {T, I}), u = be->alloc(DType::F32, {T, I}), out = be->alloc(DType::F32, {T, H});
  be->dense_mlp(f32_tensor(x, {T, H}), w, g, u, out);
  for (int t = 0; t < T; ++t) {
    std::vector<double> a(I);
    for (int i = 0; i < I; ++i) {
      double gg = 0, uu = 0;
      for (int h = 0; h < H; ++h) gg += double(x[t * H + h]) * w1[i * H + h], uu += double(x[t * H + h]) * w3[i * H + h];
      a[i] = gg / (1 + std::exp(-gg)) * uu;
    }
    for (int h = 0; h < H; ++h) {
      double o = 0;
      for (int i = 0; i < I; ++i) o += a[i] * w2[h * I + i];
      EXPECT_NEAR(out.ptr<float>()[t * H + h], o, 1e-4);
    }
  }
}

// K head dim 8, V head dim 4: one sequence of 3 tokens, two query heads over one KV head.
TEST(CpuOpSpecs, AttentionWithSeparateVHeadDim) {
  auto be = make_cpu_backend();
  std::mt19937 rng(9);
  const int T = 3, Hq = 2, DK = 8, DV = 4, bs = 4;
  auto qv = randn(rng, size_t(T * Hq * DK)), kv = randn(rng, size_t(T * DK)), vv = randn(rng, size_t(T * DV));
  KVCacheLayer cache{be->alloc(DType::F32, {1, bs, 1, DK}), be->alloc(DType::F32, {1, bs, 1, DV})};
  AttentionMeta m;
  m.num_seqs = 1, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = 1, m.max_query_len = T;
  m.max_context_len = T;
  m.positions = i32_tensor({0, 1, 2}, {T});
  m.query_start = i32_tensor({0, T}, {2});
  m.context_lens = i32_tensor({T}, {1});
  m.block_tables = i32_tensor({0}, {1, 1});
  m.slot_mapping = i32_tensor({0, 1, 2}, {T});
  be->write_kv(f32_tensor(kv, {T, DK}), f32_tensor(vv, {T, DV}), cache, m);
  Tensor q = f32_tensor(qv, {T, Hq * DK}), out = be->alloc(DType::F32, {T, Hq * DV});
  AttentionArgs a;
  a.q = &q, a.kv = &cache, a.meta = &m, a.num_q_heads = Hq, a.num_kv_heads = 1, a.head_dim = DK, a.scale = 0.3f;
  a.out = &out, a.v_head_dim = DV;
  be->attention(a);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < Hq; ++h) {
      std::vector<double> s(t + 1);
      double mx = -1e30, z = 0;
      for (int j = 0; j <= t; ++j) {
        double d = 0;
        for (int c = 0; c < DK; ++c) d += double(qv[(t * Hq + h) * DK + c]) * kv[j * DK + c];
        s[j] = d * 0.3;
        mx = std::max(mx, s[j]);
      }
      for (auto& v : s) z += (v = std::exp(v - mx));
      for (int c = 0; c < DV; ++c) {
        double o = 0;
        for (int j = 0; j <= t; ++j) o += s[j] / z * vv[j * DV + c];
        EXPECT_NEAR(out.ptr<float>()[(t * Hq + h) * DV + c], o, 1e-5);
      }
    }
}

}  // namespace
}  // namespace moeserve
