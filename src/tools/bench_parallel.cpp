// bench-model -tp N [--enable-expert-parallel]: MiniMaxM2Model with synthetic MiniMax-M2.5
// weights split over N GPUs of this machine, one thread + CudaBackend + NCCL communicator +
// MiniMaxM2Model rank (ParallelConfig{rank, N, ep}, all-reduce on that rank's communicator)
// per GPU; each rank generates its own weight slices on its GPU (make_synthetic_weights per
// plan_shard). Each decode step is planned by BenchStep into fixed buffers and captured as one
// CUDA graph per rank on that rank's stream (the NCCL all-reduces are captured with the
// kernels); all ranks replay together and the step time is the slowest rank's median.
// --no-graphs times the eager step instead (each rank launching its kernels and collectives).
// Roofline: aggregate bandwidth = the sum of every GPU's measured copy bandwidth; bytes =
// what all ranks together must read per step (each rank's attention slice, the replicated
// router, its experts or expert slices, its KV heads; the lm_head once, on rank 0).
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/kv_cache_dtype.h"
#include "core/log.h"
#include "dist/in_process.h"
#include "dist/nccl_communicator.h"
#include "tools/bench_model.h"
#include "tools/bench_synth.h"

namespace moeserve::tools {
namespace {

struct Config {
  int batch, context;
};

}  // namespace

int run_bench_model_parallel(const BenchModelOptions& opt) {
  const int W = opt.tensor_parallel;
  const int visible = cuda_device_count();
  MS_CHECK(W <= visible, "bench-model: --tensor-parallel-size {} needs {} GPUs but only {} are visible", W, W,
           visible);
  MS_CHECK(opt.data_parallel == 1, "bench-model: --data-parallel-size {}: only 1 is implemented", opt.data_parallel);
  MS_CHECK(parse_kv_cache_dtype(opt.kv_cache_dtype) == KvCacheDtype::Auto,
           "bench-model: --kv-cache-dtype {} with --tensor-parallel-size {} is not implemented (the -tp bench keeps a "
           "bf16 cache); measure the FP8 KV cache on one GPU",
           opt.kv_cache_dtype, W);
  const SynthShapes s;
  const MiniMaxM2Config cfg = synth_config(s, opt.layers);
  // The layout, checked once up front with the messages serve gives (heads / experts /
  // expert intermediate must split, FP8 slices must be whole 128 blocks for the kernels).
  const ParallelConfig par0{0, W, opt.expert_parallel};
  MiniMaxM2Shard shard;  // every rank's part has these sizes
  try {
    shard = plan_shard(cfg, par0);
  } catch (const Error& e) {
    fail("bench-model: --tensor-parallel-size {}{}: {}", W, opt.expert_parallel ? " --enable-expert-parallel" : "",
         e.what());
  }
  const std::string split = fp8_split_problem(cfg, par0);
  MS_CHECK(split.empty(), "bench-model: --tensor-parallel-size {}: {}", W, split);
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  const int max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end());
  const int bs = opt.block_size;
  const int max_blocks = (max_ctx + bs - 1) / bs + 1;
  std::vector<Config> configs;
  for (int C : opt.contexts)
    for (int B : opt.batches) configs.push_back({B, C});

  const NcclUniqueId id = nccl_unique_id();
  const auto p2p = p2p_all_reduce_from_env(W);  // MOESERVE_P2P_ALLREDUCE=1
  // Host barrier of the rank threads (an in-process group: a failing rank aborts it, so no rank
  // waits forever).
  InProcessGroup host(W);
  std::vector<double> copy_bw(static_cast<size_t>(W)), weight_gb(static_cast<size_t>(W));
  std::vector<int64_t> kv_blocks(static_cast<size_t>(W));
  std::vector<std::vector<double>> step_ms(size_t(W), std::vector<double>(configs.size(), -1));
  std::vector<std::exception_ptr> err(static_cast<size_t>(W));
  std::vector<NcclCommunicator*> comms(size_t(W), nullptr);
  std::mutex comms_mu;
  std::string gpu;

