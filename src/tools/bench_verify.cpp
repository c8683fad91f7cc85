#include "tools/bench_verify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "core/log.h"

namespace moeserve::tools {

std::vector<std::vector<int32_t>> synth_verify_routing(const VerifyRoutingSpec& sp, const std::vector<int>& qlens) {
  MS_CHECK(sp.experts > 0 && sp.top_k > 0 && sp.top_k <= sp.experts, "synthetic routing: top-{} of {} experts",
           sp.top_k, sp.experts);
  MS_CHECK(sp.overlap >= 0 && sp.overlap <= 1, "synthetic routing: overlap {} outside [0, 1]", sp.overlap);
  // Keeping r of the previous token's K and drawing K - r outside both sets needs E >= 2K - r.
  const int K = sp.top_k, E = sp.experts;
  const int r_lo = int(std::floor(sp.overlap * K));
  const double r_frac = sp.overlap * K - r_lo;
  MS_CHECK(E >= 2 * K - r_lo, "synthetic routing: {} experts cannot give top-{} sets overlapping by {}", E, K,
           sp.overlap);
  int T = 0;
  for (int q : qlens) T += q;
  std::mt19937_64 rng(sp.seed);
  std::vector<std::vector<int32_t>> ids(size_t(sp.layers), std::vector<int32_t>(size_t(T) * K));
  std::vector<int> pool(static_cast<size_t>(E));
  std::vector<char> taken(static_cast<size_t>(E));
  for (auto& L : ids) {
    int t = 0;
    for (int q : qlens) {
      for (int i = 0; i < q; ++i, ++t) {
        int32_t* row = L.data() + size_t(t) * K;
        std::fill(taken.begin(), taken.end(), 0);
        int n = 0;
        if (i > 0) {
          const int32_t* prev = row - K;
          for (int j = 0; j < K; ++j) taken[size_t(prev[j])] = 1;  // excluded from the fresh draws
          const int r = r_lo + (std::uniform_real_distribution<double>(0, 1)(rng) < r_frac ? 1 : 0);
          std::vector<int32_t> keep(prev, prev + K);
          std::shuffle(keep.begin(), keep.end(), rng);
          for (; n < r; ++n) row[n] = keep[size_t(n)];
        }
        // The rest: uniform without replacement over the experts not taken.
        int m = 0;
        for (int e = 0; e < E; ++e)
          if (!taken[size_t(e)]) pool[size_t(m++)] = e;
        for (int j = 0; n < K; ++n, ++j) {
          const int pick = j + int(std::uniform_int_distribution<int>(0, m - 1 - j)(rng));
          std::swap(pool[size_t(j)], pool[size_t(pick)]);
          row[n] = pool[size_t(j)];
        }
      }
    }
  }
  return ids;
}

DistinctExperts count_distinct_experts(const std::vector<std::vector<int32_t>>& ids, int top_k,
                                       const std::vector<int>& qlens) {
  DistinctExperts d;
  if (ids.empty() || qlens.empty()) return d;
  for (const auto& L : ids) {
    std::set<int32_t> all;
    size_t t = 0;
    for (int q : qlens) {
      std::set<int32_t> seq;
      for (int i = 0; i < q; ++i, ++t)
        for (int j = 0; j < top_k; ++j) {
          MS_CHECK((t + 1) * size_t(top_k) <= L.size(), "routing table of {} ids for more tokens", L.size());
          seq.insert(L[t * size_t(top_k) + size_t(j)]);
        }
      all.insert(seq.begin(), seq.end());
      d.per_layer_per_seq += double(seq.size()) / double(qlens.size());
    }
    d.per_layer += double(all.size());
  }
  d.per_layer /= double(ids.size());
  d.per_layer_per_seq /= double(ids.size());
  return d;
}

double expected_distinct_uniform(int experts, int top_k, int tokens) {
  return experts * (1.0 - std::pow(1.0 - double(top_k) / experts, tokens));
}

nlohmann::json spec_speedup(double accept_len, int k, double t_decode, double t_verify) {
  if (accept_len > 1 + k || t_verify <= 0 || t_decode <= 0) return nullptr;
  return accept_len * t_decode / t_verify;
}

namespace {

std::string accept_key(double a) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f", a);
  return buf;
}

nlohmann::json speedups(int k, double t0, double tk) {
  nlohmann::json j = nlohmann::json::object();
  for (double a : kAcceptLens) j[accept_key(a)] = spec_speedup(a, k, t0, tk);
  return j;
}

// The routing each MoE layer used in the last eager step, read after each router (op hook).
std::vector<std::vector<int32_t>> record_router_ids(Backend& b, DecoderModel& model, BenchStep& step, int top_k) {
  std::vector<std::vector<int32_t>> ids;
  const int64_t T = step.planned_tokens();
  model.set_op_hook([&](const char* op) {
    if (std::string(op) != "norm_route") return;
    const std::vector<float> v = b.download_f32(model.workspace().expert_ids.slice_rows(0, T));
    ids.emplace_back(v.begin(), v.begin() + T * top_k);
  });
  step.forward();
  b.synchronize();
  model.set_op_hook({});
  return ids;
}

}  // namespace

