// `moeserve bench-model`: model-level decode / prefill / verify benchmark on the CUDA backend
// (src/tools/bench_model.h), or decode / verify rows on the CPU reference (--device cpu,
// src/tools/bench_verify.h). Without CUDA support in the build only --device cpu runs.
#include "cli/registry.h"
#include "core/error.h"
#include "tools/bench_model.h"
#include "tools/explain_dispatch.h"

#include <fmt/format.h>

namespace {
moeserve::cli::RegisterSubcommand reg(
    "bench-model", "Benchmark decode/prefill throughput against the GPU roofline", [](CLI::App* sub) {
      auto opt = std::make_shared<moeserve::tools::BenchModelOptions>();
      sub->option_defaults()->group("Model");
      sub->add_option("--synthetic", opt->synthetic,
                      "Random weights with a known model's shapes (minimax-m2.5, qwen3-30b-a3b, deepseek-v3, kimi-k2.5 (INT4 "
                      "experts), kimi-k2.5-fp8, minimax-m2-tiny; -tp: minimax-m2.5)");
      sub->add_option("model", opt->checkpoint, "Checkpoint directory (instead of --synthetic)");
      sub->add_option("--checkpoint", opt->checkpoint, "Checkpoint directory (same as the positional argument)");
      sub->add_option("--layers", opt->layers, "Decoder layers (0: 4 synthetic / all of a checkpoint)")
          ->capture_default_str();
      sub->option_defaults()->group("Workload");
      sub->add_option("--batch-sizes", opt->batches, "Decode batch sizes")->capture_default_str();
      sub->add_option("--contexts", opt->contexts, "Decode context lengths")->capture_default_str();
      sub->add_option("--prefill-tokens", opt->prefill_tokens, "Prompt length for prefill/TTFT (0: skip)")
          ->capture_default_str();
      sub->add_option("--iters", opt->iters, "Timed repetitions (median)")->capture_default_str();
      sub->add_option("--warmup-ms", opt->warmup_ms, "Replay each decode graph ~this long before timing (GPU clocks)")
          ->capture_default_str();
      sub->add_option("--verify-tokens", opt->verify_tokens,
                      "Speculative verify rows: for each k, every sequence has 1 + k query tokens at its context "
                      "(0 = the decode row; replaces the decode table)");
      sub->add_option("--routing-overlap", opt->routing_overlap,
                      "Synthetic routing of verify rows: each token keeps this fraction of the previous token's "
                      "top-k experts per layer, the rest random distinct (default: the router's)");
      sub->add_option("--routing-seed", opt->routing_seed, "Seed of the synthetic routing")->capture_default_str();
      sub->add_option("--measure-routing-overlap", opt->measure_routing_overlap,
                      "Instead of timing: run these prompts (JSON token-id lists) through a checkpoint on the CPU "
                      "and report the router's overlap between consecutive tokens");
      sub->add_option("--overlap-decode-tokens", opt->overlap_decode_tokens,
                      "Greedy tokens per prompt for --measure-routing-overlap")
          ->capture_default_str();
      sub->option_defaults()->group("Engine");
      sub->add_option("--device", opt->device, "cuda, or cpu (the reference backend: decode / verify rows only)")
          ->capture_default_str();
      sub->add_option("--block-size", opt->block_size, "KV block size")->capture_default_str();
      sub->add_option("--kv-cache-dtype", opt->kv_cache_dtype,
                      "auto (bf16) | fp8 | fp8_e4m3: the KV cache's dtype (FP8: e4m3, scales 1.0)")
          ->capture_default_str();
      sub->add_option("--gpu-memory-utilization", opt->gpu_memory_utilization, "Fraction of GPU memory to use")
          ->capture_default_str();
      sub->add_flag("!--no-graphs", opt->graphs, "Run decode eagerly instead of as CUDA graphs");
      sub->add_option("--profile", opt->profile_batches, "Per-op time breakdown at these batch sizes (eager)");
      sub->add_option("--linear-gemv-max-tokens", opt->linear_gemv_max_tokens,
                      "Rows up to which linears use the GEMV path (0: backend default)");
      sub->option_defaults()->group("Parallelism");
      sub->add_option("--tensor-parallel-size", opt->tensor_parallel, "(-tp) GPUs the stack is split over")
          ->capture_default_str();
      sub->add_flag("--enable-expert-parallel", opt->expert_parallel, "experts whole per GPU (EP) instead of sliced");
      sub->add_option("--data-parallel-size", opt->data_parallel, "(-dp) attention data parallelism (only 1)")
          ->capture_default_str();
      sub->option_defaults()->group("Dispatch");
      sub->add_flag("--explain-dispatch", opt->explain_dispatch,
                    "Print the CUDA kernel chosen per op for the decode buckets (1..256) and prefill sizes "
                    "(512..8192) of --synthetic (default minimax-m2.5) on --device-profile, and exit (no GPU needed)");
      sub->add_option("--device-profile", opt->device_profile, "Device for --explain-dispatch: h200 or sm120")
          ->capture_default_str();
      sub->add_flag("--markdown", opt->explain_markdown,
                    "With --explain-dispatch: the op table section of src/backend/cuda/README.md (every golden model)");
      sub->option_defaults()->group("Output");
      sub->add_option("--json", opt->json_out, "Write the JSON report here (default: stdout)");
      return [opt, sub]() {
        std::string cmd = "moeserve bench-model";
        for (const auto& o : sub->get_options())
          if (o->count() > 0) {
            cmd += " " + o->get_name();
            for (const auto& r : o->results()) cmd += " " + r;
          }
        opt->command_line = cmd;
        if (opt->explain_dispatch) {
          fmt::print("{}", opt->explain_markdown
                               ? moeserve::tools::explain_dispatch_markdown()
                               : moeserve::tools::explain_dispatch(opt->synthetic.empty() ? "minimax-m2.5" : opt->synthetic,
                                                                   opt->device_profile));
          return 0;
        }
#ifdef MOESERVE_WITH_CUDA
        return moeserve::tools::run_bench_model(*opt);
#else
        moeserve::tools::check_verify_options(*opt);
        if (opt->device == "cpu") return moeserve::tools::run_bench_model_cpu(*opt);
        moeserve::fail("bench-model --device cuda needs a build with the CUDA backend (MOESERVE_CUDA=ON); --device cpu "
                       "runs on the CPU reference");
#endif
      };
    });
}  // namespace
