// ModelExecutor for MiniMax-M2 on one rank: owns the backend, the weights (this rank's
// slices) and the paged KV pool; turns a StepBatch into AttentionMeta and returns logits.
// With a communicator of world > 1 every rank runs execute() on the same batch at the same
// time (the model all-reduces inside the forward); each rank returns the full logits.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "engine/executor.h"
#include "model/minimax_m2.h"

namespace moeserve {

struct ExecutorOptions {
  std::string model_dir;
  int block_size = 16;
  int num_kv_blocks = 0;   // 0: enough for one sequence of max_model_len
  int max_model_len = 0;   // 0: config max_position_embeddings
  bool expert_parallel = false;  // with comm: experts owned by ranks (EP) instead of sliced
  // false: execute() returns no logits (the forward stops after the last layer). Ranks of a
  // parallel group other than 0 run this way: every rank would compute the same logits.
  bool logits = true;
  // The rank's tensor/expert-parallel group (rank and world come from it); null = one rank.
  Communicator* comm = nullptr;
  // When set and num_kv_blocks == 0: called after the weights are loaded with the bytes one KV
  // block takes over all layers; returns the pool size (GPU serving sizes it from
  // --gpu-memory-utilization and the memory left after the weights).
  std::function<int(int64_t bytes_per_block)> kv_blocks_for_memory;
};

class MiniMaxM2Executor : public ModelExecutor {
 public:
  MiniMaxM2Executor(std::unique_ptr<Backend> backend, const ExecutorOptions& opts);
  ExecutorInfo info() const override { return info_; }
  StepResult execute(const StepBatch& batch) override;
  const MiniMaxM2Model& model() const { return *model_; }
  Backend& backend() { return *backend_; }

 private:
  // Step metadata goes through one grow-only I32 device buffer (one host->device copy per
  // step, no allocation once it has grown to the largest step).
  Tensor meta_buf_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MiniMaxM2Model> model_;
  std::vector<KVCacheLayer> kv_;
  ExecutorInfo info_;
  bool logits_ = true;
};

// Throws (naming the sequence) unless every sequence of `batch` fits `info`: query tokens
// present, token ids in the vocabulary, context within max_model_len, block table long
// enough and inside the pool. execute() calls it before touching the device; the parallel
// executor calls it once before dispatching a step to its ranks.
void check_step_batch(const ExecutorInfo& info, const StepBatch& batch);

// Convenience: the executor for a checkpoint directory on the CPU backend.
std::unique_ptr<MiniMaxM2Executor> make_cpu_executor(const ExecutorOptions& opts);

}  // namespace moeserve
