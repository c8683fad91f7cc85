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
  int shared_inter = 0;  // local shared-expert intermediate size (0: none); always sliced, EP or not
};
// Throws naming the size that does not split over par.world ranks.
DecoderShard plan_decoder_shard(const ModelDesc& d, const ParallelConfig& par);
// plan_decoder_shard's refusal as a message ("" when the split works): ArchConfig::shard_problem.
std::string decoder_shard_problem(const ModelDesc& d, const ParallelConfig& par);
// FP8 checkpoints: "" when every split keeps whole weight blocks, else a message naming the
// tensor and what to use instead (the loader is exact either way; the fast kernels want whole
// 128 blocks, so user-facing layouts refuse it).
// With an MLA spec (DecoderSpec::mla) the attention checks are MLA's (q / kv_b rows, o_proj
// columns per rank), and shared experts are checked too.
struct DecoderSpec;
std::string decoder_fp8_split_problem(const ModelDesc& d, const ParallelConfig& par, const DecoderSpec* spec = nullptr);

// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; layers/mla.cpp). Sizes from the
// config; q_lora_rank 0 = q_proj instead of q_a_proj / q_a_layernorm / q_b_proj.
struct MlaSpec {
  bool enabled = false;
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  float softmax_scale = 1.f;  // (nope + rope)^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 as HF
};

// What varies between decoder families inside the shared blocks.
struct DecoderSpec {
  QkNormMode qk_norm = QkNormMode::FullWidth;
  RopeSpec rope;
  RoutingSpec route;
  bool routing_bias = false;  // the router has a selection bias tensor
  float rms_norm_eps = 1e-6f;
  std::vector<char> dense_layer;  // per layer: 1 = dense MLP, 0 = MoE
  MlaSpec mla;                    // enabled: MLA attention instead of GQA q/k/v/o
  bool shared_experts = false;    // MoE layers add a dense SwiGLU shared expert (ModelDesc sizes)
};

// The checkpoint names of one layer's tensors (hub spelling), relative to "model.layers.{l}.".
struct DecoderNames {
  // Prefix of every tensor ("language_model." for Kimi-K2.5's text backbone).
  std::string root;
  std::string q = "self_attn.q_proj.weight", k = "self_attn.k_proj.weight", v = "self_attn.v_proj.weight";
  std::string o = "self_attn.o_proj.weight";
  std::string q_norm = "self_attn.q_norm.weight", k_norm = "self_attn.k_norm.weight";
  std::string input_norm = "input_layernorm.weight", post_norm = "post_attention_layernorm.weight";
  std::string router = "mlp.gate.weight", router_bias = "mlp.e_score_correction_bias";
  std::string experts = "mlp.experts.";  // + "{e}." + w1/w3/w2 below
  std::string w1 = "gate_proj.weight", w3 = "up_proj.weight", w2 = "down_proj.weight";
  std::string dense = "mlp.";  // dense MLP: + w1/w3/w2
  std::string shared = "mlp.shared_experts.";  // shared expert: + w1/w3/w2
  // MLA (DeepSeek-V3 hub names).
  std::string q_a = "self_attn.q_a_proj.weight", q_a_norm = "self_attn.q_a_layernorm.weight";
  std::string q_b = "self_attn.q_b_proj.weight", kv_a = "self_attn.kv_a_proj_with_mqa.weight";
  std::string kv_a_norm = "self_attn.kv_a_layernorm.weight", kv_b = "self_attn.kv_b_proj.weight";
  std::string layer_prefix(int l) const { return root + "model.layers." + std::to_string(l) + "."; }
};

// One layer's MLA weights (local slices: q / q_b / kv_b rows of this rank's heads).
struct MlaWeights {
  LinearWeight q_a, q_b, kv_a, kv_b;  // q_a empty without q_lora (q_b is then q_proj)
  Tensor q_a_norm, kv_a_norm;
};

// One layer's weights (local slices). A dense layer fills mlp, a MoE layer moe.
struct DecoderLayer {
  Tensor input_norm, post_attention_norm;  // [H]
  LinearWeight q, k, v, o;                 // local slices
  Tensor q_norm, k_norm;  // FullWidth: [Hq_local*D], [Hkv_local*D]; PerHead: [D]; None: empty
  MoeWeights moe;
  ExpertWeights mlp;
  ExpertWeights shared;  // shared expert (MoE layers with DecoderSpec::shared_experts)
  MlaWeights mla;        // DecoderSpec::mla (then q/k/v are unused; o is o_proj)
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
  Tensor sh_gate, sh_up, sh_out;   // shared expert: [max_tokens, shared_inter_local], [max_tokens, H]
  Tensor q_a, q_an, latent;        // MLA: [max_tokens, q_lora] x2, [max_tokens, kv_lora + rope]
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
  Tensor sh_gate, sh_up, sh_out;
  Tensor q_a, q_an, latent, mla_out;  // mla_out: [T, Hq_local * v_head_dim] (in attn's memory)
};

