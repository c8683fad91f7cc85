// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) as a block of the shared decoder:
// its weight declarations and the attention block, over the backend's MLA ops
// (Backend::mla_rope_write_kv / mla_attention, MlaArgs in backend/backend.h).
//
// Per layer (T tokens, Hq local heads, qk = nope + rope):
//   x = RMSNorm(h) (input_layernorm)
//   q [T, Hq * qk]  = q_b(RMSNorm(q_a(x)))  (or q_proj(x) without q_lora)
//   latent [T, kv_lora + rope] = kv_a_proj_with_mqa(x); the backend normalises the first
//   kv_lora values (kv_a_layernorm), rotates the last rope values and q's rope parts, stores
//   the latent in the paged cache and attends with keys/values decompressed by kv_b_proj.
//   h += o_proj(attn [T, Hq * v])  (row-parallel: + all-reduce)
// Tensor parallelism: heads split (q_b / q_proj, kv_b rows, o_proj columns); the latent path is
// replicated, so every rank's cache holds the same latents.
#include "core/error.h"
#include "model/layers/decoder.h"

namespace moeserve {

namespace {
const std::vector<DType> kDense{DType::BF16, DType::F16, DType::F32};
const std::vector<DType> kLinear{DType::BF16, DType::F16, DType::F32, DType::F8_E4M3};
}  // namespace

void declare_mla_weights(const ModelDesc& d, const MlaSpec& m, const DecoderNames& n, const ParallelConfig& par,
                         const std::string& p, std::vector<WeightDecl>& out) {
  const int64_t H = d.hidden_size, Hq = d.num_attention_heads;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const ShardSpec rep{};
  const ShardSpec col{ShardKind::ColumnParallel, par.rank, par.world};
  const ShardSpec row{ShardKind::RowParallel, par.rank, par.world};
  if (m.q_lora_rank > 0) {
    out.push_back({p + n.q_a, {m.q_lora_rank, H}, kLinear, rep});
    out.push_back({p + n.q_a_norm, {m.q_lora_rank}, kDense, rep});
    out.push_back({p + n.q_b, {Hq * qk, m.q_lora_rank}, kLinear, col});
  } else {
    out.push_back({p + n.q, {Hq * qk, H}, kLinear, col});
  }
  out.push_back({p + n.kv_a, {m.kv_lora_rank + m.qk_rope_head_dim, H}, kLinear, rep});
  out.push_back({p + n.kv_a_norm, {m.kv_lora_rank}, kDense, rep});
  out.push_back({p + n.kv_b, {Hq * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank}, kLinear, col});
  out.push_back({p + n.o, {H, Hq * m.v_head_dim}, kLinear, row});
}

void DecoderModel::mla_attention_block(int l, StepViews& s, std::vector<KVCacheLayer>& kv, const AttentionMeta& meta) {
  DecoderLayer& L = w_.layers[size_t(l)];
  const MlaSpec& m = spec_.mla;
  const float eps = spec_.rms_norm_eps;
  const bool lora = m.q_lora_rank > 0;
  // One input, two projections: q_a (or q_proj) and kv_a_proj_with_mqa.
  const LinearWeight* w[2] = {lora ? &L.mla.q_a : &L.mla.q_b, &L.mla.kv_a};
  Tensor* outs[2] = {lora ? &s.q_a : &s.q, &s.latent};
  if (l == 0)
    be_.linear_multi(s.x, w, outs, 2);
  else  // the previous layer's residual add + this layer's input norm, fused into the projections
    be_.add_rms_norm_linear_multi(s.residual, s.moe_out, L.input_norm, eps, s.x, w, outs, 2);
  mark(l == 0 ? "mla_a_proj" : "norm_mla_a_proj");
  if (lora) {
    be_.rms_norm(s.q_a, L.mla.q_a_norm, eps, s.q_an);  // q_a_layernorm
    be_.linear(s.q_an, L.mla.q_b, s.q);              // [T, Hq_local * qk]
    mark("q_b_proj");
  }
  MlaArgs a;
  a.q = &s.q;
  a.latent = &s.latent;
  a.latent_norm_weight = &L.mla.kv_a_norm;
  a.eps = eps;
  a.positions = &meta.positions;
  a.rope = spec_.rope;
  a.kv = &kv[size_t(l)];
  a.meta = &meta;
  a.kv_b = &L.mla.kv_b;
  a.num_heads = shard_.q_heads;
  a.qk_nope_head_dim = m.qk_nope_head_dim;
  a.qk_rope_head_dim = m.qk_rope_head_dim;
  a.v_head_dim = m.v_head_dim;
  a.kv_lora_rank = m.kv_lora_rank;
  a.scale = m.softmax_scale;
  a.out = &s.mla_out;
  be_.mla_rope_attention(a);
  mark("mla_attention");
  be_.linear(s.mla_out, L.o, s.o);  // row-parallel: partial sums per rank
  mark("o_proj");
  all_reduce(s.o);
}

}  // namespace moeserve
