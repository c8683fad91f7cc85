// `moeserve bench-model`: model-level decode / prefill benchmark on the CUDA backend
// (src/tools/bench_model.h). Without CUDA support in the build it reports that and fails.
#include "cli/registry.h"
#include "core/error.h"

#ifdef MOESERVE_WITH_CUDA
#include "tools/bench_model.h"
#endif

namespace {
moeserve::cli::RegisterSubcommand reg(
    "bench-model", "Benchmark decode/prefill throughput against the GPU roofline", [](CLI::App* sub) {
#ifdef MOESERVE_WITH_CUDA
      auto opt = std::make_shared<moeserve::tools::BenchModelOptions>();
      sub->option_defaults()->group("Model");
      sub->add_option("--synthetic", opt->synthetic, "Random weights with a known model's shapes (minimax-m2.5, qwen3-30b-a3b; -tp: minimax-m2.5)");
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
      sub->option_defaults()->group("Engine");
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
        return moeserve::tools::run_bench_model(*opt);
      };
#else
      (void)sub;
      return []() -> int { moeserve::fail("bench-model needs a build with the CUDA backend (MOESERVE_CUDA=ON)"); };
#endif
    });
}  // namespace
