// `moeserve bench-model`: decode and prefill throughput of MiniMaxM2Model (synthetic M2.5-shaped
// weights or a checkpoint) on one GPU, against the roofline measured at start (copy bandwidth,
// FP8 matrix rate).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moeserve::tools {

struct BenchModelOptions {
  std::string synthetic;   // "minimax-m2.5"
  // --explain-dispatch: print the kernel selectors' choice per op for the decode buckets and
  // prefill sizes on --device-profile (tools/explain_dispatch.h; no GPU needed) and exit;
  // --markdown: the CUDA README's generated op table instead.
  bool explain_dispatch = false, explain_markdown = false;
  std::string device_profile = "h200";
  std::string checkpoint;  // checkpoint dir, loaded through MiniMaxM2Model::load
  int layers = 0;          // 0: 4 synthetic layers / every layer of the checkpoint
  int warmup_ms = 0;       // replay each decode graph for about this long before timing it
  std::vector<int> batches = {1, 8, 32, 64, 128, 256};
  std::vector<int> contexts = {1024, 8192};
  int prefill_tokens = 8192;
  int iters = 10;
  int block_size = 16;
  // --kv-cache-dtype: auto (bf16) | fp8 | fp8_e4m3 (e4m3 K/V, scales 1.0 on random weights).
  std::string kv_cache_dtype = "auto";
  double gpu_memory_utilization = 0.9;
  bool graphs = true;
  // Per-op time breakdown (eager, an event after each op, summed over layers) for these
  // batch sizes at the first context, plus the prefill; empty: no profile.
  std::vector<int> profile_batches;
  // Linear layers use the GEMV path up to this many rows (CudaBackend::linear_gemv_max_tokens);
  // 0: the backend default.
  int linear_gemv_max_tokens = 0;
  // -tp N [--enable-expert-parallel]: the stack split over N GPUs (bench_parallel.cpp);
  // decode only, every step a CUDA graph.
  int tensor_parallel = 1;
  bool expert_parallel = false;
  int data_parallel = 1;
  // --device: cuda (bench_model.cpp) or cpu (bench_verify.cpp: the CPU reference backend, wall
  // clock, decode / verify rows only).
  std::string device = "cuda";
  // --verify-tokens K...: per (batch, context) a row for each k, every sequence with 1 + k query
  // tokens at its context (positions C - 1 .. C + k - 1, logits of all of them); 0 = the plain
  // decode row. Empty: the plain decode table (CUDA) / k = 0 only (CPU).
  std::vector<int> verify_tokens;
  // --routing-overlap P: synthetic routing of verify rows (bench_verify.h synth_verify_routing);
  // < 0: the router's own (random weights: near-uniform, independent between tokens).
  double routing_overlap = -1;
  uint64_t routing_seed = 1;
  // --measure-routing-overlap PROMPTS (CPU, a checkpoint): the routing overlap measurement
  // instead of timing, with this many greedy tokens per prompt.
  std::string measure_routing_overlap;
  int overlap_decode_tokens = 64;
  std::string json_out;  // also printed to stdout when empty
  std::string command_line;
};

int run_bench_model(const BenchModelOptions& opt);  // CUDA builds; --device cpu goes to:
// The CPU reference backend (bench_model_cpu.cpp, every build): --synthetic NAME (random weights
// from the declarations) or a checkpoint, decode / verify rows timed by the wall clock (no
// roofline, prefill or graphs); with --measure-routing-overlap that measurement instead.
int run_bench_model_cpu(const BenchModelOptions& opt);
int run_bench_model_parallel(const BenchModelOptions& opt);  // tensor_parallel > 1
// Refuses bad --verify-tokens / --routing-overlap / --device values (before anything loads).
void check_verify_options(const BenchModelOptions& opt);
// The JSON report to `path`, or to stdout when empty.
void write_report(const nlohmann::json& report, const std::string& path);

// Measured ceilings of the current device.
struct Roofline {
  double copy_bytes_per_s = 0;  // device-to-device copy, bytes read + written
  double fp8_flops = 0;         // dense FP8 GEMM (cuBLASLt), 0 if unavailable
  double bf16_flops = 0;
  std::string fp8_note;
};
Roofline measure_roofline(void* stream);

}  // namespace moeserve::tools
