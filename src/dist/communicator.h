// Communicator: collectives across the ranks of one tensor/expert-parallel group.
//
// Every rank calls the same collectives in the same order with tensors of the same shape
// and dtype (SPMD). Tensors live on the communicator's device: host memory for the
// in-process implementation (dist/in_process.h), device memory for NCCL
// (dist/nccl_communicator.h, where every call is only enqueued on the rank's CUDA stream:
// stream-ordered, no host synchronisation, safe inside CUDA graph capture).
//
// Errors: argument errors a rank can see alone (wrong device, dtype, sizes against its
// own arguments) throw moeserve::Error before anything is exchanged. A mismatch *between*
// ranks (different numel or dtype) is detected by the in-process implementation and
// reported on every rank as Error; NCCL cannot see it (documented there).
//
// Layout conventions (n = per-rank block numel, W = world_size):
//   all_gather      in [n]           -> out [W * n]   out block r = rank r's in
//   reduce_scatter  in [W * n]       -> out [n]       out = sum over ranks of their in block `rank`
//   all_to_all      in [W * n]       -> out [W * n]   out block j = rank j's in block `rank`
//   all_to_allv     like all_to_all with per-peer element counts (blocks packed in rank order)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moeserve {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // t = sum over ranks of t, in place. F32 or BF16 (BF16 sums are rounded once per
  // reduction step; the in-process implementation sums in f32 and rounds once). Every rank
  // gets bit-identical values.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // out = concatenation of every rank's `in` in rank order: out.numel() ==
  // world_size * in.numel(), same dtype (any). For [T, n] inputs and [world, T, n] outputs
  // rank r's block is out[r].
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // out = sum over ranks of block `rank()` of their `in`: in.numel() == world * out.numel().
  // F32 or BF16. The all-reduce of a row-parallel output that feeds a sharded op.
  virtual void reduce_scatter_sum(const Tensor& in, Tensor& out) = 0;
  // Equal-block exchange: in and out hold world * n elements of the same dtype (any);
  // block j of this rank's `in` goes to rank j, block j of `out` comes from rank j.
  // in and out must not overlap (NCCL cannot exchange in place).
  virtual void all_to_all(const Tensor& in, Tensor& out) = 0;
  // Variable-block exchange (expert-parallel token dispatch/combine). send_counts[j]
  // elements go to rank j, taken from `in` in rank order; recv_counts[j] elements come from
  // rank j, stored in `out` in rank order. Counts are host values; rank i's send_counts[j]
  // must equal rank j's recv_counts[i]. in.numel() >= sum(send), out.numel() >= sum(recv).
  virtual void all_to_allv(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                           const std::vector<int64_t>& recv_counts) = 0;
  // t = root's t on every rank (any dtype).
  virtual void broadcast(Tensor& t, int root) = 0;
  // Returns once every rank has called barrier() (NCCL: once this rank's stream has
  // passed a collective every rank joined; synchronises the stream).
  virtual void barrier() = 0;
  // Best effort: makes pending and later collectives of every rank fail instead of hang
  // (called when one rank of a group throws). Idempotent.
  virtual void abort(const std::string& /*reason*/) {}
  // True when all_reduce_sum only enqueues work on the backend's stream (no host code, no
  // host sync), so a model step with its all-reduces may be captured into a CUDA graph and
  // replayed by every rank (NCCL; the in-process group runs host code and cannot).
  virtual bool graph_capturable() const { return false; }
};

}  // namespace moeserve
