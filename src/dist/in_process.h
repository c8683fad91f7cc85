// In-process communicator: N ranks of one process, each on its own thread, exchanging
// host tensors through shared memory. Used by CPU tests of tensor and expert parallelism.
//
//   InProcessGroup group(2);
//   run_ranks(group, [&](Communicator& comm) { ... comm.all_reduce_sum(x); ... });
//
// Every collective of communicator.h: all_reduce_sum / reduce_scatter_sum (F32, BF16: f32
// sums in rank order, rounded once), all_gather, all_to_all, all_to_allv, broadcast, barrier.
//
// Collectives are built from a generation barrier: each rank publishes a pointer to its
// buffer, waits, reads the others, waits again (so no buffer is reused while another rank
// still reads it). Sums are taken in rank order, so every rank gets bit-identical values.
// If one rank fails, abort() wakes every waiting rank with an Error instead of a hang.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace moeserve {

class InProcessGroup {
 public:
  explicit InProcessGroup(int world_size);
  int world_size() const { return world_size_; }
  // The communicator of one rank (call once per rank; the group must outlive it).
  std::unique_ptr<Communicator> communicator(int rank);
  // Makes every current and future wait throw Error(reason). Idempotent.
  void abort(const std::string& reason);

 private:
  friend class InProcessCommunicator;
  // What one rank published for the collective in flight (checked against rank 0's).
  struct Slot {
    const char* op = "";
    const void* data = nullptr;
    DType dtype = DType::F32;
    int64_t numel = 0;
    const std::vector<int64_t>* send = nullptr;  // all_to_allv counts
    const std::vector<int64_t>* recv = nullptr;
    int root = -1;  // broadcast
  };
  void wait_all();  // the barrier
  const int world_size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<Slot> slots_;
};

// Runs fn(comm) for every rank of the group on its own thread and joins them. If any rank
// throws, the group is aborted (so the others do not wait forever) and the first
// exception is rethrown here.
void run_ranks(InProcessGroup& group, const std::function<void(Communicator&)>& fn);

// The first error of a failed multi-rank run that is not just "communicator aborted" (the
// echo of another rank's failure); null when there is none at all.
std::exception_ptr first_root_cause(const std::vector<std::exception_ptr>& errors);

}  // namespace moeserve
