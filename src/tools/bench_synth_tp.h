// (bench-model -tp only; the single-GPU bench runs MiniMaxM2Model itself, see bench_synth.h.)
// A MiniMax-M2.5-shaped stack of L decoder layers with random weights generated on the GPU
// (FP8 block-scaled projections and experts, f32 router, bf16 norms / embedding / lm_head),
// plus the forward step composed from Backend ops. This stands in for the model branch's
// forward until it lands; bench-model times it eagerly (prefill) and as one CUDA graph per
// decode batch (plan/run: metadata lives in fixed device buffers).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace moeserve::tools::tp {

struct SynthShapes {  // MiniMax-M2.5 (shared/reference/minimax-m2.md §3-4)
  int hidden = 3072, q_heads = 48, kv_heads = 8, head_dim = 128, rotary_dim = 64;
  int experts = 256, top_k = 8, intermediate = 1536, vocab = 200064;
  float theta = 5e6f, eps = 1e-6f;
  int total_layers = 62;  // of the real model, for extrapolation
};

// Tensor / expert parallelism of the synthetic stack (bench-model -tp N
// [--enable-expert-parallel]): this rank holds q_heads/W query heads, max(1, kv_heads/W) KV
// heads, and either experts/W whole experts (EP) or every expert's intermediate/W slice;
// o_proj and the MoE output are all-reduced and the QK-norm statistic is a row sum of
// squares + all-reduce, as in MiniMaxM2Model. Only rank 0 computes the lm_head.
struct SynthParallel {
  int rank = 0, world = 1;
  bool expert_parallel = false;
  std::function<void(Tensor&)> all_reduce;  // in-place sum over ranks, on the backend's stream
};

struct SynthLayer {
  LinearWeight q, k, v, o;
  Tensor in_norm, post_norm, q_norm, k_norm;
  MoeWeights moe;
  KVCacheLayer kv;
};

class SynthModel {
 public:
  SynthModel(CudaBackend& b, const SynthShapes& s, int layers, int max_tokens, int max_seqs, int max_blocks_per_seq,
             SynthParallel par = {});
  // Allocates `blocks_per_layer` KV blocks for every layer and fills them with random values.
  void alloc_kv(int blocks_per_layer, int block_size);
  // Plans one step: sequence s has query_lens[s] new tokens and context_lens[s] tokens after
  // the step; its KV blocks are [s * max_blocks_per_seq, ...) of each layer's pool.
  void plan(const std::vector<int>& query_lens, const std::vector<int>& context_lens);
  // Runs the planned step: embedding, L layers, final norm, lm_head on each sequence's last
  // token into logits [S, vocab] f32. Capture-safe after one eager run. `mark`, when set, is
  // called after each op with its name (bench-model --profile records an event there).
  void forward(const std::function<void(const char*)>& mark = {});
  int64_t weight_bytes() const { return weight_bytes_; }
  const SynthShapes& shapes() const { return s_; }
  // This rank's sizes (the global ones at world 1).
  int local_q_heads() const { return qh_; }
  int local_kv_heads() const { return kvh_; }
  int local_experts() const { return ne_; }
  int local_intermediate() const { return inter_; }
  std::vector<float> routing_ids();  // of the last layer, last step (host copy)

 private:
  // A slab: one device allocation carved into many weights. cudaMalloc rounds large
  // allocations up to 2 MiB, which for 4.5 MiB expert matrices wastes a third of the memory.
  struct Slab {
    Tensor mem;
    size_t used = 0;
  };
  Tensor carve(Slab& slab, DType t, const Shape& shape);
  LinearWeight fp8_linear(int out, int in, uint64_t seed, Slab* w_slab = nullptr, Slab* s_slab = nullptr);
  Tensor rand(DType t, const Shape& shape, uint64_t seed, float scale);

  void all_reduce(Tensor& t) {
    if (par_.world > 1) par_.all_reduce(t);
  }
  CudaBackend& b_;
  SynthShapes s_;
  SynthParallel par_;
  int qh_ = 0, kvh_ = 0, kv_rep_ = 1, ne_ = 0, first_e_ = 0, inter_ = 0;
  Tensor qk_ss_;  // [2, max_tokens] F32 QK-norm sums of squares of q and k (world > 1)
  int max_tokens_, max_seqs_, max_blocks_;
  int64_t weight_bytes_ = 0;
  std::vector<SynthLayer> layers_;
  Tensor embed_, final_norm_;
  LinearWeight lm_head_;
  // Step buffers [max_tokens, ...] and metadata buffers.
  Tensor ids_, h_, xn_, q_, k_, v_, attn_, o_, moe_out_, last_x_, logits_;
  MoeRouting routing_;
  AttentionMeta meta_;
  Tensor last_rows_;  // [max_seqs] I32: token index of each sequence's last token
  int T_ = 0, S_ = 0;
};

}  // namespace moeserve::tools::tp
