// The NCCL group of one process's ranks, as code above the backend uses it (serve/generate's
// -tp, dist-check): no CUDA or NCCL header, so cli/ stays free of device headers. The
// communicator itself is dist/nccl_communicator.h (CUDA builds, moeserve_dist_nccl).
//
// Each rank's communicator is bound to the device queue of that rank's backend, which the
// backend reports through its DeviceQueue capability (backend/capabilities.h): the caller
// passes DeviceQueue's device and native handle here (the CUDA stream, opaque above dist).
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace moeserve {

class P2pAllReduce;  // dist/p2p_allreduce.h (CUDA)

struct NcclUniqueId {
  std::array<char, 128> bytes{};
};
NcclUniqueId nccl_unique_id();  // ncclGetUniqueId (NCCL's own bootstrap address inside)

// Multi-process / multi-node bootstrap: the process that holds global rank 0 creates the
// id and serves it over TCP on master_addr:master_port to the other num_processes - 1
// processes (vLLM / torchrun style flags --nnodes --node-rank --master-addr --master-port).
struct NcclBootstrap {
  int num_processes = 1;  // nnodes, or the MPI world size for one process per GPU
  int process_rank = 0;   // node rank, or the MPI rank
  int local_rank = 0;     // GPU of this process when it runs one rank (MPI)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int timeout_s = 300;    // how long clients retry connecting / the server waits
};
// Process 0: serves `id` to everyone and returns it. Others: connect (retrying until the
// timeout) and return the id they received. Throws naming the address on failure.
NcclUniqueId nccl_rendezvous(const NcclBootstrap& b, const NcclUniqueId& id_if_root);
// Under mpirun (Open MPI: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; also PMI_RANK /
// PMI_SIZE / MPI_LOCALRANKID): one rank per process; master address and port from
// MASTER_ADDR / MASTER_PORT (defaults 127.0.0.1:29500). nullopt when not under MPI.
// Does not link MPI.
std::optional<NcclBootstrap> nccl_bootstrap_from_mpi_env();

// The one-shot small-message all-reduce for GPUs 0..world-1 of this process when
// MOESERVE_P2P_ALLREDUCE=1 (opt-in while it is new) and every pair has peer access; else null.
std::shared_ptr<P2pAllReduce> p2p_all_reduce_from_env(int world);

// One rank of a group: which group, which rank, and the device queue its collectives are
// enqueued on (a backend's DeviceQueue: device index and native handle, cudaStream_t).
struct NcclRank {
  NcclUniqueId id;
  int world = 1;
  int rank = 0;
  int device = 0;
  void* stream = nullptr;  // must not be null: the collectives are ordered with this queue's work
  std::shared_ptr<P2pAllReduce> p2p;  // optional: the same object on every rank (one process)
};
// Joins the group (collective: every rank constructs at the same time). Throws naming the rank.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclRank& r);

// dist/collective_check.h's result: every collective checked on device memory, plus timings.
struct CollectiveCheckResult {
  std::vector<std::string> failures;  // empty: all passed
  int checks = 0;
  double all_reduce_us = 0;        // mean time of a bench_bytes BF16 all-reduce
  double small_all_reduce_us = 0;  // mean time of a 6 KiB BF16 all-reduce (a decode step's)
};
// `moeserve dist-check`'s rank: on its own stream of `r.device` (r.stream must be null: the
// check creates and destroys the stream), joins the group and runs check_collectives with
// bench_bytes. Collective like make_nccl_communicator.
CollectiveCheckResult check_nccl_collectives(const NcclRank& r, size_t bench_bytes);

}  // namespace moeserve
