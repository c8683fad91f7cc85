// The backend op interface: the seam between model code (src/model/) and kernels. The
// parameter specs of the ops (routing, QK-norm, RoPE, KV layout) are in op_specs.h.
//
// Model code composes these ops and never calls a kernel directly. Each op is at the
// granularity a CUDA backend wants to fuse. The CPU backend (backend/cpu/) implements
// every op in plain fp32 with exact dequantisation and is the reference that every CUDA
// op is tested against.
//
// Conventions:
// - T = number of tokens in the batch, H = hidden size, all tensors row-major.
// - Activations use `activation_dtype()` (F32 on CPU, BF16 on CUDA); weights keep their
//   checkpoint dtype (BF16/F16/F32, or F8_E4M3 with block scales).
// - Per-step metadata (positions, block tables, slot mapping) lives in `AttentionMeta`,
//   planned on the host and uploaded into fixed device buffers (plan/run), so a decode
//   step can be captured as one CUDA graph.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/capabilities.h"
#include "backend/op_specs.h"
#include "core/error.h"
#include "core/tensor.h"

namespace moeserve {

// y = x @ W^T with W [out, in]. For FP8 block-scaled weights, scale_inv has shape
// [ceil(out / block_out), ceil(in / block_in)] (f32) and W_real[o, i] =
// fp8(W[o, i]) * scale_inv[o / block_out, i / block_in]; edge blocks may be partial.
struct LinearWeight {
  Tensor weight;     // [out, in]; INT4: I32 [out, in / 8] packed words (model/int4.h)
  Tensor scale_inv;  // F8_E4M3: F32 block scales; INT4: BF16 [out, in / block_in] group scales; else empty
  int block_out = 0;
  int block_in = 0;  // INT4: the group size (block_out = 1)
  // compressed-tensors pack-quantized INT4 kept packed (only backends that ask for it, for
  // routed experts: Backend::int4_experts_packed).
  bool int4() const { return weight.dtype == DType::I32; }
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const { return int4() ? weight.dim(1) * 8 : weight.dim(1); }
  bool fp8() const { return weight.dtype == DType::F8_E4M3; }
};

// One expert's SwiGLU weights: y = w2 (silu(w1 x) * (w3 x)).
struct ExpertWeights {
  LinearWeight w1;  // gate [I, H]
  LinearWeight w3;  // up   [I, H]
  LinearWeight w2;  // down [H, I]
};

// One MoE layer as seen by one rank. Under expert parallelism (EP) a rank owns experts
// [first_local_expert, first_local_expert + experts.size()); under tensor parallelism of
// the experts each ExpertWeights holds this rank's slice of I.
struct MoeWeights {
  Tensor gate;        // router [E, H] (f32 in real checkpoints; any float dtype accepted)
  Tensor score_bias;  // selection bias [E] f32 (e_score_correction_bias); empty: none
  std::vector<ExpertWeights> experts;  // local experts
  int num_experts = 0;                 // E, global
  int top_k = 0;
  int first_local_expert = 0;
  RoutingSpec route;  // how moe_route scores, selects and weights (op_specs.h)
};

// Routing result: for each token its top_k experts (global ids) and renormalised weights.
struct MoeRouting {
  Tensor expert_ids;  // [T, top_k] I32
  Tensor weights;     // [T, top_k] F32
};

// Paged KV cache of one layer: K [num_blocks, block_size, num_kv_heads, k_head_dim] and
// V [num_blocks, block_size, num_kv_heads, v_head_dim] (KvLayout in op_specs.h).
// The cache dtype is the activation dtype (--kv-cache-dtype auto) or F8_E4M3 (fp8): then each
// element is stored as e4m3(x / scale) (saturating RNE, core/fp8_e4m3.h) and read as
// e4m3 * scale, with one scale per tensor per layer as vLLM does (the checkpoint's k_scale /
// v_scale, else 1.0). The MLA latent cache lives in k (k_scale; v unused).
struct KVCacheLayer {
  Tensor k;
  Tensor v;
  float k_scale = 1.f;
  float v_scale = 1.f;
  bool fp8() const { return k.dtype == DType::F8_E4M3; }
};

// Per-step batch metadata shared by all layers. Sequences are laid out one after another
// in the token dimension: sequence s owns query tokens [query_start[s], query_start[s+1]).
struct AttentionMeta {
  int num_seqs = 0;
  int num_tokens = 0;
  int block_size = 0;
  int max_blocks_per_seq = 0;  // row stride of block_tables
  int max_query_len = 0;
  int max_context_len = 0;
  Tensor positions;       // [T] I32: absolute position of each query token
  Tensor query_start;     // [S + 1] I32: cumulative query offsets
  Tensor context_lens;    // [S] I32: tokens in the KV cache after this step's writes
  Tensor block_tables;    // [S, max_blocks_per_seq] I32: physical block of each logical block
  Tensor slot_mapping;    // [T] I32: block * block_size + offset where each token's K/V goes
};

struct QkNormRopeArgs {
  Tensor* q = nullptr;  // [T, Hq_local * head_dim], normalised and rotated in place
  Tensor* k = nullptr;  // [T, Hkv_local * head_dim]
  // FullWidth: [Hq_local * head_dim] / [Hkv_local * head_dim]; PerHead: [head_dim] each
  // (one weight shared by all heads); None: unused (may be null).
  const Tensor* q_norm_weight = nullptr;
  const Tensor* k_norm_weight = nullptr;
  const Tensor* positions = nullptr;  // [T] I32
  RopeSpec rope;
  float eps = 1e-6f;
  QkNormMode norm = QkNormMode::FullWidth;
  // FullWidth QK-norm over all heads. Under TP the mean of squares must cover every
  // rank's heads: the model passes all-reduced sums of squares ([T] F32) and the global
  // widths. When null, the op computes the statistic from the local q/k.
  const Tensor* q_sum_squares = nullptr;
  const Tensor* k_sum_squares = nullptr;
  int64_t q_full_width = 0;  // 0 = local width
  int64_t k_full_width = 0;
};

struct AttentionArgs {
  const Tensor* q;  // [T, Hq * head_dim]
  const KVCacheLayer* kv;
  const AttentionMeta* meta;
  int num_q_heads = 0;
  int num_kv_heads = 0;  // query head h reads kv head h / (num_q_heads / num_kv_heads)
  int head_dim = 0;  // q and K head dim (V too unless v_head_dim is set)
  float scale = 1.f;
  Tensor* out;  // [T, Hq * v_head_dim]
  // Optional hint: weight tensors the ops after attention read (o_proj, router gate, the next
  // layer's q/k/v). A backend may start fetching them into its cache while attention, which
  // moves little data at decode, runs. Never changes results.
  static constexpr int kMaxPrefetch = 5;
  const Tensor* prefetch[kMaxPrefetch] = {};
  int v_head_dim = 0;  // V (and out) head dim; 0: head_dim
};

// Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2) of one layer, as HF's
// DeepseekV3Attention computes it. Per token the cache holds one "head" of
// kv_lora_rank + qk_rope_head_dim values (KvLayout{kv_heads 1, k_head_dim kv_lora + rope,
// v_head_dim 0}): the normalised latent c_kv and the rotated shared key k_rot. Keys and values
// of head h are decompressed from the latent with kv_b_proj:
//   k_h = [W_kb[h] c_kv ; k_rot],  v_h = W_vb[h] c_kv  (kv_b rows per head: [nope | v])
//   out_h = softmax(scale * q_h . k_h) v_h   (causal over the sequence's cached context)
// Under tensor parallelism each rank holds its heads' rows of kv_b and the whole latent (the
// latent projection is replicated, so every rank writes the same cache).
struct MlaArgs {
  Tensor* q = nullptr;       // [T, H * (nope + rope)]: per head [q_nope | q_rope]; q_rope rotated in place
  Tensor* latent = nullptr;  // [T, kv_lora + rope]: kv_a_proj_with_mqa output; normalised + rotated in place
  const Tensor* latent_norm_weight = nullptr;  // kv_a_layernorm [kv_lora]
  float eps = 1e-6f;
  const Tensor* positions = nullptr;  // [T] I32
  // RoPE of the rope parts (head_dim = rotary_dim = qk_rope_head_dim; GptJ when rope_interleave:
  // HF's interleaved form de-interleaves q and k alike, so the dot products are the same).
  RopeSpec rope;
  KVCacheLayer* kv = nullptr;  // k: [blocks, block_size, 1, kv_lora + rope]; v unused
  const AttentionMeta* meta = nullptr;
  const LinearWeight* kv_b = nullptr;  // [H * (nope + v), kv_lora] (this rank's heads)
  int num_heads = 0;  // local
  int qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0, kv_lora_rank = 0;
  float scale = 1.f;     // softmax scale: (nope + rope)^-0.5, times YaRN's mscale^2 where HF applies it
  Tensor* out = nullptr; // [T, H * v]
};

struct DecodeLayerArgs;  // backend/decode_layer_op.h

// The shape checks of Backend::copy_from_host_2d, shared by the backends.
inline void check_copy_2d(const Tensor& dst, size_t dst_pitch, size_t src_pitch, size_t row_bytes, size_t rows) {
  MS_CHECK(row_bytes <= dst_pitch && row_bytes <= src_pitch, "copy_from_host_2d: rows of {} bytes, pitches {} / {}",
           row_bytes, dst_pitch, src_pitch);
  MS_CHECK(rows == 0 || (rows - 1) * dst_pitch + row_bytes <= dst.nbytes(),
           "copy_from_host_2d: {} rows of {} bytes (pitch {}) overrun a tensor of {} bytes", rows, row_bytes, dst_pitch,
           dst.nbytes());
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  virtual DType activation_dtype() const = 0;

  // Memory. alloc returns zeroed memory on the backend's device.
  virtual Tensor alloc(DType t, const Shape& shape) = 0;
  // Weight upload: a device copy of a host tensor (the CPU backend may return the view).
  virtual Tensor upload(const Tensor& host) = 0;
  // Host f32 copy of a device tensor (any dtype), for logits and tests.
  virtual std::vector<float> download_f32(const Tensor& t) = 0;
  // Copies a host buffer into an existing device tensor of the same byte size.
  virtual void copy_from_host(Tensor& dst, const void* src, size_t bytes) = 0;
  // Strided copy into an existing device tensor: `rows` rows of `row_bytes` bytes, row r read
  // at src + r * src_pitch and written at dst.data + r * dst_pitch (pitches >= row_bytes;
  // the last row must end inside dst). Bytes between rows are left as they are. Used to upload
  // only the used columns of a wide block table.
  virtual void copy_from_host_2d(Tensor& dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                                 size_t rows) = 0;
  virtual void synchronize() {}

  // out[t] = table[ids[t]]; table [V, H], ids [T] I32, out [T, H].
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  // out = rmsnorm(x) * weight (statistics in f32).
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // residual += x; out = rmsnorm(residual) * weight. Fused so the sum is read once.
  virtual void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                            Tensor& out) = 0;
  // out [T, out] = x [T, in] @ W^T.
  virtual void linear(const Tensor& x, const LinearWeight& w, Tensor& out) = 0;
  // out [T] F32 = sum over columns of x^2 (for the TP all-reduce of the QK-norm statistic).
  virtual void row_sum_squares(const Tensor& x, Tensor& out) = 0;
  // QK-norm of q and k as args.norm says (RMSNorm over the whole row or over each head, or
  // none), then RoPE (args.rope: NeoX or GPT-J pairs, partial rotary, linear/YaRN scaling) on
  // each head, in place.
  virtual void qk_norm_rope(const QkNormRopeArgs& args) = 0;
  // Writes this step's k/v [T, Hkv * head_dim] into the paged cache at meta.slot_mapping.
  virtual void write_kv(const Tensor& k, const Tensor& v, KVCacheLayer& kv, const AttentionMeta& meta) = 0;
  // Causal GQA attention of each sequence's query tokens over its cached context
  // (prefill, chunked prefill and decode alike).
  virtual void attention(const AttentionArgs& args) = 0;
  // Router as moe.route says (RoutingSpec, op_specs.h): logits = x @ gate^T in f32,
  // s = sigmoid(logits) or softmax(logits); choose top_k of s + bias (bias optional; grouped:
  // only experts of the topk_group best of n_group groups; ties: lower expert id);
  // weights = s[chosen], divided by their sum when renormalize, times routed_scaling_factor.
  virtual void moe_route(const Tensor& x, const MoeWeights& moe, MoeRouting& out) = 0;
  // out [T, H] = sum_k weight[t,k] * expert_{id[t,k]}(x[t]) over the experts this rank
  // owns (others contribute 0; an all-reduce across EP ranks completes the sum).
  virtual void moe_experts(const Tensor& x, const MoeWeights& moe, const MoeRouting& routing,
                           Tensor& out) = 0;
  // out = a + b (elementwise, same shape).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // out = silu(gate) * up (elementwise, same shape; out may alias gate).
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;

