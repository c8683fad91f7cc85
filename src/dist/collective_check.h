// A self-check of every collective of a Communicator on device (NCCL) memory: each rank
// fills deterministic inputs, runs all_reduce (F32, BF16), all_gather, reduce_scatter,
// all_to_all, all_to_allv (uneven, with empty blocks), broadcast and barrier, and compares
// with the values it can compute alone. Used by the multigpu tests (one process, a thread
// per GPU) and by `moeserve dist-check` (one process per GPU or per node, TCP rendezvous).
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/nccl.h"  // CollectiveCheckResult

namespace moeserve {

// `stream` must be the communicator's stream; `device` is current on the calling thread.
// bench_bytes > 0 also times all-reduces of that many BF16 bytes (results in all_reduce_us).
CollectiveCheckResult check_collectives(Communicator& comm, cudaStream_t stream, size_t bench_bytes = 0);

}  // namespace moeserve
