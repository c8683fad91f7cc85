// CPU backend: sigmoid router (bias for selection only, ties to the lower id) and SwiGLU
// experts against double references; EP and TP splits of the experts sum to the whole.
#include <gtest/gtest.h>

#include <numeric>

#include "cpu_test_util.h"

using namespace moeserve;
using namespace moeserve::testing;

namespace {

constexpr int64_t kH = 64, kI = 48, kE = 8, kK = 3;

struct RouteRef {
  std::vector<int32_t> ids;
  std::vector<double> w;
};

RouteRef route_ref(const std::vector<float>& x, int64_t T, const std::vector<float>& gate, const std::vector<float>& bias,
                   int64_t E, int64_t K) {
  RouteRef r;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t j = 0; j < kH; ++j) l += double(x[size_t(t * kH + j)]) * gate[size_t(e * kH + j)];
      s[size_t(e)] = 1.0 / (1.0 + std::exp(-l));
      c[size_t(e)] = s[size_t(e)] + (bias.empty() ? 0.0 : bias[size_t(e)]);
    }
    std::vector<bool> used(size_t(E), false);
    double sum = 0;
    std::vector<int32_t> ids;
    for (int64_t k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < int(E); ++e)  // strictly greater: the first (lowest) id wins ties
        if (!used[size_t(e)] && (best < 0 || c[size_t(e)] > c[size_t(best)])) best = e;
      used[size_t(best)] = true;
      ids.push_back(best);
      sum += s[size_t(best)];
    }
    for (int32_t id : ids) {
      r.ids.push_back(id);
      r.w.push_back(s[size_t(id)] / sum);
    }
  }
  return r;
}

MoeRouting alloc_routing(Backend& be, int64_t T, int64_t K) {
  return {be.alloc(DType::I32, {T, K}), be.alloc(DType::F32, {T, K})};
}

std::vector<ExpertWeights> make_experts(std::mt19937& rng, int64_t n, DType dt) {
  std::vector<ExpertWeights> ex;
  for (int64_t e = 0; e < n; ++e)
    ex.push_back({make_linear(rng, kI, kH, dt, 32, 32), make_linear(rng, kI, kH, dt, 32, 32),
                  make_linear(rng, kH, kI, dt, 32, 32)});
  return ex;
}

// sum_k w[t,k] * W2 (silu(W1 x) * W3 x) over experts in [first, first + experts.size()).
std::vector<double> experts_ref(const std::vector<float>& x, int64_t T, const std::vector<ExpertWeights>& ex,
                                int64_t first, const std::vector<int32_t>& ids, const std::vector<float>& w, int64_t K) {
  std::vector<double> out(size_t(T * kH), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t le = ids[size_t(t * K + k)] - first;
      if (le < 0 || le >= int64_t(ex.size())) continue;
      const auto& e = ex[size_t(le)];
      const int64_t I = e.w1.out_features();
      std::vector<double> xt(x.begin() + t * kH, x.begin() + (t + 1) * kH);
      auto g = linear_ref(xt, 1, dequant_ref(e.w1), I, kH);
      auto u = linear_ref(xt, 1, dequant_ref(e.w3), I, kH);
      for (int64_t i = 0; i < I; ++i) g[size_t(i)] = g[size_t(i)] / (1.0 + std::exp(-g[size_t(i)])) * u[size_t(i)];
      auto y = linear_ref(g, 1, dequant_ref(e.w2), kH, I);
      for (int64_t j = 0; j < kH; ++j) out[size_t(t * kH + j)] += double(w[size_t(t * K + k)]) * y[size_t(j)];
    }
  return out;
}

}  // namespace

