// Shared, parameterised layers of a pre-norm MoE decoder, written once for every architecture
// file (model/arch/*): the attention block (q/k/v, QK-norm of any mode, RoPE of any spec, GQA
// attention over the paged KV cache, o_proj), the MoE block (router of any RoutingSpec +
// SwiGLU experts), the dense SwiGLU MLP, RMSNorms, embedding and lm_head; their weight
// declarations with shard specs, their loading, the step workspace and the tensor-parallel
// all-reduces. An architecture derives from DecoderModel, fills a DecoderSpec from its typed
// config, declares its tensor names, and writes its forward as a loop over these blocks.
//
// Tensor parallelism (one instance per rank): attention heads split over the `world` ranks
// (column-parallel q/k/v, row-parallel o_proj + all-reduce; a full-width QK-norm statistic is
// a row_sum_squares + all-reduce); experts either split over ranks (EP) or sliced along the
// expert intermediate size (expert TP), dense MLPs sliced along theirs; the MLP output is
// all-reduced.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace moeserve {

// Local sizes of this rank's part of the model.
struct DecoderShard {
  int q_heads = 0;       // local query heads
  int kv_heads = 0;      // local KV heads
  int kv_replicate = 1;  // ranks sharing each KV head (TP world > KV heads)
  int first_expert = 0;  // first global expert id on this rank
  int num_experts = 0;   // experts held by this rank
  int expert_inter = 0;  // local expert intermediate size
  int dense_inter = 0;   // local dense-MLP intermediate size (0: no dense layers)
};
// Throws naming the size that does not split over par.world ranks.
DecoderShard plan_decoder_shard(const ModelDesc& d, const ParallelConfig& par);
// FP8 checkpoints: "" when every split keeps whole weight blocks, else a message naming the
// tensor and what to use instead (the loader is exact either way; the fast kernels want whole
// 128 blocks, so user-facing layouts refuse it).
std::string decoder_fp8_split_problem(const ModelDesc& d, const ParallelConfig& par);

// What varies between decoder families inside the shared blocks.
struct DecoderSpec {
  QkNormMode qk_norm = QkNormMode::FullWidth;
  RopeSpec rope;
  RoutingSpec route;
  bool routing_bias = false;  // the router has a selection bias tensor
  float rms_norm_eps = 1e-6f;
  std::vector<char> dense_layer;  // per layer: 1 = dense MLP, 0 = MoE
};

// The checkpoint names of one layer's tensors (hub spelling), relative to "model.layers.{l}.".
struct DecoderNames {
  std::string q = "self_attn.q_proj.weight", k = "self_attn.k_proj.weight", v = "self_attn.v_proj.weight";
  std::string o = "self_attn.o_proj.weight";
  std::string q_norm = "self_attn.q_norm.weight", k_norm = "self_attn.k_norm.weight";
  std::string input_norm = "input_layernorm.weight", post_norm = "post_attention_layernorm.weight";
  std::string router = "mlp.gate.weight", router_bias = "mlp.e_score_correction_bias";
  std::string experts = "mlp.experts.";  // + "{e}." + w1/w3/w2 below
  std::string w1 = "gate_proj.weight", w3 = "up_proj.weight", w2 = "down_proj.weight";
  std::string dense = "mlp.";  // dense MLP: + w1/w3/w2
};

// One layer's weights (local slices). A dense layer fills mlp, a MoE layer moe.
struct DecoderLayer {
  Tensor input_norm, post_attention_norm;  // [H]
  LinearWeight q, k, v, o;                 // local slices
  Tensor q_norm, k_norm;  // FullWidth: [Hq_local*D], [Hkv_local*D]; PerHead: [D]; None: empty
  MoeWeights moe;
  ExpertWeights mlp;
  bool dense = false;
};

struct DecoderWeights {
  Tensor embed;  // [V, H]
  std::vector<DecoderLayer> layers;
  Tensor final_norm;
  LinearWeight lm_head;  // [V, H]
};

// Step activations, allocated once for up to max_tokens rows (and max_rows logits rows); each
// forward takes views of the first T (R) rows, so a step allocates nothing once the buffers
// fit it and their addresses stay fixed (a captured CUDA graph keeps pointing at them).
struct DecoderWorkspace {
  int64_t max_tokens = 0, max_rows = 0;
  Tensor residual, x, o, moe_out;  // [max_tokens, H] (moe_out: the MLP output, MoE or dense)
  Tensor q, attn;                  // [max_tokens, Hq_local * D]
  Tensor k, v;                     // [max_tokens, Hkv_local * D]
  Tensor expert_ids, expert_w;     // [max_tokens, top_k] I32 / F32
  Tensor qk_ss;                    // [2 * max_tokens] F32: q then k sums of squares (TP, FullWidth)
  Tensor mlp_gate, mlp_up;         // [max_tokens, dense_inter_local] (dense layers only)
  Tensor sel;                      // [max_rows, H]
  Tensor logits;                   // [max_rows, V]
};

