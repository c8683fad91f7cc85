// The parallelism flags shared by `serve`, `generate` and `bench-model` (named as vLLM
// names them) and the executor they select.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "runtime/parallel_executor.h"

namespace moeserve::cli {

struct ParallelFlags {
  int tensor_parallel = 1;
  bool expert_parallel = false;
  int data_parallel = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool parallel() const { return tensor_parallel != 1 || data_parallel != 1 || nnodes != 1; }
};

// -tp/--tensor-parallel-size, --enable-expert-parallel, -dp/--data-parallel-size,
// --nnodes, --node-rank, --master-addr, --master-port.
void add_parallel_flags(CLI::App* sub, ParallelFlags& f);

// The executor for `device` ("cpu" or "cuda") over flags.tensor_parallel ranks on this
// machine: CPU ranks over the in-process communicator, CUDA ranks on GPUs 0..tp-1 over NCCL.
// kv_blocks (optional, CUDA): blocks a rank can hold given its backend and the bytes per
// block. Throws a clear message for invalid layouts (see check_parallel_layout) and for
// --nnodes > 1 (the bootstrap exists, serving across nodes does not: see dist-check).
std::unique_ptr<ModelExecutor> make_parallel_executor(
    const ParallelFlags& f, const ExecutorOptions& eo, const std::string& device,
    std::function<int(Backend&, int64_t)> kv_blocks = {});

}  // namespace moeserve::cli
