// CPU MoE ops: the router of every RoutingSpec (sigmoid/softmax, selection bias, grouped top-k), and SwiGLU experts grouped by expert.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/thread_pool.h"

namespace moeserve::cpu {

void moe_route(const Tensor& x, const MoeWeights& moe, MoeRouting& out) {
  check_f32(x, "moe_route", "x");
  const int64_t E = moe.num_experts, K = moe.top_k, H = cols_of(x), T = rows_of(x);
  MS_CHECK(E > 0 && K > 0 && K <= E, "moe_route: top_k {} must be in [1, num_experts={}]", K, E);
  LinearWeight gate;
  gate.weight = moe.gate;
  check_float_weight(gate.weight, "moe_route", "gate", /*allow_fp8=*/false);
  MS_CHECK(gate.weight.rank() == 2 && gate.weight.dim(0) == E && gate.weight.dim(1) == H,
           "moe_route: gate {} must be [{}, {}]", shape_str(gate.weight.shape), E, H);
  std::vector<float> bias(size_t(E), 0.f);
  if (moe.score_bias.defined()) {
    check_float_weight(moe.score_bias, "moe_route", "score_bias", /*allow_fp8=*/false);
    MS_CHECK(moe.score_bias.numel() == E, "moe_route: score_bias {} must have {} elements",
             shape_str(moe.score_bias.shape), E);
    bias = to_f32_vector(moe.score_bias);
  }
  check_i32(out.expert_ids, "moe_route", "expert_ids");
  check_f32(out.weights, "moe_route", "weights");
  MS_CHECK(out.expert_ids.numel() == T * K && out.weights.numel() == T * K,
           "moe_route: outputs {} / {} must hold [{}, {}]", shape_str(out.expert_ids.shape),
           shape_str(out.weights.shape), T, K);

  const RoutingSpec& spec = moe.route;
  const int64_t G = std::max(1, spec.n_group), TG = std::max(1, spec.topk_group);
  MS_CHECK(E % G == 0 && TG <= G, "moe_route: {} experts do not form {} groups (topk_group {})", E, G, TG);
  MS_CHECK(G == 1 || K <= TG * (E / G), "moe_route: top_k {} exceeds the {} experts of {} groups", K, TG * (E / G), TG);
  const bool has_bias = moe.score_bias.defined();

  std::vector<float> logits(size_t(T * E));
  linear_f32(x.ptr<float>(), T, gate, logits.data());
  int32_t* ids = out.expert_ids.ptr<int32_t>();
  float* wts = out.weights.ptr<float>();
  ThreadPool::global().parallel_for(T, [&](int64_t b, int64_t e) {
    std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), gscore(static_cast<size_t>(G));
    std::vector<int32_t> order(static_cast<size_t>(E)), gorder(static_cast<size_t>(G));
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t t = b; t < e; ++t) {
      const float* lg = logits.data() + t * E;
      if (spec.scoring == RouteScoring::Softmax) {
        float mx = ninf;
        for (int64_t i = 0; i < E; ++i) mx = std::max(mx, lg[i]);
        double sum = 0;
        for (int64_t i = 0; i < E; ++i) sum += double(s[size_t(i)] = std::exp(lg[i] - mx));
        for (int64_t i = 0; i < E; ++i) s[size_t(i)] = float(double(s[size_t(i)]) / sum);
      } else {
        for (int64_t i = 0; i < E; ++i) s[size_t(i)] = 1.f / (1.f + std::exp(-lg[i]));
      }
      for (int64_t i = 0; i < E; ++i) choice[size_t(i)] = s[size_t(i)] + bias[size_t(i)];
      if (G > 1) {
        // Group score: sum of the two best choices with a bias (DeepSeek-V3), else the best.
        const int64_t per = E / G;
        for (int64_t g = 0; g < G; ++g) {
          float b1 = ninf, b2 = ninf;
          for (int64_t i = g * per; i < (g + 1) * per; ++i) {
            const float c = choice[size_t(i)];
            if (c > b1) b2 = b1, b1 = c;
            else if (c > b2) b2 = c;
          }
          gscore[size_t(g)] = has_bias && per >= 2 ? b1 + b2 : b1;
        }
        std::iota(gorder.begin(), gorder.end(), 0);
        std::partial_sort(gorder.begin(), gorder.begin() + TG, gorder.end(), [&](int32_t l, int32_t r) {
          return gscore[size_t(l)] > gscore[size_t(r)] || (gscore[size_t(l)] == gscore[size_t(r)] && l < r);
        });
        std::vector<char> keep(size_t(G), 0);
        for (int64_t g = 0; g < TG; ++g) keep[size_t(gorder[size_t(g)])] = 1;
        for (int64_t i = 0; i < E; ++i)
          if (!keep[size_t(i / per)]) choice[size_t(i)] = ninf;
      }
      std::iota(order.begin(), order.end(), 0);
      // Larger choice first; equal choices: lower expert id first (a stable, documented rule).
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t l, int32_t r) {
        return choice[size_t(l)] > choice[size_t(r)] || (choice[size_t(l)] == choice[size_t(r)] && l < r);
      });
      float sum = 0.f;
      for (int64_t k = 0; k < K; ++k) sum += s[size_t(order[size_t(k)])];
      const float div = spec.renormalize ? sum : 1.f;
      for (int64_t k = 0; k < K; ++k) {
        ids[t * K + k] = order[size_t(k)];
        wts[t * K + k] = s[size_t(order[size_t(k)])] / div * spec.routed_scaling_factor;
      }
    }
  }, 4);
}

