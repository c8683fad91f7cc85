// bench-model: decode tokens/s at several batch sizes and contexts (one CUDA graph per
// batch), prefill tokens/s and TTFT for a long prompt, each with its fraction of the roofline
// measured at start:
//   decode: bytes a step must read (attention weights, router, the expected distinct experts
//           of B tokens under uniform routing, KV of every sequence, lm_head) / copy bandwidth,
//           divided by the measured step time;
//   prefill: FLOPs (projections, the top-k experts of every token, causal attention) / FP8
//           matrix rate, divided by the measured time.
#include "tools/bench_model.h"

#include "model/registry.h"
#include "core/kv_cache_dtype.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/common/event_timer.h"
#include "core/debug_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "tools/bench_synth.h"
#include "tools/bench_verify.h"
#ifdef MOESERVE_KTRACE
#include "backend/cuda/common/ktrace.h"
#endif

namespace moeserve::tools {
namespace {

using Timer = cuda::EventTimer;


// Eager step with an event after every op; returns ms per op name (summed over layers),
// the median over `reps` steps, in first-seen order.
std::vector<std::pair<std::string, double>> profile_step(CudaBackend& b, Model& model, BenchStep& step,
                                                         int reps) {
  std::vector<std::vector<std::pair<std::string, double>>> runs;
  std::vector<cudaEvent_t> ev;
  std::vector<std::string> names;
  for (int r = 0; r < reps + 1; ++r) {
    size_t n = 0;
    names.clear();
    auto rec = [&](const char* name) {
      if (n == ev.size()) {
        ev.emplace_back();
        cudaEventCreate(&ev.back());
      }
      cudaEventRecord(ev[n++], b.stream());
      if (name) names.emplace_back(name);
    };
    rec(nullptr);
    model.set_op_hook(rec);
    step.forward();
    model.set_op_hook({});
    b.synchronize();
    if (r == 0) continue;  // warm-up
    std::vector<std::pair<std::string, double>> acc;
    for (size_t i = 1; i < n; ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[i - 1], ev[i]);
      auto it = std::find_if(acc.begin(), acc.end(), [&](auto& x) { return x.first == names[i - 1]; });
      if (it == acc.end())
        acc.emplace_back(names[i - 1], ms);
      else
        it->second += ms;
    }
    runs.push_back(acc);
  }
  for (auto e : ev) cudaEventDestroy(e);
  std::vector<std::pair<std::string, double>> med = runs[0];
  for (size_t k = 0; k < med.size(); ++k) {
    std::vector<double> v;
    for (auto& r : runs) v.push_back(r[k].second);
    std::sort(v.begin(), v.end());
    med[k].second = v[v.size() / 2];
  }
  return med;
}

nlohmann::json print_profile(const char* title, const std::vector<std::pair<std::string, double>>& prof) {
  double total = 0;
  for (auto& [n, ms] : prof) total += ms;
  std::printf("profile %s: %.3f ms eager\n", title, total);
  nlohmann::json j = nlohmann::json::object();
  for (auto& [n, ms] : prof) {
    std::printf("  %-14s %9.3f ms %6.1f%%\n", n.c_str(), ms, 100.0 * ms / total);
    j[n] = ms;
  }
  return j;
}

}  // namespace