  // ---- Fused ops. The default bodies compose the ops above and are the reference (the CPU
  // backend uses them); the CUDA backend runs each as fewer kernels at decode. ----
  // outs[i] = x @ ws[i]^T for i < n (weights sharing one input: the q/k/v projections).
  virtual void linear_multi(const Tensor& x, const LinearWeight* const* ws, Tensor* const* outs, int n) {
    for (int i = 0; i < n; ++i) linear(x, *ws[i], *outs[i]);
  }
  // add_rms_norm(residual, x, weight, eps, out), then linear_multi(out, ws, outs, n).
  virtual void add_rms_norm_linear_multi(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                                         Tensor& out, const LinearWeight* const* ws, Tensor* const* outs, int n) {
    add_rms_norm(residual, x, weight, eps, out);
    linear_multi(out, ws, outs, n);
  }
  // add_rms_norm(residual, x, weight, eps, out), then moe_route(out, moe, routing).
  virtual void add_rms_norm_route(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                                  const MoeWeights& moe, MoeRouting& routing) {
    add_rms_norm(residual, x, weight, eps, out);
    moe_route(out, moe, routing);
  }
  // qk_norm_rope(args), then write_kv(*args.k, v, kv, meta).
  virtual void qk_norm_rope_write_kv(const QkNormRopeArgs& args, const Tensor& v, KVCacheLayer& kv,
                                     const AttentionMeta& meta) {
    qk_norm_rope(args);
    write_kv(*args.k, v, kv, meta);
  }
  // qk_norm_rope_write_kv(qk, v, kv, meta), then attention(attn) (attn.q is qk.q, attn.kv is
  // &kv). A backend may fuse the two (decode); *qk.q and *qk.k are then left as they were.
  virtual void qk_norm_rope_attention(const QkNormRopeArgs& qk, const Tensor& v, KVCacheLayer& kv,
                                      const AttentionMeta& meta, const AttentionArgs& attn) {
    qk_norm_rope_write_kv(qk, v, kv, meta);
    attention(attn);
  }
  // Dense SwiGLU MLP (dense layers, shared experts): out [T, H] = w2 (silu(x w1^T) * (x w3^T)).
  // gate and up are [T, I] scratch buffers (contents afterwards unspecified).
  virtual void dense_mlp(const Tensor& x, const ExpertWeights& w, Tensor& gate, Tensor& up, Tensor& out) {
    linear(x, w.w1, gate);
    linear(x, w.w3, up);
    silu_mul(gate, up, gate);
    linear(gate, w.w2, out);
  }
  // ---- MLA (MlaArgs above). ----
  // RMSNorm of the latent's first kv_lora values, RoPE of its last qk_rope values and of each
  // q head's rope part (in place), then the latent written into the cache at meta.slot_mapping
  // (negative slots skipped).
  virtual void mla_rope_write_kv(const MlaArgs& a) = 0;
  // Causal attention of each query token over its sequence's cached latents (prefill, chunked
  // prefill and decode alike): out [T, H * v].
  virtual void mla_attention(const MlaArgs& a) = 0;
  // mla_rope_write_kv then mla_attention; a backend may fuse them.
  virtual void mla_rope_attention(const MlaArgs& a) {
    mla_rope_write_kv(a);
    mla_attention(a);
  }