void moe_experts(const Tensor& x, const MoeWeights& moe, const MoeRouting& routing, Tensor& out) {
  check_f32(x, "moe_experts", "x");
  check_f32(out, "moe_experts", "out");
  const int64_t H = cols_of(x), T = rows_of(x), K = moe.top_k, E = moe.num_experts;
  const int64_t first = moe.first_local_expert, nlocal = int64_t(moe.experts.size());
  MS_CHECK(out.numel() == x.numel() && cols_of(out) == H, "moe_experts: out {} must match x {}",
           shape_str(out.shape), shape_str(x.shape));
  MS_CHECK(first >= 0 && first + nlocal <= E, "moe_experts: local experts [{}, {}) outside [0, {})", first,
           first + nlocal, E);
  check_i32(routing.expert_ids, "moe_experts", "expert_ids");
  check_f32(routing.weights, "moe_experts", "weights");
  MS_CHECK(K > 0 && routing.expert_ids.numel() == T * K && routing.weights.numel() == T * K,
           "moe_experts: routing {} / {} must hold [{}, {}]", shape_str(routing.expert_ids.shape),
           shape_str(routing.weights.shape), T, K);
  const char* xb = static_cast<const char*>(x.data);
  const char* ob = static_cast<const char*>(out.data);
  MS_CHECK(xb + x.nbytes() <= ob || ob + out.nbytes() <= xb, "moe_experts: x and out overlap");

  // Tokens per local expert: (token, routing weight) pairs, in token order.
  const int32_t* ids = routing.expert_ids.ptr<int32_t>();
  const float* wts = routing.weights.ptr<float>();
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(static_cast<size_t>(nlocal));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int32_t id = ids[t * K + k];
      MS_CHECK(id >= 0 && id < E, "moe_experts: expert id {} for token {} outside [0, {})", id, t, E);
      if (id >= first && id < first + nlocal) assigned[size_t(id - first)].push_back({t, wts[t * K + k]});
    }

  float* op = out.ptr<float>();
  std::fill(op, op + T * H, 0.f);
  std::vector<float> xs, g, u, y;
  for (int64_t le = 0; le < nlocal; ++le) {
    const auto& tok = assigned[size_t(le)];
    if (tok.empty()) continue;
    const ExpertWeights& ew = moe.experts[size_t(le)];
    check_linear_weight(ew.w1, "moe_experts w1");
    check_linear_weight(ew.w3, "moe_experts w3");
    check_linear_weight(ew.w2, "moe_experts w2");
    const int64_t I = ew.w1.out_features();
    MS_CHECK(ew.w1.in_features() == H && ew.w3.in_features() == H && ew.w3.out_features() == I &&
                 ew.w2.in_features() == I && ew.w2.out_features() == H,
             "moe_experts: expert {} has w1 {}, w3 {}, w2 {}; expected [I, {}], [I, {}], [{}, I]", first + le,
             shape_str(ew.w1.weight.shape), shape_str(ew.w3.weight.shape), shape_str(ew.w2.weight.shape), H, H,
             H);
    const int64_t n = int64_t(tok.size());
    xs.resize(size_t(n * H));
    for (int64_t i = 0; i < n; ++i) std::copy_n(x.ptr<float>() + tok[size_t(i)].first * H, H, xs.data() + i * H);
    g.resize(size_t(n * I));
    u.resize(size_t(n * I));
    linear_f32(xs.data(), n, ew.w1, g.data());
    linear_f32(xs.data(), n, ew.w3, u.data());
    for (int64_t i = 0; i < n * I; ++i) {
      const float gi = g[size_t(i)];
      g[size_t(i)] = gi / (1.f + std::exp(-gi)) * u[size_t(i)];  // silu(gate) * up
    }
    y.resize(size_t(n * H));
    linear_f32(g.data(), n, ew.w2, y.data());
    for (int64_t i = 0; i < n; ++i) {
      float* orow = op + tok[size_t(i)].first * H;
      const float w = tok[size_t(i)].second;
      for (int64_t j = 0; j < H; ++j) orow[j] += w * y[size_t(i * H + j)];
    }
  }
}

}  // namespace moeserve::cpu