  auto rank_main = [&](int r) {
    const std::unique_ptr<Communicator> barrier = host.communicator(r);
    auto backend = make_cuda_backend(r);
    CudaBackend& b = *backend;
    NcclCommunicator comm(id, W, r, r, b.stream(), p2p);
    {
      std::lock_guard<std::mutex> lk(comms_mu);
      comms[size_t(r)] = &comm;
    }
    struct Unregister {
      std::mutex& mu;
      NcclCommunicator*& slot;
      ~Unregister() {
        std::lock_guard<std::mutex> lk(mu);
        slot = nullptr;
      }
    } unregister{comms_mu, comms[size_t(r)]};
    copy_bw[size_t(r)] = measure_roofline(b.stream()).copy_bytes_per_s;
    const ParallelConfig par{r, W, opt.expert_parallel};
    MiniMaxM2Model model(cfg, b, par, [&comm](Tensor& t) { comm.all_reduce_sum(t); });
    // Only rank 0 computes logits (lm_head read once per step, as the executor does).
    weight_gb[size_t(r)] = make_synthetic_weights(b, model, 1000, /*lm_head=*/r == 0) / 1e9;
    const MiniMaxM2Shard& sh = model.shard();
    if (r == 0) gpu = b.device_name();
    BenchStep step(b, model, max_batch, max_batch, max_blocks);
    step.set_logits(r == 0);
    b.synchronize();
    size_t free_b = 0, total_b = 0;
    b.mem_info(&free_b, &total_b);
    const double budget = double(total_b) * opt.gpu_memory_utilization - double(total_b - free_b) - 1e9;
    const double kv_token_layer = double(sh.kv_heads) * s.head_dim * 2 * 2;
    kv_blocks[size_t(r)] = std::max<int64_t>(0, int64_t(budget / (kv_token_layer * bs * opt.layers)));
    barrier->barrier();
    int64_t need = max_blocks;
    for (int C : opt.contexts) need = std::max(need, int64_t(max_batch) * ((C + bs - 1) / bs));
    const int64_t pool = std::min(*std::min_element(kv_blocks.begin(), kv_blocks.end()), need);
    MS_CHECK(pool >= max_blocks, "bench-model: not enough memory on GPU {} for the KV cache of one sequence", r);
    step.alloc_kv(int(pool), bs);
    b.synchronize();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (size_t c = 0; c < configs.size(); ++c) {
      const auto [B, C] = configs[c];
      if (int64_t(B) * ((C + bs - 1) / bs) > pool) continue;  // same decision on every rank
      step.plan(std::vector<int>(size_t(B), 1), std::vector<int>(size_t(B), C));
      step.forward();  // eager: sizes workspaces, builds expert tables
      b.synchronize();
      // --no-graphs: the eager step (host launches included), i.e. what a rank of the
      // executor ran per decode step before the executor captured graphs under -tp.
      CudaGraph g;
      if (opt.graphs) {
        b.begin_capture();
        step.forward();
        g = b.end_capture();
        g.replay(b.stream());
      } else {
        step.forward();
      }
      b.synchronize();
      std::vector<float> t;
      for (int i = 0; i < opt.iters; ++i) {
        barrier->barrier();  // start together: the collectives couple the ranks anyway
        cudaEventRecord(e0, b.stream());
        if (opt.graphs)
          g.replay(b.stream());
        else
          step.forward();
        cudaEventRecord(e1, b.stream());
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms);
      }
      std::sort(t.begin(), t.end());
      step_ms[size_t(r)][c] = t[t.size() / 2];
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    barrier->barrier();
  };
  std::vector<std::thread> th;
  for (int r = 0; r < W; ++r)
    th.emplace_back([&, r] {
      try {
        rank_main(r);
      } catch (const std::exception& e) {
        err[size_t(r)] = std::current_exception();
        host.abort("another rank failed");
        std::lock_guard<std::mutex> lk(comms_mu);
        for (auto* c : comms)
          if (c) c->abort(e.what());
      }
    });
  for (auto& t : th) t.join();
  if (auto e = first_root_cause(err)) std::rethrow_exception(e);

  double agg_bw = 0;
  for (double x : copy_bw) agg_bw += x;
  nlohmann::json out;
  out["command"] = opt.command_line;
  out["gpu"] = gpu;
  out["gpus"] = W;
  out["tensor_parallel"] = W;
  out["expert_parallel"] = opt.expert_parallel;
  out["p2p_all_reduce_bytes"] = p2p ? int64_t(p2p->max_bytes()) : 0;
  out["layers"] = opt.layers;
  out["graphs"] = opt.graphs;
  out["model"] = "minimax-m2.5 (synthetic weights)";
  out["per_rank"] = {{"q_heads", shard.q_heads},
                     {"kv_heads", shard.kv_heads},
                     {"experts", shard.num_experts},
                     {"intermediate", shard.expert_inter},
                     {"weights_GB", weight_gb}};
  out["roofline"] = {{"copy_GBps_per_gpu", copy_bw}, {"aggregate_copy_GBps", agg_bw / 1e9}};
  nlohmann::json dec = nlohmann::json::array();
  std::printf("TP=%d%s, %d layers, aggregate copy bandwidth %.0f GB/s, small all-reduces on %s, decode %s\n", W,
              opt.expert_parallel ? " +EP" : "", opt.layers, agg_bw / 1e9, p2p ? "the p2p kernel" : "NCCL",
              opt.graphs ? "as one CUDA graph per rank" : "eager (--no-graphs)");
  std::printf("%-6s %-7s %10s %12s %12s %9s\n", "batch", "context", "step_ms", "tok/s", "floor_ms", "roofline");
  for (size_t c = 0; c < configs.size(); ++c) {
    double ms = 0;
    for (int r = 0; r < W; ++r) ms = std::max(ms, step_ms[size_t(r)][c]);
    const auto [B, C] = configs[c];
    if (ms <= 0) {
      spdlog::warn("decode B={} C={}: skipped (KV pool too small)", B, C);
      continue;
    }
    const DecodeBytes d = decode_bytes(s, shard, W, opt.expert_parallel, B, C);
    const double lm = double(s.vocab) * s.hidden * 2;
    const double bytes = opt.layers * d.per_layer() + lm;
    const double floor_ms = bytes / agg_bw * 1e3;
    const double per_layer_ms = (ms - lm / agg_bw * 1e3) / opt.layers;
    const double ms62 = per_layer_ms * s.total_layers + lm / agg_bw * 1e3;
    std::printf("%-6d %-7d %10.3f %12.1f %12.3f %8.1f%%\n", B, C, ms, B / (ms * 1e-3), floor_ms, 100.0 * floor_ms / ms);
    dec.push_back({{"batch", B},
                   {"context", C},
                   {"step_ms", ms},
                   {"tok_per_s", B / (ms * 1e-3)},
                   {"bytes_per_step_all_gpus", bytes},
                   {"floor_ms", floor_ms},
                   {"roofline_fraction", floor_ms / ms},
                   {"est_tok_per_s_62_layers", B / (ms62 * 1e-3)},
                   {"graph", true}});
  }
  out["decode"] = dec;
  out["prefill"] = "not measured with --tensor-parallel-size > 1";
  write_report(out, opt.json_out);
  return 0;
}

}  // namespace moeserve::tools
