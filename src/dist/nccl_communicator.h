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

#include <memory>

#include "dist/communicator.h"
#include "dist/nccl.h"
#include "dist/p2p_allreduce.h"

namespace moeserve {

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
