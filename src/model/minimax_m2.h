// MiniMax-M2 forward pass built only from backend ops (shared/reference/minimax-m2.md §3):
//   h = embed[ids]
//   per layer: x = RMSNorm(h); q,k,v = x Wq/Wk/Wv; full-width QK-norm; partial NeoX RoPE;
//              paged causal GQA attention; h += o Wo;
//              x = RMSNorm(h); sigmoid router (bias for selection only, renormalised top-k);
//              h += sum_k w_k SwiGLU_e(x)
//   logits = RMSNorm(h) lm_head^T for the requested rows.
// Parallelism (one instance per rank): attention heads split over the `world` ranks
// (column-parallel q/k/v, row-parallel o_proj + all-reduce; the QK-norm statistic is a
// row_sum_squares + all-reduce); experts either split over ranks (EP) or sliced along the
// expert intermediate size (expert TP); either way the MoE output is all-reduced.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace moeserve {

struct ParallelConfig {
  int rank = 0;
  int world = 1;
  bool expert_parallel = false;  // experts owned whole by one rank (EP) vs sliced (expert TP)
};

// In-place sum of a device tensor over all ranks (a Communicator's all-reduce).
using AllReduceFn = std::function<void(Tensor&)>;

// Local sizes of this rank's part of the model.
struct MiniMaxM2Shard {
  int q_heads = 0;          // local query heads
  int kv_heads = 0;         // local KV heads
  int kv_replicate = 1;     // ranks sharing each KV head (TP world > KV heads)
  int first_expert = 0;     // first global expert id on this rank
  int num_experts = 0;      // experts held by this rank
  int expert_inter = 0;     // local expert intermediate size
};
MiniMaxM2Shard plan_shard(const MiniMaxM2Config& cfg, const ParallelConfig& par);

// FP8 checkpoints: a split whose per-rank slice is not a whole number of weight blocks
// (e.g. expert intermediate 1536 over 8 ranks = 192 rows with 128-row blocks). The loader
// handles it exactly (smaller local blocks), but the fast kernels need whole 128 blocks, so
// user-facing layouts refuse it. Returns "" when every split is block-aligned, else a
// message naming the tensor and what to use instead.
std::string fp8_split_problem(const MiniMaxM2Config& cfg, const ParallelConfig& par);

// Every tensor of the main model with its global shape, accepted dtypes and shard spec.
std::vector<WeightDecl> declare_minimax_m2_weights(const MiniMaxM2Config& cfg, const ParallelConfig& par);

struct MiniMaxM2Layer {
  Tensor input_norm, post_attention_norm;  // [H]
  LinearWeight q, k, v, o;                 // local slices
  Tensor q_norm, k_norm;                   // [Hq_local*D], [Hkv_local*D]
  MoeWeights moe;
};

struct MiniMaxM2Weights {
  Tensor embed;  // [V, H]
  std::vector<MiniMaxM2Layer> layers;
  Tensor final_norm;
  LinearWeight lm_head;  // [V, H]
};

class MiniMaxM2Model {
 public:
  // Validates the config for this parallel layout; throws naming the problem.
  MiniMaxM2Model(MiniMaxM2Config cfg, Backend& backend, ParallelConfig par, AllReduceFn all_reduce = {});

  // Checks every declared tensor, loads this rank's slices and uploads them.
  void load(const Checkpoint& ckpt);

  const MiniMaxM2Config& config() const { return cfg_; }
  const MiniMaxM2Shard& shard() const { return shard_; }
  const MiniMaxM2Weights& weights() const { return w_; }

  // One KV layer per model layer: [num_blocks, block_size, kv_heads_local, head_dim].
  std::vector<KVCacheLayer> allocate_kv_cache(int num_blocks, int block_size, DType dtype) const;

  // ids [T] I32 (device), meta for the batch, the KV cache (written at meta.slot_mapping),
  // rows [R] I32: which token rows to produce logits for. Returns logits [R, V].
  Tensor forward(const Tensor& ids, const AttentionMeta& meta, std::vector<KVCacheLayer>& kv, const Tensor& rows);

 private:
  void all_reduce(Tensor& t);
  MiniMaxM2Config cfg_;
  Backend& be_;
  ParallelConfig par_;
  AllReduceFn all_reduce_;
  MiniMaxM2Shard shard_;
  MiniMaxM2Weights w_;
};

}  // namespace moeserve
