// One-shot all-reduce for small messages between the GPUs of one process (peer access over
// NVLink / PCIe), for decode: a BF16 hidden state of a few KiB is latency-bound, and one
// kernel that reads every peer's copy directly beats NCCL's ring/tree protocols there.
//
// Every rank owns, on its GPU: a buffer of 2 x max_bytes (two parities), a flag per peer and
// an epoch counter. A call (one block on the rank's stream): read the epoch e from device
// memory (so a captured CUDA graph replays correctly), copy the input into its buffer parity
// e & 1, fence, write e into its flag slot on every peer, spin until every peer's flag for
// it reaches e, then sum every rank's buffer in rank order in f32 (bit-identical on every
// rank), round once, store, and bump the epoch. Parities make it safe to start call e + 1
// while a slower peer still reads call e: a rank cannot reach call e + 2 (same parity)
// before every peer has announced e + 1, i.e. finished reading e.
//
// All ranks must issue the same sequence of calls (as for every collective); a call never
// returns on the device if a peer never issues it (same as NCCL).
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace moeserve {

class P2pAllReduce {
 public:
  // Enables peer access between all `devices` (device i = rank i) and allocates the
  // buffers. Returns null when some pair cannot access each other or world > 8.
  static std::shared_ptr<P2pAllReduce> create(const std::vector<int>& devices, size_t max_bytes = 64 << 10);
  ~P2pAllReduce();
  int world() const { return int(devices_.size()); }
  size_t max_bytes() const { return max_bytes_; }
  // Whether `t` goes this way (F32 / BF16 and at most max_bytes).
  bool accepts(const Tensor& t) const;
  // In-place sum of rank `rank`'s device tensor `t` over all ranks, enqueued on `stream`.
  void all_reduce(int rank, Tensor& t, cudaStream_t stream);

 private:
  P2pAllReduce() = default;
  std::vector<int> devices_;
  size_t max_bytes_ = 0;
  std::vector<void*> bufs_;        // per rank, on its device: [2][max_bytes]
  std::vector<unsigned*> flags_;   // per rank, on its device: [world] last epoch each peer announced
  std::vector<unsigned*> epochs_;  // per rank, on its device: calls completed
};

}  // namespace moeserve
