// RankExecutor: the engine's ModelExecutor for one rank of any registered architecture. Owns
// the backend, the Model (from the registry: model/registry.h; this rank's weight slices) and
// the paged KV pool (the model's KvLayout); turns a StepBatch into AttentionMeta and returns
// logits. Pure-decode steps are padded into buckets and replayed as captured graphs when the
// backend offers graph capture (backend/capabilities.h).
// With a communicator of world > 1 every rank runs execute() on the same batch at the same
// time (the model all-reduces inside the forward); each rank returns the full logits.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "engine/executor.h"
#include "engine/spec_config.h"
#include "model/registry.h"
#include "runtime/decode_plan.h"
#include "runtime/graph_runner.h"

namespace moeserve {

struct ExecutorOptions {
  std::string model_dir;
  std::string hf_overrides;  // JSON object merged into config.json (--hf-overrides)
  // When set, replaces reading the checkpoint (--load-format dummy): fills the model built
  // from config.json with generated weights on its backend (lm_head: whether this rank needs
  // the output projection, i.e. `logits` below).
  std::function<void(Backend&, Model&, bool lm_head)> make_weights;
  int block_size = 16;
  // --kv-cache-dtype: auto (the activation dtype) | fp8 | fp8_e4m3 (model/kv_cache_dtype.h).
  // FP8 halves the bytes of a bf16 block, so kv_blocks_for_memory gets the FP8 block size.
  std::string kv_cache_dtype = "auto";
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
  // Step bounds (the engine's): the step workspace is allocated once for
  // max(max_num_batched_tokens, largest bucket) tokens before the KV pool is sized; 0: grown on
  // demand. max_num_seqs also caps the decode graph buckets.
  int max_num_seqs = 256;
  int max_num_batched_tokens = 0;
  // Whole-step graphs for pure-decode steps (CUDA; one per batch-size bucket, captured after
  // one eager warm-up of the bucket). enforce_eager (vLLM's --enforce-eager) turns them off.
  bool enforce_eager = false;
  bool capture_graphs_at_startup = false;  // capture every bucket in the constructor
  // Pad pure-decode steps into buckets even without a graph runner (tests of the padding).
  bool pad_decode = false;
  // Replaces make_graph_runner() (tests: a recording runner on the CPU backend).
  std::function<std::unique_ptr<GraphRunner>(Backend&)> graph_runner_factory;
  // When set, the executor reports device_sampling and samples the rows that ask for it:
  // out_ids [R] I32 (device) = one token per row of the device logits [R, V] (the model's
  // output dtype). runtime/device_sampler.h makes one from the backend's capability.
  std::function<void(const Tensor& logits, const std::vector<DeviceSampling>& params, Tensor& out_ids)>
      device_sampler;
  // Speculative decoding with a draft (method eagle3 / mtp): loaded here, run by propose().
  // Other methods (n-gram) need nothing from the executor.
  SpecConfig speculative;
};

class SpecRunner;

class RankExecutor : public ModelExecutor {
 public:
  RankExecutor(std::unique_ptr<Backend> backend, const ExecutorOptions& opts);
  ~RankExecutor() override;
  ExecutorInfo info() const override { return info_; }
  StepResult execute(const StepBatch& batch) override;
  const Model& model() const { return *model_; }
  // The KV cache (tests: its dtype and per-layer scales).
  const std::vector<KVCacheLayer>& kv_cache() const { return kv_; }
  // Bytes of one KV block over all layers in the cache's dtype (what kv_blocks_for_memory got).
  int64_t kv_bytes_per_block() const;
  Backend& backend() { return *backend_; }
  // Decode buckets in use (empty when decode steps are not padded) and graphs captured so far.
  std::vector<std::vector<int32_t>> propose(const DraftBatch& batch) override;
  void release_draft(int64_t seq_id) override;
  const std::vector<int>& graph_buckets() const { return buckets_; }
  int graphs_captured() const { return graphs_ ? graphs_->size() : 0; }
  int graph_replays() const { return replays_; }

 private:
  // Logits [rows with need_logits, V] of one step (a view of the model's workspace).
  Tensor forward_eager(const StepBatch& batch);
  // A pure-decode step padded to `bucket` rows: graph replay, or eager warm-up + capture.
  // Returns logits [bucket, V].
  Tensor forward_padded(const StepBatch& batch, int bucket);
  void drop_stale_graphs();


  // After the forward: device rows sampled by device_sampler (ids downloaded), the other
  // rows' logits downloaded. logits [R, V] device, one row per need_logits sequence.
  void collect_rows(const StepBatch& batch, const Tensor& logits, StepResult& res);
  std::function<void(const Tensor&, const std::vector<DeviceSampling>&, Tensor&)> device_sampler_;
  Tensor sampled_buf_;  // grow-only [>= R] I32 device ids
  // Step metadata goes through one grow-only I32 device buffer (one host->device copy per
  // step, no allocation once it has grown to the largest step).
  Tensor meta_buf_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<KVCacheLayer> kv_;
  ExecutorInfo info_;
  // Padded decode: buckets, the fixed metadata buffer every bucket's layout starts at (sized for
  // the largest), its host staging copy, the dummy KV block (index num_kv_blocks, outside the
  // engine's pool), and per captured bucket the logits view its graph writes.
  std::vector<int> buckets_;
  DecodePadding pad_;
  Tensor graph_meta_;
  std::vector<int32_t> staging_;
  std::unique_ptr<GraphRunner> graphs_;
  std::unique_ptr<SpecRunner> spec_;  // the draft (runtime/spec_runner.h), or null
  std::map<int, Tensor> graph_logits_;
  int64_t graph_ws_epoch_ = -1;
  uint64_t graph_backend_gen_ = 0;
  int replays_ = 0;
  bool logits_ = true;
  DType kv_dtype_ = DType::F32;  // the cache tensors' dtype (--kv-cache-dtype)
};

// Throws (naming the sequence) unless every sequence of `batch` fits `info`: query tokens
// present, token ids in the vocabulary, context within max_model_len, block table long
// enough and inside the pool. execute() calls it before touching the device; the parallel
// executor calls it once before dispatching a step to its ranks.
void check_step_batch(const ExecutorInfo& info, const StepBatch& batch);

// Convenience: the executor for a checkpoint directory on the CPU backend.
std::unique_ptr<RankExecutor> make_cpu_executor(const ExecutorOptions& opts);

}  // namespace moeserve