TEST(CpuMoe, RouteMatchesDouble) {
  auto be = make_cpu_backend();
  std::mt19937 rng(21);
  const int64_t T = 33;
  std::vector<float> x = randn(rng, size_t(T * kH)), gate = randn(rng, size_t(kE * kH), 0.2f);
  std::vector<float> bias = randn(rng, size_t(kE), 0.05f);
  MoeWeights moe;
  moe.gate = f32_tensor(gate, {kE, kH});
  moe.score_bias = f32_tensor(bias, {kE});
  moe.num_experts = int(kE);
  moe.top_k = int(kK);
  MoeRouting r = alloc_routing(*be, T, kK);
  be->moe_route(f32_tensor(x, {T, kH}), moe, r);
  RouteRef ref = route_ref(x, T, gate, bias, kE, kK);
  std::vector<int32_t> ids(r.expert_ids.ptr<int32_t>(), r.expert_ids.ptr<int32_t>() + T * kK);
  EXPECT_EQ(ids, ref.ids);
  EXPECT_LT(max_rel_err(as_vec(r.weights), ref.w, "moe_route weights"), 1e-6);
  // Weights of each token sum to 1.
  for (int64_t t = 0; t < T; ++t) {
    double s = 0;
    for (int64_t k = 0; k < kK; ++k) s += r.weights.ptr<float>()[t * kK + k];
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
  // BF16 gate without bias also works.
  MoeWeights moe2 = moe;
  moe2.gate = to_dtype(gate, {kE, kH}, DType::BF16);
  moe2.score_bias = Tensor();
  be->moe_route(f32_tensor(x, {T, kH}), moe2, r);
  RouteRef ref2 = route_ref(x, T, as_vec(moe2.gate), {}, kE, kK);
  std::vector<int32_t> ids2(r.expert_ids.ptr<int32_t>(), r.expert_ids.ptr<int32_t>() + T * kK);
  EXPECT_EQ(ids2, ref2.ids);
  EXPECT_LT(max_rel_err(as_vec(r.weights), ref2.w, "moe_route weights bf16 gate"), 1e-6);
}

TEST(CpuMoe, RouteTiesAndBiasSelectsButDoesNotWeigh) {
  auto be = make_cpu_backend();
  // Experts 1, 4 and 6 have identical gate rows (identical scores); the others score lower.
  std::vector<float> gate(size_t(kE * kH), 0.f);
  for (int e : {1, 4, 6})
    for (int64_t j = 0; j < kH; ++j) gate[size_t(e * kH + j)] = 0.5f;
  std::vector<float> x(size_t(kH), 0.1f);  // logits: 3.2 for experts 1,4,6 and 0 elsewhere
  MoeWeights moe;
  moe.gate = f32_tensor(gate, {kE, kH});
  moe.num_experts = int(kE);
  moe.top_k = 2;
  MoeRouting r = alloc_routing(*be, 1, 2);
  be->moe_route(f32_tensor(x, {1, kH}), moe, r);
  EXPECT_EQ(r.expert_ids.ptr<int32_t>()[0], 1);
  EXPECT_EQ(r.expert_ids.ptr<int32_t>()[1], 4);
  EXPECT_FLOAT_EQ(r.weights.ptr<float>()[0], 0.5f);
  // A large bias on expert 7 (logit 0, s = 0.5) makes it chosen first, but its weight comes
  // from the unbiased score: 0.5 / (0.5 + sigmoid(3.2)).
  std::vector<float> bias(size_t(kE), 0.f);
  bias[7] = 10.f;
  moe.score_bias = f32_tensor(bias, {kE});
  be->moe_route(f32_tensor(x, {1, kH}), moe, r);
  EXPECT_EQ(r.expert_ids.ptr<int32_t>()[0], 7);
  EXPECT_EQ(r.expert_ids.ptr<int32_t>()[1], 1);
  const double s_hi = 1.0 / (1.0 + std::exp(-3.2));
  EXPECT_NEAR(r.weights.ptr<float>()[0], 0.5 / (0.5 + s_hi), 1e-6);
  EXPECT_NEAR(r.weights.ptr<float>()[1], s_hi / (0.5 + s_hi), 1e-6);
  // Bad shapes.
  moe.top_k = int(kE) + 1;
  EXPECT_THROW(be->moe_route(f32_tensor(x, {1, kH}), moe, r), Error);
}

TEST(CpuMoe, ExpertsMatchDoubleFp8AndBf16) {
  auto be = make_cpu_backend();
  std::mt19937 rng(22);
  const int64_t T = 19;
  for (DType dt : {DType::F8_E4M3, DType::BF16}) {
    std::vector<float> x = randn(rng, size_t(T * kH)), gate = randn(rng, size_t(kE * kH), 0.3f);
    MoeWeights moe;
    moe.gate = f32_tensor(gate, {kE, kH});
    moe.num_experts = int(kE);
    moe.top_k = int(kK);
    moe.experts = make_experts(rng, kE, dt);
    MoeRouting r = alloc_routing(*be, T, kK);
    Tensor xt = f32_tensor(x, {T, kH});
    be->moe_route(xt, moe, r);
    Tensor out = be->alloc(DType::F32, {T, kH});
    be->moe_experts(xt, moe, r, out);
    std::vector<int32_t> ids(r.expert_ids.ptr<int32_t>(), r.expert_ids.ptr<int32_t>() + T * kK);
    auto ref = experts_ref(x, T, moe.experts, 0, ids, as_vec(r.weights), kK);
    std::string what = std::string("moe_experts ") + std::string(dtype_name(dt));
    EXPECT_LT(max_rel_err(as_vec(out), ref, what.c_str()), 1e-5);
  }
}

TEST(CpuMoe, ExpertParallelHalvesSumToAll) {
  auto be = make_cpu_backend();
  std::mt19937 rng(23);
  const int64_t T = 25;
  std::vector<float> x = randn(rng, size_t(T * kH)), gate = randn(rng, size_t(kE * kH), 0.3f);
  MoeWeights all;
  all.gate = f32_tensor(gate, {kE, kH});
  all.num_experts = int(kE);
  all.top_k = int(kK);
  all.experts = make_experts(rng, kE, DType::F8_E4M3);
  Tensor xt = f32_tensor(x, {T, kH});
  MoeRouting r = alloc_routing(*be, T, kK);
  be->moe_route(xt, all, r);
  Tensor full = be->alloc(DType::F32, {T, kH});
  be->moe_experts(xt, all, r, full);

  MoeWeights lo = all, hi = all;
  lo.experts.assign(all.experts.begin(), all.experts.begin() + kE / 2);
  hi.experts.assign(all.experts.begin() + kE / 2, all.experts.end());
  hi.first_local_expert = int(kE / 2);
  Tensor a = be->alloc(DType::F32, {T, kH}), b = be->alloc(DType::F32, {T, kH}), sum = be->alloc(DType::F32, {T, kH});
  be->moe_experts(xt, lo, r, a);
  be->moe_experts(xt, hi, r, b);
  be->add(a, b, sum);
  EXPECT_LT(max_rel_err(as_vec(sum), to_double(as_vec(full)), "moe EP2 halves vs all"), 1e-6);
  // Each half alone is a real part of the sum (both non-zero).
  double na = 0, nb = 0;
  for (float v : as_vec(a)) na += std::fabs(v);
  for (float v : as_vec(b)) nb += std::fabs(v);
  EXPECT_GT(na, 0);
  EXPECT_GT(nb, 0);
  // Local experts outside [0, E) are rejected.
  hi.first_local_expert = int(kE / 2) + 1;
  EXPECT_THROW(be->moe_experts(xt, hi, r, b), Error);
}

TEST(CpuMoe, TensorParallelSlicesOfIntermediateSumToAll) {
  // TP of the experts: rank r keeps rows [r*I/2, (r+1)*I/2) of w1/w3 and the same columns of
  // w2; the ranks' outputs sum to the unsplit result.
  auto be = make_cpu_backend();
  std::mt19937 rng(24);
  const int64_t T = 7;
  std::vector<float> x = randn(rng, size_t(T * kH)), gate = randn(rng, size_t(kE * kH), 0.3f);
  MoeWeights all;
  all.gate = f32_tensor(gate, {kE, kH});
  all.num_experts = int(kE);
  all.top_k = int(kK);
  all.experts = make_experts(rng, kE, DType::BF16);
  Tensor xt = f32_tensor(x, {T, kH});
  MoeRouting r = alloc_routing(*be, T, kK);
  be->moe_route(xt, all, r);
  Tensor full = be->alloc(DType::F32, {T, kH});
  be->moe_experts(xt, all, r, full);

  const int64_t Ih = kI / 2;
  Tensor sum = be->alloc(DType::F32, {T, kH});
  for (int rank = 0; rank < 2; ++rank) {
    MoeWeights part = all;
    for (auto& e : part.experts) {
      auto w1 = as_vec(e.w1.weight), w3 = as_vec(e.w3.weight), w2 = as_vec(e.w2.weight);
      std::vector<float> w1s(w1.begin() + rank * Ih * kH, w1.begin() + (rank + 1) * Ih * kH);
      std::vector<float> w3s(w3.begin() + rank * Ih * kH, w3.begin() + (rank + 1) * Ih * kH);
      std::vector<float> w2s;
      for (int64_t o = 0; o < kH; ++o)
        w2s.insert(w2s.end(), w2.begin() + o * kI + rank * Ih, w2.begin() + o * kI + (rank + 1) * Ih);
      e.w1.weight = to_dtype(w1s, {Ih, kH}, DType::BF16);
      e.w3.weight = to_dtype(w3s, {Ih, kH}, DType::BF16);
      e.w2.weight = to_dtype(w2s, {kH, Ih}, DType::BF16);
    }
    Tensor out = be->alloc(DType::F32, {T, kH});
    be->moe_experts(xt, part, r, out);
    be->add(sum, out, sum);
  }
  EXPECT_LT(max_rel_err(as_vec(sum), to_double(as_vec(full)), "moe TP2 slices vs all"), 1e-5);
}
