#include "cli/parallel_cli.h"

#include "core/error.h"
#include "core/log.h"
#include "backend/factory.h"
#ifdef MOESERVE_WITH_CUDA
#include "dist/nccl.h"
#include "runtime/device_sampler.h"
#endif

namespace moeserve::cli {

void add_parallel_flags(CLI::App* sub, ParallelFlags& f) {
  sub->add_option("--tensor-parallel-size", f.tensor_parallel,
                  "(-tp) ranks (GPUs) that split attention heads and experts")->capture_default_str();
  sub->add_flag("--enable-expert-parallel", f.expert_parallel,
                "experts owned whole by one rank each (EP) instead of sliced along the intermediate size");
  sub->add_option("--data-parallel-size", f.data_parallel, "(-dp) attention data parallelism (only 1 is implemented)")
      ->capture_default_str();
  sub->add_option("--nnodes", f.nnodes, "machines in the rank group (multi-node: see dist-check)")
      ->capture_default_str();
  sub->add_option("--node-rank", f.node_rank, "this machine's index in [0, nnodes)")->capture_default_str();
  sub->add_option("--master-addr", f.master_addr, "address of node 0 (NCCL id rendezvous)")->capture_default_str();
  sub->add_option("--master-port", f.master_port, "TCP port of the rendezvous on node 0")->capture_default_str();
}

std::unique_ptr<ModelExecutor> make_parallel_executor(const ParallelFlags& f, const ExecutorOptions& eo,
                                                      const std::string& device,
                                                      std::function<int(Backend&, int64_t)> kv_blocks) {
  MS_CHECK(f.nnodes == 1,
           "--nnodes {}: serving across machines is not implemented (the engine does not send steps to other "
           "nodes); the multi-node NCCL bootstrap can be checked with `moeserve dist-check --nnodes N ...`",
           f.nnodes);
  ParallelLayout layout;
  layout.tensor_parallel = f.tensor_parallel;
  layout.expert_parallel = f.expert_parallel;
  layout.data_parallel = f.data_parallel;
  if (device == "cpu") {
    spdlog::info("cpu: {} tensor-parallel ranks{} over the in-process communicator", f.tensor_parallel,
                 f.expert_parallel ? " (experts: EP)" : "");
    return make_cpu_parallel_executor(eo, layout);
  }
#ifdef MOESERVE_WITH_CUDA
  MS_CHECK(device == "cuda", "--device {}: expected cpu or cuda", device);
  layout.available_devices = backend_device_count("cuda");
  MS_CHECK(layout.available_devices > 0, "--device cuda: no CUDA device is visible");
  ParallelExecutorOptions o;
  o.exec = eo;
  o.layout = layout;
  const int world = f.tensor_parallel;
  const NcclUniqueId id = world > 1 ? nccl_unique_id() : NcclUniqueId{};
  o.make_backend = [](int r) -> std::unique_ptr<Backend> { return make_backend("cuda", r); };
  auto p2p = p2p_all_reduce_from_env(world);  // opt-in: MOESERVE_P2P_ALLREDUCE=1
  o.make_comm = [id, world, p2p](int r, Backend& b) -> std::unique_ptr<Communicator> {
    // Collectives go on the rank's own stream (the backend's DeviceQueue), ordered with its
    // kernels and captured into its decode graphs.
    DeviceQueue q;
    MS_CHECK(b.device_queue(&q), "rank {}: backend {} has no device queue for NCCL", r, b.name());
    return make_nccl_communicator(NcclRank{id, world, r, q.device, q.native, p2p});
  };
  o.kv_blocks_for_memory = std::move(kv_blocks);
  // Decode graphs run per rank (NCCL all-reduces captured inside); rank 0 samples on its GPU.
  o.make_device_sampler = [](Backend& b) { return backend_device_sampler(b); };
  spdlog::info("cuda: {} tensor-parallel ranks on GPUs 0..{}{} over NCCL (NCCL_NVLS_ENABLE={})", world, world - 1,
               f.expert_parallel ? " (experts: EP)" : "",
               std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "0 (default here)");
  return std::make_unique<ParallelExecutor>(std::move(o));
#else
  (void)kv_blocks;
  fail("--device {}: this build has no CUDA backend; tensor parallelism runs on cpu only", device);
#endif
}

}  // namespace moeserve::cli