int run_bench_model(const BenchModelOptions& opt) {
  check_verify_options(opt);
  if (opt.device == "cpu") return run_bench_model_cpu(opt);
  MS_CHECK(opt.checkpoint.empty() != opt.synthetic.empty(),
           "bench-model: give either a checkpoint directory or --synthetic NAME ({})", synthetic_model_names());
  if (!opt.synthetic.empty()) (void)synthetic_model(opt.synthetic, 1);  // an unknown name fails here, listing them
  MS_CHECK(opt.layers >= 0 && opt.iters >= 1, "bench-model: --layers must be >= 0 and --iters >= 1");
  MS_CHECK(opt.tensor_parallel >= 1, "bench-model: --tensor-parallel-size must be >= 1");
  MS_CHECK(opt.data_parallel == 1, "bench-model: --data-parallel-size {}: only 1 is implemented", opt.data_parallel);
  if (opt.tensor_parallel > 1) {
    // Multi-GPU decode (bench_parallel.cpp): one MiniMaxM2Model rank per GPU, synthetic
    // weights only (each rank generates its own slices).
    MS_CHECK(opt.checkpoint.empty() && opt.synthetic == "minimax-m2.5",
             "bench-model: --tensor-parallel-size > 1 supports only --synthetic minimax-m2.5");
    BenchModelOptions o = opt;
    if (o.layers == 0) o.layers = 4;
    return run_bench_model_parallel(o);
  }
  auto backend = make_cuda_backend(0);
  CudaBackend& b = *backend;
  // The model from the registry: a --synthetic config with random weights, or a checkpoint's
  // first --layers layers (any architecture on the shared decoder layers).
  SyntheticModel bench = bench_model_config(opt.checkpoint, opt.synthetic, opt.layers);
  std::unique_ptr<ArchConfig> cfg = std::move(bench.config);
  const SynthShapes s = bench.shapes;
  const int layers = cfg->desc().num_layers;
  std::unique_ptr<DecoderModel> model_ptr = make_bench_model(*cfg, b);
  DecoderModel& model = *model_ptr;
  {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t wbytes = 0;
    if (opt.checkpoint.empty()) {
      wbytes = make_bench_weights(b, model);
    } else {
      model.load(Checkpoint::open(opt.checkpoint));
      wbytes = weight_bytes(model.weights());
    }
    spdlog::info("{} weights: {:.2f} GB for {} layers in {:.1f} s", opt.checkpoint.empty() ? "synthetic" : "checkpoint",
                 wbytes / 1e9, layers,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  nlohmann::json out;
  out["command"] = opt.command_line;
  out["gpu"] = b.device_name();
  out["layers"] = layers;
  out["total_layers"] = s.total_layers;  // of the real model: the *_62_layers estimates use it
  out["model"] = opt.checkpoint.empty() ? opt.synthetic + " (synthetic weights)" : opt.checkpoint;

  const Roofline roof = measure_roofline(b.stream());
  out["roofline"] = {{"copy_GBps", roof.copy_bytes_per_s / 1e9},
                     {"fp8_tflops", roof.fp8_flops / 1e12},
                     {"bf16_tflops", roof.bf16_flops / 1e12},
                     {"note", roof.fp8_note}};

  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  // Verify rows: B sequences of 1 + k tokens, contexts up to C + k, logits of every token.
  const int kmax = opt.verify_tokens.empty() ? 0 : *std::max_element(opt.verify_tokens.begin(), opt.verify_tokens.end());
  const int max_ctx = std::max(*std::max_element(opt.contexts.begin(), opt.contexts.end()) + kmax, opt.prefill_tokens);
  const int bs = opt.block_size;
  const int max_blocks = (max_ctx + bs - 1) / bs + 1;
  const int max_tokens = std::max(max_batch * (1 + kmax), opt.prefill_tokens);
  BenchStep step(b, model, max_tokens, std::max(max_batch * (1 + kmax), 1), max_blocks);
  b.synchronize();

  // KV pool from --gpu-memory-utilization, after weights and workspaces (plus 2 GB headroom
  // for the workspaces a prefill grows).
  size_t free_b = 0, total_b = 0;
  b.mem_info(&free_b, &total_b);
  const double budget = double(total_b) * opt.gpu_memory_utilization - double(total_b - free_b) - 2e9;
  const DType kv_dtype = kv_cache_storage_dtype(parse_kv_cache_dtype(opt.kv_cache_dtype), DType::BF16);
  const int kv_elem = int(dtype_size(kv_dtype));
  out["kv_cache_dtype"] = dtype_name(kv_dtype);
  // Bytes per token and layer: K and V of the GQA heads, or MLA's one latent row (kv_lora + rope).
  const KvLayout kl = model.kv_layout();
  const double kv_token_layer = model.desc().kv_lora_rank > 0 ? double(kl.bytes_per_block(1, kv_elem)) / kl.num_layers
                                                              : double(s.kv_heads) * s.head_dim * 2 * kv_elem;
  const int64_t blocks_per_layer =
      std::max<int64_t>(0, int64_t(budget / (kv_token_layer * bs * layers)));
  int64_t need_blocks = int64_t(max_blocks);  // one prefill sequence
  for (int C : opt.contexts) need_blocks = std::max(need_blocks, int64_t(max_batch) * ((C + kmax + bs - 1) / bs));
  const int64_t pool = std::min(blocks_per_layer, need_blocks);
  MS_CHECK(pool >= max_blocks, "bench-model: not enough memory for the KV cache of one sequence");
  spdlog::info("KV cache: {} tokens fit per layer at --gpu-memory-utilization {} ({} layers; a {}-layer model "
               "would hold {} tokens); allocating {} blocks of {}",
               blocks_per_layer * bs, opt.gpu_memory_utilization, layers, s.total_layers,
               int64_t(budget / (kv_token_layer * s.total_layers)), pool, bs);
  out["kv_tokens_fit_per_layer"] = blocks_per_layer * bs;
  out["kv_tokens_fit_62_layers"] = int64_t(budget / (kv_token_layer * s.total_layers));
  step.alloc_kv(int(pool), bs, kv_dtype, [&](Tensor& t, uint64_t seed) { b.fill_random(t, seed, 1.f); });
  b.synchronize();

  Timer timer(b.stream());
  if (opt.linear_gemv_max_tokens > 0) b.tuning.linear_gemv_max_tokens = opt.linear_gemv_max_tokens;
  out["linear_gemv_max_tokens"] = b.tuning.linear_gemv_max_tokens;
  // ---- per-op profile ----
  nlohmann::json prof = nlohmann::json::array();
  for (int B : opt.profile_batches) {
    const int C = opt.contexts.front();
    if (int64_t(B) * ((C + bs - 1) / bs) > pool || B > max_batch) continue;
    step.plan(std::vector<int>(B, 1), std::vector<int>(B, C));
    const std::string title = "decode batch " + std::to_string(B) + " ctx " + std::to_string(C);
    prof.push_back({{"what", title}, {"ms", print_profile(title.c_str(), profile_step(b, model, step, 5))}});
  }
  if (!opt.profile_batches.empty() && opt.prefill_tokens > 0) {
    step.plan({opt.prefill_tokens}, {opt.prefill_tokens});
    const std::string title = "prefill " + std::to_string(opt.prefill_tokens);
    prof.push_back({{"what", title}, {"ms", print_profile(title.c_str(), profile_step(b, model, step, 1))}});
  }
  if (!prof.empty()) out["profile"] = prof;
  // The planned step's time: eager once (sizes workspaces, builds expert tables), then one
  // CUDA graph replayed (or eager steps with --no-graphs); the median of --iters.
  auto time_planned = [&](const std::string& label, bool eager_first) -> double {
    if (eager_first) {
      step.forward();
      b.synchronize();
    }
    double ms;
    if (opt.graphs) {
#ifdef MOESERVE_KTRACE
      const char* ktrace_out = debug_flags().ktrace_out.empty() ? nullptr : debug_flags().ktrace_out.c_str();
      if (ktrace_out) {
        cuda::ktrace_enable(1u << 20);
        cuda::ktrace_notes(true);
      }
#endif
      b.begin_capture();
      step.forward();
      CudaGraph g = b.end_capture();
#ifdef MOESERVE_KTRACE
      cuda::ktrace_notes(false);
#endif
      g.replay(b.stream());
      // Optional warm-up: an idle GPU sits at low clocks and ramps up over ~100 ms of work;
      // a serving GPU under load is warm.
      for (auto t0 = std::chrono::steady_clock::now();
           std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(opt.warmup_ms);) {
        g.replay(b.stream());
        b.synchronize();
      }
      ms = timer.median_ms(opt.iters, [&] { g.replay(b.stream()); });
#ifdef MOESERVE_KTRACE
      if (ktrace_out) {  // one more replay, traced (after the timed ones: same warm state)
        b.synchronize();
        cuda::ktrace_reset();
        g.replay(b.stream());
        b.synchronize();
        cuda::ktrace_dump(fmt::format("{}_{}", ktrace_out, label));
      }
#endif
    } else {
      ms = timer.median_ms(opt.iters, [&] { step.forward(); });
    }
    (void)label;
    return ms;
  };
  const double lm_ms = double(s.vocab) * s.hidden * 2 / roof.copy_bytes_per_s * 1e3;
  if (!opt.verify_tokens.empty()) {
    // ---- decode vs verify rows (bench_verify.h) ----
    VerifySweepOptions vo;
    vo.batches = opt.batches, vo.contexts = opt.contexts, vo.verify_tokens = opt.verify_tokens;
    vo.routing_overlap = opt.routing_overlap, vo.routing_seed = opt.routing_seed;
    vo.lm_head_ms = lm_ms, vo.layers = layers, vo.total_layers = s.total_layers;
    auto fits = [&](int B, int C, int k) { return int64_t(B) * ((C + k + bs - 1) / bs) <= pool; };
    out["verify"] = run_verify_sweep(b, model, step, vo, [&] { return time_planned("verify", true); }, fits);
    out["verify"]["graph"] = opt.graphs;
    out["verify"]["kv_cache_dtype"] = dtype_name(kv_dtype);
  }
  const bool mla = model.desc().kv_lora_rank > 0;
  // ---- decode ----
  nlohmann::json dec = nlohmann::json::array();
  if (opt.verify_tokens.empty())
    std::printf("%-6s %-7s %10s %12s %12s %9s\n", "batch", "context", "step_ms", "tok/s", "floor_ms", "roofline");
  for (int C : opt.verify_tokens.empty() ? opt.contexts : std::vector<int>{}) {  // verify rows replace it
    for (int B : opt.batches) {
      if (int64_t(B) * ((C + bs - 1) / bs) > pool) {
        spdlog::warn("decode B={} C={}: skipped (KV pool of {} blocks too small)", B, C, pool);
        continue;
      }
      step.plan(std::vector<int>(B, 1), std::vector<int>(B, C));
      step.forward();  // eager: sizes workspaces, builds expert tables
      b.synchronize();
      auto ids = step.routing_ids();
      std::set<int> distinct(ids.begin(), ids.end());
      const double ms = time_planned(fmt::format("b{}_c{}", B, C), false);
      // MLA models (DeepSeek-V3 family): the bytes from the model's own tensors (decode_bytes'
      // closed form is MiniMax / Qwen3's GQA layout).
      const DecodeBytes d = mla ? model_decode_bytes(model, B, C, kv_elem)
                                : decode_bytes(s, model.shard(), 1, false, B, C, kv_elem);
      const double lm = double(s.vocab) * s.hidden * 2;
      const double bytes = layers * d.per_layer() + lm;
      const double floor_ms = bytes / roof.copy_bytes_per_s * 1e3;
      const double per_layer_ms = (ms - lm / roof.copy_bytes_per_s * 1e3) / layers;
      const double ms62 = per_layer_ms * s.total_layers + lm / roof.copy_bytes_per_s * 1e3;
      std::printf("%-6d %-7d %10.3f %12.1f %12.3f %8.1f%%\n", B, C, ms, B / (ms * 1e-3), floor_ms,
                  100.0 * floor_ms / ms);
      dec.push_back({{"batch", B},
                     {"context", C},
                     {"step_ms", ms},
                     {"tok_per_s", B / (ms * 1e-3)},
                     {"bytes_per_step", bytes},
                     {"floor_ms", floor_ms},
                     {"roofline_fraction", floor_ms / ms},
                     {"expected_distinct_experts", d.distinct},
                     {"measured_distinct_experts_last_layer", distinct.size()},
                     {"est_tok_per_s_62_layers", B / (ms62 * 1e-3)},
                     {"graph", opt.graphs},
                     {"kv_cache_dtype", dtype_name(kv_dtype)}});
    }
  }
  if (opt.verify_tokens.empty()) out["decode"] = dec;

  // ---- prefill ----
  if (opt.prefill_tokens > 0) {
    const int P = opt.prefill_tokens;
    step.plan({P}, {P});
    step.forward();
    b.synchronize();
    const double ms = timer.median_ms(std::max(1, std::min(opt.iters, 3)), [&] { step.forward(); });
    const double H = s.hidden, QW = double(s.q_heads) * s.head_dim, KW = double(s.kv_heads) * s.head_dim;
    const double proj = 2.0 * P * (QW * H + 2 * KW * H + H * QW);
    const double router = 2.0 * P * s.experts * H;
    const double experts = 2.0 * P * s.top_k * 3.0 * H * s.intermediate;
    const double attn = 2.0 * 2.0 * s.q_heads * s.head_dim * (double(P) * (P + 1) / 2);
    double flops = layers * (proj + router + experts + attn) + 2.0 * H * s.vocab;
    if (mla) {
      // MLA (FP8 checkpoints: a weight byte is a parameter): 2 P x the parameters a token uses
      // per layer (projections with kv_b applied once per token, the dense MLP or shared + top-k
      // experts, the f32 router), plus causal attention with decompressed K/V (qk = nope + rope,
      // v dims; the absorbed kernel runs 3.4x these FLOPs at 128 + 64 / 128).
      const DecodeBytes d1 = model_decode_bytes(model, 1, 0, kv_elem);
      const ModelDesc& md = model.desc();
      const double mla_attn = 2.0 * s.q_heads * (md.head_dim + md.v_head_dim) * (double(P) * (P + 1) / 2);
      flops = layers * (2.0 * P * (d1.attn_w + d1.experts + d1.router / 4) + mla_attn) + 2.0 * H * s.vocab;
    }
    const double floor_ms = roof.fp8_flops > 0 ? flops / roof.fp8_flops * 1e3 : 0;
    const double per_layer = ms / layers;
    std::printf("prefill %d tokens: %.1f ms (%.0f tok/s), FLOP floor %.1f ms at FP8 rate: %.1f%% ; TTFT %.1f ms "
                "(%d layers), est. %.0f ms for %d layers\n",
                P, ms, P / (ms * 1e-3), floor_ms, floor_ms > 0 ? 100.0 * floor_ms / ms : 0.0, ms, layers,
                per_layer * s.total_layers, s.total_layers);
    out["prefill"] = {{"tokens", P},
                      {"ms", ms},
                      {"tok_per_s", P / (ms * 1e-3)},
                      {"flops", flops},
                      {"floor_ms_fp8", floor_ms},
                      {"roofline_fraction_fp8", floor_ms > 0 ? floor_ms / ms : 0.0},
                      {"ttft_ms", ms},
                      {"est_ttft_ms_62_layers", per_layer * s.total_layers}};
  }
  write_report(out, opt.json_out);
  return 0;
}

}  // namespace moeserve::tools
