// NCCL communicator (CUDA builds only): the Communicator of one GPU rank.
//
// Threading and streams: one communicator per rank; in moeserve's single-process layout
// each rank is a thread bound to one GPU (ParallelExecutor), and its communicator is bound
// to that rank's CudaBackend stream. Every collective is only *enqueued* on that stream
// (no host synchronisation, no allocation), so collectives are ordered with the model's
// kernels and may be captured into a CUDA graph. barrier() is the exception: it
// synchronises the stream.
//
// Creation is collective: all ranks of a group construct their NcclCommunicator at the same
// time (from their own threads or processes) with the same NcclUniqueId.
//
// NVLink multicast (NVLS) stays off: the constructor sets NCCL_NVLS_ENABLE=0 unless the
// environment already sets it, and nothing here calls cuMulticastCreate.
//
// NCCL cannot see cross-rank mismatches (different sizes on different ranks): those are
// undefined behaviour there (usually a hang); the in-process communicator, which runs the
// same model code on the CPU in CI, reports them. Local argument errors throw as usual.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "dist/communicator.h"
#include "dist/p2p_allreduce.h"

namespace moeserve {

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

class NcclCommunicator final : public Communicator {
 public:
  // Sets `device` current on the calling thread and joins the group (blocks until every
  // rank has joined). With `p2p` (the same object on every rank of a one-process group),
  // all-reduces it accepts (small F32/BF16) run as its one-shot kernel instead of NCCL.
  NcclCommunicator(const NcclUniqueId& id, int world, int rank, int device, cudaStream_t stream,
                   std::shared_ptr<P2pAllReduce> p2p = nullptr);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void all_reduce_sum(Tensor& t) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  void all_to_all(const Tensor& in, Tensor& out) override;
  void all_to_allv(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                   const std::vector<int64_t>& recv_counts) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;
  void abort(const std::string& reason) override;
  bool graph_capturable() const override { return true; }
  cudaStream_t stream() const { return stream_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<P2pAllReduce> p2p_;
  int world_ = 1, rank_ = 0, device_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace moeserve