// This step's views of the workspace (first T rows).
struct StepViews {
  int64_t T = 0;
  Tensor residual, x, q, k, v, attn, o, moe_out;
  MoeRouting routing;
  Tensor q_ss, k_ss, qk_ss;  // TP FullWidth only
  Tensor mlp_gate, mlp_up;
};

// Appends the declarations of the shared blocks (hub names under `names`).
void declare_decoder_weights(const ModelDesc& d, const DecoderSpec& spec, const DecoderNames& names,
                             const ParallelConfig& par, std::vector<WeightDecl>& out);

class DecoderModel : public Model {
 public:
  KvLayout kv_layout() const override;
  BackendWorkspaceDims backend_workspace_dims(int max_tokens) const override;
  void reserve_workspace(int64_t max_tokens, int64_t max_rows) override;
  int64_t workspace_epoch() const override { return ws_epoch_; }
  int64_t workspace_bytes() const override;
  void set_op_hook(std::function<void(const char*)> hook) override { op_hook_ = std::move(hook); }

  const DecoderShard& shard() const { return shard_; }
  const DecoderSpec& spec() const { return spec_; }
  const DecoderWeights& weights() const { return w_; }
  const DecoderWorkspace& workspace() const { return ws_; }
  // Weights made elsewhere (bench-model's synthetic weights); shapes as declared.
  void set_weights(DecoderWeights w) { w_ = std::move(w); }
  // Every declaration of config().weights(this rank) from `source` (Model::load_from).
  void load_from(const WeightSource& source) override;

 protected:
  // Validates the layout (throws naming the problem).
  DecoderModel(const ModelDesc& desc, DecoderSpec spec, DecoderNames names, Backend& backend, ParallelConfig par,
               AllReduceFn all_reduce);
  // Loads every declared tensor of the shared blocks (after the architecture's checks).
  // `skipped`: checkpoint tensors to pass over silently (MTP modules).
  void load_decoder(const Checkpoint& ckpt, const std::vector<WeightDecl>& decls,
                    const std::function<bool(const std::string&)>& skipped);
  // Converts (bf16 backends) and uploads this rank's tensors, by declared name (both loaders).
  void upload_decoder(const std::map<std::string, LoadedTensor>& got);

  // ---- forward building blocks (each issues the backend ops named) ----
  // Views of the first T rows; grows the workspace when the step needs more (epoch bump).
  StepViews begin_step(int64_t T, int64_t R);
  // residual = embed[ids]; x = rmsnorm(residual) * input_norm of layer 0.
  void embed(const Tensor& ids, StepViews& s);
  // The QK-norm/RoPE and attention arguments of layer l.
  QkNormRopeArgs qk_args(int l, StepViews& s, const AttentionMeta& meta);
  AttentionArgs attention_args(int l, StepViews& s, std::vector<KVCacheLayer>& kv, const AttentionMeta& meta);
  // Attention block of layer l: q/k/v (l > 0: fused with the previous layer's residual add +
  // this layer's input norm), QK-norm + RoPE + KV write + attention, o_proj (+ all-reduce).
  // `rep`: timing diagnostics only (ops run that many times).
  struct Repeat {
    int qkv = 1, qknorm = 1, attn = 1, oproj = 1, route = 1, experts = 1;
  };
  void attention_block(int l, StepViews& s, std::vector<KVCacheLayer>& kv, const AttentionMeta& meta,
                       const Repeat& rep);
  // MoE block: residual += o; x = rmsnorm(residual) * post_norm; route; experts (+ all-reduce).
  void moe_block(int l, StepViews& s, const Repeat& rep);
  // Dense block: residual += o; x = rmsnorm(residual) * post_norm; SwiGLU MLP (+ all-reduce).
  void dense_block(int l, StepViews& s);
  // residual += moe_out; x = rmsnorm(residual) * final_norm; logits [R, V] of `rows`.
  Tensor final_logits(StepViews& s, const Tensor& rows);
  void all_reduce(Tensor& t);
  void mark(const char* op) {
    if (op_hook_) op_hook_(op);
  }

  ModelDesc desc_;
  DecoderSpec spec_;
  DecoderNames names_;
  Backend& be_;
  ParallelConfig par_;
  AllReduceFn all_reduce_;
  DecoderShard shard_;
  DecoderWeights w_;
  DecoderWorkspace ws_;
  int64_t ws_epoch_ = 0;
  std::function<void(const char*)> op_hook_;
};

}  // namespace moeserve
