// `moeserve dist-check`: runs every collective over NCCL and checks the results, on this
// machine's GPUs (one thread per GPU) or across processes / machines:
//   moeserve dist-check                                   all visible GPUs of this machine
//   moeserve dist-check --nnodes 2 --node-rank R --master-addr HOST [--master-port P]
//                                                         each node runs its GPUs; TCP rendezvous
//   mpirun -np N moeserve dist-check                      one GPU per process (OMPI_* env;
//                                                         MASTER_ADDR / MASTER_PORT)
// Prints one line per rank with the small (decode-sized) and 64 MiB all-reduce times.
#include <cstdio>
#include <thread>

#include "cli/parallel_cli.h"
#include "cli/registry.h"
#include "core/error.h"
#ifdef MOESERVE_WITH_CUDA
#include "backend/factory.h"
#include "dist/in_process.h"
#include "dist/nccl.h"
#endif

namespace {
using namespace moeserve;

struct Args {
  cli::ParallelFlags par;
  int gpus_per_node = 0;
};

int run(const Args& a) {
#ifdef MOESERVE_WITH_CUDA
  const int visible = backend_device_count("cuda");
  MS_CHECK(visible > 0, "dist-check: no CUDA device is visible");
  NcclBootstrap b;
  int local = a.gpus_per_node > 0 ? a.gpus_per_node : visible;
  int first_device = 0;
  if (auto mpi = nccl_bootstrap_from_mpi_env()) {
    b = *mpi;
    local = 1;
    first_device = b.local_rank % visible;
  } else {
    b.num_processes = a.par.nnodes;
    b.process_rank = a.par.node_rank;
    b.master_addr = a.par.master_addr;
    b.master_port = a.par.master_port;
  }
  MS_CHECK(local <= visible, "--gpus-per-node {}: only {} GPUs are visible", local, visible);
  const int world = b.num_processes * local;
  const NcclUniqueId mine = b.process_rank == 0 ? nccl_unique_id() : NcclUniqueId{};
  const NcclUniqueId id = nccl_rendezvous(b, mine);
  std::vector<CollectiveCheckResult> res(static_cast<size_t>(local));
  std::vector<std::exception_ptr> err(static_cast<size_t>(local));
  std::vector<std::thread> th;
  for (int l = 0; l < local; ++l)
    th.emplace_back([&, l] {
      try {
        // Its own stream on the GPU (no model backend): check_nccl_collectives makes it.
        NcclRank rank{id, world, b.process_rank * local + l, first_device + l, nullptr, nullptr};
        res[size_t(l)] = check_nccl_collectives(rank, size_t(64) << 20);
      } catch (...) {
        err[size_t(l)] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  if (auto e = first_root_cause(err)) std::rethrow_exception(e);
  int failed = 0;
  for (int l = 0; l < local; ++l) {
    const auto& r = res[size_t(l)];
    for (const auto& f : r.failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
    failed += int(r.failures.size());
    std::printf("{\"rank\": %d, \"world\": %d, \"device\": %d, \"checks\": %d, \"failures\": %zu, "
                "\"allreduce_6KiB_us\": %.2f, \"allreduce_64MiB_us\": %.1f}\n",
                b.process_rank * local + l, world, first_device + l, r.checks, r.failures.size(),
                r.small_all_reduce_us, r.all_reduce_us);
  }
  return failed ? 1 : 0;
#else
  (void)a;
  fail("dist-check: this build has no CUDA/NCCL (configure with -DMOESERVE_CUDA=ON)");
#endif
}

moeserve::cli::RegisterSubcommand reg("dist-check", "Check NCCL collectives across GPUs, processes or nodes",
                                      [](CLI::App* sub) {
                                        auto a = std::make_shared<Args>();
                                        cli::add_parallel_flags(sub, a->par);
                                        sub->add_option("--gpus-per-node", a->gpus_per_node,
                                                        "GPUs this process drives (0: all visible)");
                                        return [a] { return run(*a); };
                                      });
}  // namespace
