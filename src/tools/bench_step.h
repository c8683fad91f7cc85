// bench-model's device-neutral parts (no device header: the CPU run and its tests build
// without CUDA): the synthetic configs (--synthetic NAME), the bench model from the registry,
// the bytes a decode step must read, and the step planner that writes batch metadata into
// fixed device buffers (plan/run), so a planned step can be captured as one CUDA graph and
// replayed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/arch/minimax_m2.h"

namespace moeserve::tools {

struct SynthShapes {  // MiniMax-M2.5 (shared/reference/minimax-m2.md §3-4)
  int hidden = 3072, q_heads = 48, kv_heads = 8, head_dim = 128, rotary_dim = 64;
  int experts = 256, top_k = 8, intermediate = 1536, vocab = 200064;
  float theta = 5e6f, eps = 1e-6f;
  int total_layers = 62;  // of the real model, for extrapolation
};
// The shapes of a config (total_layers = its layer count; rotary_dim / theta / eps are only
// read by synth_config and keep their defaults here).
SynthShapes shapes_of(const ModelDesc& d);
// A MiniMax-M2.5 config with `layers` layers and FP8 128x128 block quantisation.
MiniMaxM2Config synth_config(const SynthShapes& s, int layers);

// --synthetic NAME: a known model's config with `layers` layers (FP8 128x128 blocks, as the
// FP8 checkpoints are published) and its shapes (total_layers = the real model's).
//   minimax-m2.5    synth_config(SynthShapes{}, layers), 62 layers
//   qwen3-30b-a3b   Qwen/Qwen3-30B-A3B(-FP8)'s config.json, 48 layers
//   deepseek-v3     deepseek-ai/DeepSeek-V3's config.json (FP8 128x128 as published), 61 layers
//                   (the first 3 dense; MLA, 1 shared + 256 routed experts top-8 in 8 groups)
struct SyntheticModel {
  std::unique_ptr<ArchConfig> config;
  SynthShapes shapes;
};
SyntheticModel synthetic_model(const std::string& name, int layers);
std::string synthetic_model_names();  // "minimax-m2.5, qwen3-30b-a3b"
// The model bench-model measures: --synthetic NAME's config (layers 0: 4), or the checkpoint's
// config trimmed to its first `layers` layers as --hf-overrides would (per-layer lists too);
// shapes.total_layers stays the full model's, for extrapolation.
SyntheticModel bench_model_config(const std::string& checkpoint, const std::string& synthetic, int layers);
// The registry's model for `cfg` on `b` (one rank, no communicator); throws unless the
// architecture is built on the shared decoder layers (BenchStep reads their workspace).
std::unique_ptr<DecoderModel> make_bench_model(const ArchConfig& cfg, Backend& b);
// Bytes all `world` ranks must read per layer for one decode step of batch B at context C:
// attention weights (FP8, 128x128 f32 scales), the f32 router, the expected distinct experts
// of B tokens under uniform routing (whole experts under EP, each rank's slices otherwise) and
// the KV. `shard` is one rank's part (alike on every rank); world 1 with the whole model's
// shard is one GPU.
struct DecodeBytes {
  double attn_w = 0, router = 0, experts = 0, kv = 0, distinct = 0;
  double per_layer() const { return attn_w + router + experts + kv; }
};
// kv_elem_bytes: 2 for a bf16 cache, 1 for FP8.
DecodeBytes decode_bytes(const SynthShapes& s, const MiniMaxM2Shard& shard, int world, bool expert_parallel, int B,
                         int C, int kv_elem_bytes = 2);
// The same from a loaded model's own tensors (any architecture on the shared decoder layers:
// MLA, shared experts and dense layers included): per layer every non-expert tensor it reads
// (norms, attention / MLA projections with their FP8 scales, router, shared expert, dense MLP)
// plus the expected distinct routed experts of B tokens under uniform routing times one expert's
// bytes, plus B x C cached tokens of its KV layout (MLA: the latent). Averaged over the layers;
// `distinct` is per MoE layer. Excludes the embedding rows and the lm_head.
DecodeBytes model_decode_bytes(const DecoderModel& model, int B, int C, int kv_elem_bytes = 2);

class BenchStep {
 public:
  BenchStep(Backend& b, DecoderModel& model, int max_tokens, int max_seqs, int max_blocks_per_seq);
  // (max_seqs also bounds the logits rows; with set_logits_all_tokens, give max_tokens.)
  // Allocates `blocks` KV blocks per layer of `dtype` (BF16 or F8_E4M3; the CPU backend: F32),
  // each K and V tensor passed to `fill` with a seed (bench-model on CUDA: random values);
  // without `fill` they stay zero (alloc's contents: the CPU runs, where values cost nothing).
  void alloc_kv(int blocks, int block_size, DType dtype = DType::BF16,
                const std::function<void(Tensor&, uint64_t)>& fill = {});
  int kv_blocks() const { return kv_.empty() ? 0 : int(kv_[0].k.dim(0)); }
  // Plans one step: sequence s has query_lens[s] new tokens and context_lens[s] tokens after
  // the step; its KV blocks are consecutive runs of the pool.
  void plan(const std::vector<int>& query_lens, const std::vector<int>& context_lens);
  // The planned step through the model's forward (logits of each sequence's last token, or of
  // every token: set_logits_all_tokens). Capture-safe after one eager run of the same plan.
  Tensor forward();
  // Token ids of the next steps' first ids.size() tokens (default: a fixed spread over the
  // vocabulary); --measure-routing-overlap feeds real prompts.
  void set_ids(const std::vector<int32_t>& ids);
  int planned_tokens() const { return T_; }
  // Off: forward asks the model for no logits rows (no lm_head; bench-model -tp ranks != 0).
  void set_logits(bool on) { logits_ = on; }
  // On: logits of every query token (a verify step samples all 1 + k positions); off (the
  // default): of each sequence's last token. Takes effect at the next plan().
  void set_logits_all_tokens(bool on) { logits_all_ = on; }
  std::vector<float> routing_ids();  // expert ids of the last layer, last step (host copy)

 private:
  Backend& b_;
  DecoderModel& model_;
  int max_tokens_, max_seqs_, max_blocks_;
  std::vector<KVCacheLayer> kv_;
  Tensor ids_, last_rows_;
  AttentionMeta meta_;
  int T_ = 0, S_ = 0;
  bool logits_ = true, logits_all_ = false;
  int R_ = 0;  // logits rows of the planned step
};

}  // namespace moeserve::tools