  // One pre-norm attention + MoE decoder layer (DecodeLayerArgs, backend/decode_layer_op.h);
  // the default body (decode_layer_op.cpp) composes the ops above and is the reference. CUDA
  // runs a batch-1 decode step's layer as one persistent kernel where the specs allow.
  virtual void decode_layer(const DecodeLayerArgs& a);
  // decode_layer(layers[i]) for i < n: consecutive layers of one step (layers[i + 1] reads
  // layers[i]'s residual and moe_out). CUDA may run them all as one kernel.
  virtual void decode_layers(const DecodeLayerArgs* layers, int n);

  // ---- Optional capabilities (capabilities.h); the defaults: none. ----
  virtual GraphCapture* graph_capture() { return nullptr; }
  virtual DeviceSampler* device_sampler() { return nullptr; }
  // Device memory free / total in bytes; false when the backend does not report it.
  virtual bool memory_info(size_t* free_bytes, size_t* total_bytes) {
    (void)free_bytes, (void)total_bytes;
    return false;
  }
  // Why attention cannot run over a KV cache of `layout` here ("" when it can). The runtime asks
  // right after building the model, so an unsupported layout fails at load naming the model.
  virtual std::string attention_layout_problem(const KvLayout& layout) const {
    (void)layout;
    return {};
  }
  // Why this backend cannot serve compressed-tensors INT4 weights ("" when it can), naming
  // `tensor` (the first INT4 weight_packed of the checkpoint). The CPU reference dequantises
  // them to F32 at load; a backend without W4A16 kernels refuses before loading anything.
  virtual std::string int4_weights_problem(const std::string& tensor) const {
    (void)tensor;
    return {};
  }
  // Whether routed experts' INT4 weights are handed over packed (LinearWeight::int4(): I32
  // words + BF16 group scales) instead of dequantised to F32; int4_weights_problem then names
  // only INT4 weights that are not routed experts.
  virtual bool int4_experts_packed() const { return false; }
  // The queue this backend's ops run on (DeviceQueue); false for a backend without one (cpu).
  virtual bool device_queue(DeviceQueue* out) {
    (void)out;
    return false;
  }
  // Pre-sizes the backend's own step workspaces; no-op for backends without any.
  virtual void reserve_workspaces(const BackendWorkspaceDims& dims) { (void)dims; }
  // Which device of its kind this backend runs on (multi-GPU logs), and its name.
  virtual int device_index() const { return 0; }
  virtual std::string device_name() const { return name(); }
};

}  // namespace moeserve