nlohmann::json run_verify_sweep(Backend& b, DecoderModel& model, BenchStep& step, const VerifySweepOptions& o,
                                const StepTimeFn& time_step, const FitsFn& fits) {
  const ModelDesc d = model.desc();
  const int K = d.experts_per_token, E = d.num_experts;
  MS_CHECK(K > 0 && E > 0, "bench-model --verify-tokens: {} has no routed experts", d.architecture);
  std::vector<int> ks = o.verify_tokens;
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  const bool synth = o.routing_overlap >= 0;
  const int kmax = ks.back();
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  // Synthetic routing tables: one device tensor per layer, written before each row (fixed
  // addresses, so a captured step reads the row's tables).
  std::vector<Tensor> override_ids;
  if (synth)
    for (int l = 0; l < d.num_layers; ++l) override_ids.push_back(b.alloc(DType::I32, {max_batch * (1 + kmax), K}));
  const bool extrapolate = o.lm_head_ms > 0 && o.total_layers > o.layers && o.layers > 0;
  auto est_total = [&](double ms) { return (ms - o.lm_head_ms) / o.layers * o.total_layers + o.lm_head_ms; };

  nlohmann::json rows = nlohmann::json::array(), eagle3 = nlohmann::json::array();
  std::printf("%-6s %-7s %-3s %10s %8s %10s %10s %10s", "batch", "context", "k", "step_ms", "ratio", "experts/L",
              "per_seq", "uniform");
  for (double a : kAcceptLens) std::printf("   x@%.1f", a);
  std::printf("\n");
  int row_seed = 0;
  for (int C : o.contexts) {
    for (int B : o.batches) {
      double t0 = 0, t0_est = 0;
      for (int k : ks) {
        if (!fits(B, C, k)) {
          spdlog::warn("verify B={} C={} k={}: skipped (KV pool too small)", B, C, k);
          continue;
        }
        const std::vector<int> qlens(size_t(B), 1 + k);
        step.set_logits_all_tokens(k > 0);  // a verify step samples every position
        step.plan(qlens, std::vector<int>(size_t(B), C + k));
        // k = 0 rows (one token per sequence: "the first token", routed at random either way) keep
        // the router's choice, so the decode step keeps its fused path.
        const bool override_row = synth && k > 0;
        std::vector<std::vector<int32_t>> used;
        if (override_row) {
          used = synth_verify_routing(VerifyRoutingSpec{d.num_layers, E, K, o.routing_overlap,
                                                        o.routing_seed + uint64_t(row_seed++)},
                                      qlens);
          std::vector<Tensor> views;
          for (int l = 0; l < d.num_layers; ++l) {
            Tensor v = override_ids[size_t(l)].slice_rows(0, int64_t(B) * (1 + k));
            b.copy_from_host(v, used[size_t(l)].data(), used[size_t(l)].size() * 4);
            views.push_back(v);
          }
          model.set_routing_override(views);
        } else {
          model.set_routing_override({});
          used = record_router_ids(b, model, step, K);
        }
        const DistinctExperts de = count_distinct_experts(used, K, qlens);
        const double ms = time_step();
        model.set_routing_override({});
        if (k == 0) t0 = ms, t0_est = extrapolate ? est_total(ms) : 0;
        nlohmann::json row = {{"batch", B},
                              {"context", C},
                              {"k", k},
                              {"query_tokens_per_seq", 1 + k},
                              {"tokens", B * (1 + k)},
                              {"step_ms", ms},
                              {"ratio_vs_decode", t0 > 0 ? nlohmann::json(ms / t0) : nlohmann::json(nullptr)},
                              {"distinct_experts_per_layer", de.per_layer},
                              {"distinct_experts_per_layer_per_seq", de.per_layer_per_seq},
                              {"expected_distinct_uniform", expected_distinct_uniform(E, K, B * (1 + k))},
                              {"routing", override_row ? "synthetic" : "router"}};
        if (k > 0) row["speedup_at_accept_len"] = t0 > 0 ? speedups(k, t0, ms) : nlohmann::json(nullptr);
        if (extrapolate) {
          row["est_step_ms_total_layers"] = est_total(ms);
          if (k > 0 && t0 > 0) row["est_speedup_at_accept_len_total_layers"] = speedups(k, t0_est, est_total(ms));
        }
        std::printf("%-6d %-7d %-3d %10.3f %8s %10.2f %10.2f %10.2f", B, C, k, ms,
                    t0 > 0 ? fmt::format("{:.3f}", ms / t0).c_str() : "-", de.per_layer, de.per_layer_per_seq,
                    expected_distinct_uniform(E, K, B * (1 + k)));
        std::string sp_cols;
        for (double a : kAcceptLens) {
          const nlohmann::json sp = spec_speedup(a, k, t0, ms);
          sp_cols += k > 0 && sp.is_number() ? fmt::format("  {:6.3f}", sp.get<double>()) : fmt::format("  {:>6}", "-");
        }
        std::printf("%s\n", sp_cols.c_str());
        std::fflush(stdout);
        if (k == kEagle3DraftTokens && t0 > 0) {
          nlohmann::json e = {{"batch", B},
                              {"context", C},
                              {"decode_ms", t0},
                              {"verify_ms", ms},
                              {"ratio", ms / t0},
                              {"speedup_at_accept_len", speedups(k, t0, ms)}};
          if (extrapolate) e["est_speedup_at_accept_len_total_layers"] = speedups(k, t0_est, est_total(ms));
          eagle3.push_back(e);
        }
        rows.push_back(std::move(row));
      }
    }
  }
  nlohmann::json out;
  out["rows"] = rows;
  out["eagle3_k3"] = eagle3;
  out["routing"] = synth ? nlohmann::json{{"mode", "synthetic overlap"},
                                          {"overlap", o.routing_overlap},
                                          {"seed", o.routing_seed},
                                          {"applies_to", "rows with k > 0; k = 0 rows use the router"}}
                         : nlohmann::json{{"mode", "router (random weights: near-uniform, independent per token)"}};
  out["experts"] = E;
  out["top_k"] = K;
  out["note"] =
      "speedup = accept_len * t(k=0) / t(k): the draft's own forward and the acceptance sampling are excluded; "
      "distinct experts are counted from the routing the step ran (per MoE layer, union over the step's tokens; "
      "per_seq: over each sequence's 1 + k tokens), averaged over layers";
  if (extrapolate)
    out["extrapolation"] = fmt::format(
        "est_*_total_layers: (step_ms - lm_head_ms) / {} * {} + lm_head_ms, lm_head_ms = {:.3f} (its bytes / the "
        "measured copy bandwidth)",
        o.layers, o.total_layers, o.lm_head_ms);
  return out;
}

}  // namespace moeserve::tools
