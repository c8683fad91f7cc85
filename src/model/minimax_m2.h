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

// Step activations, allocated once for up to max_tokens rows (and max_rows logits rows); each
// forward takes views of the first T (R) rows, so a step allocates nothing once the buffers
// fit it and their addresses stay fixed (a captured CUDA graph keeps pointing at them).
struct MiniMaxM2Workspace {
  int64_t max_tokens = 0, max_rows = 0;
  Tensor residual, x, o, moe_out;  // [max_tokens, H]
  Tensor q, attn;                  // [max_tokens, Hq_local * D]
  Tensor k, v;                     // [max_tokens, Hkv_local * D]
  Tensor expert_ids, expert_w;     // [max_tokens, top_k] I32 / F32
  Tensor qk_ss;                    // [2 * max_tokens] F32: q then k sums of squares (TP only)
  Tensor sel;                      // [max_rows, H]
  Tensor logits;                   // [max_rows, V]
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
  // Weights made elsewhere (bench-model's synthetic weights); shapes as declare_minimax_m2_weights.
  void set_weights(MiniMaxM2Weights w) { w_ = std::move(w); }
  // Profiling: when set, forward calls it after each op with the op's name (bench-model
  // --profile records a CUDA event there). Not for captured steps.
  void set_op_hook(std::function<void(const char*)> hook) { op_hook_ = std::move(hook); }

  // One KV layer per model layer: [num_blocks, block_size, kv_heads_local, head_dim].
  std::vector<KVCacheLayer> allocate_kv_cache(int num_blocks, int block_size, DType dtype) const;

  // Allocates the step buffers for up to max_tokens tokens and max_rows logits rows (grows
  // only; forward grows them on demand too, bumping workspace_epoch()).
  void reserve_workspace(int64_t max_tokens, int64_t max_rows);
  // Changes whenever a step buffer was reallocated (graphs captured before are stale).
  int64_t workspace_epoch() const { return ws_epoch_; }
  int64_t workspace_bytes() const;
  const MiniMaxM2Workspace& workspace() const { return ws_; }

  // ids [T] I32 (device), meta for the batch, the KV cache (written at meta.slot_mapping),
  // rows [R] I32: which token rows to produce logits for. Returns logits [R, V], a view of the
  // workspace (valid until the next forward). Allocates nothing when the workspace fits.
  Tensor forward(const Tensor& ids, const AttentionMeta& meta, std::vector<KVCacheLayer>& kv, const Tensor& rows);

 private:
  void all_reduce(Tensor& t);
  void mark(const char* op) {
    if (op_hook_) op_hook_(op);
  }
  MiniMaxM2Config cfg_;
  Backend& be_;
  ParallelConfig par_;
  AllReduceFn all_reduce_;
  MiniMaxM2Shard shard_;
  MiniMaxM2Weights w_;
  MiniMaxM2Workspace ws_;
  int64_t ws_epoch_ = 0;
  std::function<void(const char*)> op_hook_;
};

}  // namespace moeserve