// Appends the declarations of the shared blocks (hub names under `names`).
void declare_decoder_weights(const ModelDesc& d, const DecoderSpec& spec, const DecoderNames& names,
                             const ParallelConfig& par, std::vector<WeightDecl>& out);

// Appends layer `prefix`'s MLA attention tensors (layers/mla.cpp): q_a_proj [q_lora, H] +
// q_a_layernorm [q_lora] (replicated) + q_b_proj [Hq * (nope + rope), q_lora] (column), or
// q_proj [Hq * (nope + rope), H] (column); kv_a_proj_with_mqa [kv_lora + rope, H] and
// kv_a_layernorm [kv_lora] (replicated: every rank holds the whole latent); kv_b_proj
// [Hq * (nope + v), kv_lora] (column: this rank's heads); o_proj [H, Hq * v] (row).
void declare_mla_weights(const ModelDesc& d, const MlaSpec& m, const DecoderNames& n, const ParallelConfig& par,
                         const std::string& prefix, std::vector<WeightDecl>& out);

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
  // bench-model's synthetic routing (tools/bench_verify.h): when set, MoE layer l (l <
  // ids.size()) runs its experts on ids[l]'s first T rows ([>= T, top_k] I32 on the backend's
  // device) instead of the router's choice; the router still runs, so its cost and its weights
  // stay in the step. Forces the separate ops (no fused decode_layers). Empty: the router's.
  void set_routing_override(std::vector<Tensor> ids) { routing_override_ = std::move(ids); }
  bool routing_overridden() const { return !routing_override_.empty(); }
  // Every declaration of config().weights(this rank) from `source` (Model::load_from).
  void load_from(const WeightSource& source) override;

  // Speculative decoding (layers/mtp.cpp): hidden-state capture at layer boundaries and after
  // the final norm, and DeepSeek-V3-style MTP modules at model.layers.{L + k}.
  void set_capture(const HiddenCapture& c) override;
  const std::vector<Tensor>& captured() const override { return cap_views_; }
  const Tensor& embedding_table() const override { return w_.embed; }
  void load_mtp(const Checkpoint& ckpt, int num_modules) override;
  KvLayout mtp_kv_layout() const override;
  Tensor mtp_forward(const MtpStepArgs& a) override;
  int num_mtp_modules() const { return int(mtp_.size()); }

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
  // One layer's tensors of `got` (layer prefix l), converted and uploaded.
  DecoderLayer upload_layer(int l, const std::map<std::string, LoadedTensor>& got, bool dense);
  Tensor host_for_backend(const Tensor& t) const;
  // Hidden-state capture (set_capture): whether the step keeps anything, and the copies at
  // boundary b (before layer b's attention block; b == num_layers after the last layer) and of
  // the final norm's output (after final_logits). No-ops when not capturing.
  bool capturing() const { return !cap_.empty(); }
  void capture_boundary(int b, StepViews& s, const Tensor& ids);
  void capture_final(StepViews& s);

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
  // MoE block: residual += o; x = rmsnorm(residual) * post_norm; route; experts, plus the
  // shared expert when the spec has one (+ one all-reduce of their sum).
  void moe_block(int l, StepViews& s, const Repeat& rep);
  // MLA attention block of layer l (layers/mla.cpp): the input norm (l > 0: fused with the
  // previous layer's residual add), q (q_a + q_a_layernorm + q_b, or q_proj) and the latent
  // (kv_a_proj_with_mqa), mla_rope_attention, o_proj (+ all-reduce).
  void mla_attention_block(int l, StepViews& s, std::vector<KVCacheLayer>& kv, const AttentionMeta& meta);
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
  std::vector<Tensor> routing_override_;  // set_routing_override
  // MTP module k: its norms and eh_proj split into the embedding half and the hidden half
  // (eh_proj(cat(e, h)) = eh_e e + eh_h h); its decoder layer is w_.layers[num_layers + k].
  struct MtpModule {
    Tensor enorm, hnorm, shared_norm;  // [H]
    LinearWeight eh_e, eh_h;           // [H, H] each
  };
  std::vector<MtpModule> mtp_;
  HiddenCapture cap_;
  std::vector<Tensor> cap_bufs_;   // [max_tokens, H] per capture (grow-only)
  std::vector<Tensor> cap_views_;  // the last step's [T, H] views
  Tensor iota_;                    // [max_tokens] I32 0, 1, ...: row copies through be_.embedding
};

}  // namespace moeserve
