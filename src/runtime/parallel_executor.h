// ParallelExecutor: one ModelExecutor over `world` tensor/expert-parallel ranks in this
// process. Each rank is a RankExecutor on its own long-lived thread (a CUDA rank's
// thread keeps its device current, so its backend, stream and NCCL communicator are only
// ever used from that thread). execute() hands the step to every rank, waits for all of
// them and returns rank 0's logits (every rank computes the same ones).
//
// Layout (vLLM flags): --tensor-parallel-size W splits attention heads over W ranks;
// experts are sliced along the intermediate size (expert TP) or, with
// --enable-expert-parallel, owned whole by one of the W ranks (EP = TP = W, attention
// stays tensor-parallel). --data-parallel-size (attention data parallel) must be 1: the
// seam is the rank group (each DP replica would own a ParallelExecutor over its own
// token batch, with the MoE all-to-all spanning replicas); it is not implemented.
//
// Invariants: ranks run the same steps in the same order; a step is validated once on the
// caller's thread (check_step_batch) before any rank starts, so a bad batch throws without
// touching the ranks. A rank that fails mid-step aborts every communicator (no rank waits
// forever in a collective) and the executor refuses further steps.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/model_executor.h"

namespace moeserve {

struct ParallelLayout {
  int tensor_parallel = 1;
  bool expert_parallel = false;
  int data_parallel = 1;
  // Allows FP8 splits that cut weight blocks (exact on the CPU backend; tests use it).
  bool allow_fp8_block_split = false;
  int available_devices = 0;  // > 0: GPUs visible; tensor_parallel may not exceed it
};

// Throws a user-facing message when the layout cannot run `cfg` (sizes that do not split,
// FP8 blocks cut, data_parallel != 1, more ranks than available devices).
void check_parallel_layout(const ArchConfig& cfg, const ParallelLayout& layout);

struct ParallelExecutorOptions {
  ExecutorOptions exec;  // per-rank options; comm, expert_parallel and kv_blocks_for_memory are set per rank
  ParallelLayout layout;
  // Rank r's backend and communicator. Both run on rank r's thread, all ranks at the same
  // time (creating an NCCL communicator is collective).
  std::function<std::unique_ptr<Backend>(int rank)> make_backend;
  std::function<std::unique_ptr<Communicator>(int rank, Backend& backend)> make_comm;
  // Optional: KV blocks rank r can hold given the bytes of one block; the pool is the
  // minimum over ranks (every rank holds the same block ids).
  std::function<int(Backend& backend, int64_t bytes_per_block)> kv_blocks_for_memory;
  // Optional: rank 0's device sampler over its backend (backend_device_sampler). Only rank
  // 0 computes logits, so only rank 0 samples; the executor then reports device_sampling and
  // returns the sampled ids like a one-rank executor. exec.device_sampler is ignored.
  std::function<std::function<void(const Tensor&, const std::vector<DeviceSampling>&, Tensor&)>(Backend& backend)>
      make_device_sampler;
};

class ParallelExecutor final : public ModelExecutor {
 public:
  explicit ParallelExecutor(ParallelExecutorOptions opts);
  ~ParallelExecutor() override;
  ExecutorInfo info() const override { return info_; }
  StepResult execute(const StepBatch& batch) override;
  int world() const { return world_; }
  // Decode graphs of rank `r` (every rank captures and replays the same buckets; tests).
  int graphs_captured(int r = 0) const;
  int graph_replays(int r = 0) const;

 private:
  struct Rank;
  void rank_main(int r);
  void fail_all(const std::string& reason);
  void shutdown();  // tears the ranks down on their threads and joins them
  // Runs `job` on every rank thread and waits; returns the first root-cause error.
  std::exception_ptr run_on_ranks(const std::function<void(Rank&)>& job);

  ParallelExecutorOptions opts_;
  int world_ = 1;
  ExecutorInfo info_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t job_gen_ = 0;
  int pending_ = 0;
  bool stop_ = false, broken_ = false;
  std::function<void(Rank&)> job_;
  // KV pool sizing across ranks.
  std::vector<int> kv_local_;
  int kv_arrived_ = 0;
};

// The CPU executor for `world` ranks over an in-process communicator (tests, CPU serving).
std::unique_ptr<ParallelExecutor> make_cpu_parallel_executor(const ExecutorOptions& exec, const ParallelLayout& layout);

}  // namespace moeserve
