// bench-model --verify-tokens: the time of a speculative verify step (every sequence of the
// batch has 1 + k query tokens at its context) against the plain decode step (k = 0) at the
// same batch and context, the distinct experts per MoE layer the step's routing read, and the
// tokens/s speedup that ratio allows at a given mean acceptance length. Device-neutral (no
// device header): the CUDA run (bench_model.cpp) passes a graph-replay timer, the CPU run
// (bench-model --device cpu, run_bench_model_cpu) a wall-clock one. Also the measurement of a
// checkpoint's routing overlap between consecutive tokens (--measure-routing-overlap).
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench_step.h"

namespace moeserve::tools {

// Mean acceptance lengths the speedup is reported at (EAGLE-3's published range for
// MiniMax-M2.5 is about 2.2-3 tokens per verify step).
inline constexpr double kAcceptLens[] = {2.2, 2.5, 3.0};
// The k whose rows give the EAGLE-3 summary (3 draft tokens, SpecForge's default for M2.5).
inline constexpr int kEagle3DraftTokens = 3;

// Synthetic routing of one step (--routing-overlap P): for each of `layers` MoE layers a
// [T, top_k] table (row-major, T = sum of qlens) of distinct expert ids per token. The first
// token of each sequence draws top_k distinct experts uniformly; each later token of the same
// sequence keeps r of the previous token's experts (r = floor(P * top_k), plus one with
// probability frac(P * top_k), chosen uniformly) and draws the other top_k - r uniformly from
// the experts in neither set, so the overlap |S_t n S_(t-1)| / top_k has mean P exactly.
// Deterministic in `seed`.
struct VerifyRoutingSpec {
  int layers = 0, experts = 0, top_k = 0;
  double overlap = 0;  // P in [0, 1]
  uint64_t seed = 1;
};
std::vector<std::vector<int32_t>> synth_verify_routing(const VerifyRoutingSpec& spec, const std::vector<int>& qlens);

// Distinct expert ids of a step's routing (per layer a [T, top_k] table, tokens laid out by
// qlens): the union over all the step's tokens (what the MoE layer reads), and the union of
// each sequence's tokens, both averaged over layers (per_seq also over sequences).
struct DistinctExperts {
  double per_layer = 0;
  double per_layer_per_seq = 0;
};
DistinctExperts count_distinct_experts(const std::vector<std::vector<int32_t>>& ids, int top_k,
                                       const std::vector<int>& qlens);
// E * (1 - (1 - K/E)^n): distinct experts expected for n tokens of independent uniform routing.
double expected_distinct_uniform(int experts, int top_k, int tokens);
// Tokens/s of speculation over plain decode: accept_len tokens per verify step of time
// t_verify against one token per decode step of time t_decode; null where accept_len > 1 + k.
nlohmann::json spec_speedup(double accept_len, int k, double t_decode, double t_verify);

struct VerifySweepOptions {
  std::vector<int> batches, contexts, verify_tokens;  // verify_tokens: the k values, 0 = decode
  double routing_overlap = -1;  // < 0: the router's own choice (random weights: near uniform)
  uint64_t routing_seed = 1;
  // Per-step time of the lm_head (estimated), for the whole-model extrapolation of a run with
  // fewer layers than the model; 0: no extrapolation.
  double lm_head_ms = 0;
  int layers = 0, total_layers = 0;
};
// Called with the step planned and its routing set: returns the step's time in ms (runs it
// eagerly first, as a capture needs).
using StepTimeFn = std::function<double()>;
// Whether the KV pool holds B sequences of C + k tokens (rows that do not are skipped).
using FitsFn = std::function<bool(int B, int C, int k)>;
// Every (context, batch, k) row, printed as a table and returned as
// {"rows": [...], "eagle3": [...], "routing": ..., "note": ...}.
nlohmann::json run_verify_sweep(Backend& b, DecoderModel& model, BenchStep& step, const VerifySweepOptions& o,
                                const StepTimeFn& time_step, const FitsFn& fits);

// --measure-routing-overlap PROMPTS: each prompt (a JSON {"prompts": [[ids...], ...]} or a
// list of id lists) prefilled, then `decode_tokens` greedy tokens decoded one at a time, on
// the CPU backend; per MoE layer the router's top-k of every token recorded. Reports the mean
// overlap |S_t n S_(t-1)| / top_k of consecutive generated tokens and of consecutive prompt
// tokens (per layer and overall), the chance level top_k / experts, and the mean distinct
// experts per layer of windows of 2..5 consecutive generated tokens (a verify row's 1 + k)
// against independent uniform routing.
nlohmann::json measure_routing_overlap(DecoderModel& model, Backend& b, const std::string& prompts_path,
                                       int decode_tokens);

}  // namespace moeserve::tools
