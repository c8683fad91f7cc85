// Communicator: collectives across the ranks of one tensor/expert-parallel group.
//
// Every rank calls the same collectives in the same order with tensors of the same shape
// and dtype (SPMD). Tensors live on the communicator's device: host memory for the
// in-process implementation (dist/in_process.h), device memory for NCCL.
// A shape or dtype mismatch between ranks is reported on every rank as moeserve::Error.
#pragma once
#include "core/tensor.h"

namespace moeserve {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // t = sum over ranks of t, in place. F32 only. Every rank gets bit-identical values.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // out = concatenation of every rank's `in` in rank order: out.numel() ==
  // world_size * in.numel(), same dtype (any). For [T, n] inputs and [world, T, n] outputs
  // rank r's block is out[r].
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // Returns once every rank has called barrier().
  virtual void barrier() = 0;
};

}  // namespace moeserve
