// CudaBackend attention: argument checks and the kernel choice for paged attention (decode,
// prefill, mixed steps) over a bf16 or FP8 (e4m3) KV cache, the layout/format refusals
// (V head dim != K head dim, INT4 weights), and MLA's two ops (k_mla.cu).
//   q [T, Hq, D] bf16, KV cache [blocks, block_size, Hkv, D] (bf16 or e4m3 with per-layer
//   k_scale / v_scale), out [T, Hq, D] bf16; sequences by query_start / context_lens /
//   block_tables (AttentionMeta).
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/attention/kernels_mla.h"
#include "core/error.h"

namespace moeserve {
using namespace cuda;

namespace {

void check_dev(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.defined(), "{}: {} is empty", op, what);
  MS_CHECK(t.device == Device::CUDA, "{}: {} is not a CUDA tensor", op, what);
}

}  // namespace

std::string CudaBackend::attention_layout_problem(const KvLayout& l) const {
  if (l.v_head_dim == l.k_head_dim || l.v_head_dim == 0) return {};
  return fmt::format("V head dim {} != K head dim {} is not implemented by the CUDA attention kernels (they read K "
                     "and V with one head dim); run it with --device cpu",
                     l.v_head_dim, l.k_head_dim);
}

AttnParams CudaBackend::attention_params(const AttentionArgs& a) {
  MS_CHECK(a.q && a.kv && a.meta && a.out, "attention: missing argument");
  MS_CHECK(a.v_head_dim == 0 || a.v_head_dim == a.head_dim,
           "attention: V head dim {} != K head dim {} is not implemented on CUDA", a.v_head_dim, a.head_dim);
  const AttentionMeta& m = *a.meta;
  check_dev(*a.q, "attention", "q");
  check_dev(*a.out, "attention", "out");
  check_dev(a.kv->k, "attention", "k cache");
  const DType kvt = a.kv->k.dtype;
  MS_CHECK(a.q->dtype == DType::BF16 && a.out->dtype == DType::BF16 &&
               (kvt == DType::BF16 || kvt == DType::F8_E4M3) && a.kv->v.dtype == kvt,
           "attention: q and out must be BF16, the KV cache BF16 or F8_E4M3 (got {} / {})", dtype_name(kvt),
           dtype_name(a.kv->v.dtype));
  MS_CHECK(a.kv->k.rank() == 4 && a.kv->k.dim(2) == a.num_kv_heads && a.kv->k.dim(3) == a.head_dim &&
               a.kv->k.dim(1) == m.block_size,
           "attention: cache {} vs kv heads {} head_dim {} block_size {}", shape_str(a.kv->k.shape), a.num_kv_heads,
           a.head_dim, m.block_size);
  MS_CHECK(a.q->numel() == int64_t(m.num_tokens) * a.num_q_heads * a.head_dim && a.out->numel() == a.q->numel(),
           "attention: q {} for {} tokens x {} heads x {}", shape_str(a.q->shape), m.num_tokens, a.num_q_heads,
           a.head_dim);
  AttnParams p;
  p.q = a.q->data, p.k_cache = a.kv->k.data, p.v_cache = a.kv->v.data, p.out = a.out->data;
  p.query_start = m.query_start.ptr<int32_t>();
  p.context_lens = m.context_lens.ptr<int32_t>();
  p.block_tables = m.block_tables.ptr<int32_t>();
  p.num_seqs = m.num_seqs, p.T = m.num_tokens, p.max_query_len = m.max_query_len;
  p.max_blocks_per_seq = m.max_blocks_per_seq, p.block_size = m.block_size;
  p.Hq = a.num_q_heads, p.Hkv = a.num_kv_heads, p.D = a.head_dim, p.scale = a.scale;
  p.kv_rows = a.kv->v.numel() == a.kv->k.numel() ? a.kv->k.dim(0) * a.kv->k.dim(1) : 0;
  p.kv_fp8 = kvt == DType::F8_E4M3;
  p.k_scale = a.kv->k_scale, p.v_scale = a.kv->v_scale;
  return p;
}

namespace {

// The shape and dtype checks shared by both MLA ops; returns T.
int64_t check_mla(const MlaArgs& a, const char* op) {
  MS_CHECK(a.q && a.latent && a.positions && a.kv && a.meta, "{}: null argument", op);
  MS_CHECK(a.num_heads > 0 && a.qk_nope_head_dim >= 0 && a.qk_rope_head_dim > 0 && a.qk_rope_head_dim % 2 == 0 &&
               a.qk_rope_head_dim <= kMlaMaxR && a.v_head_dim > 0 && a.kv_lora_rank > 0 &&
               a.kv_lora_rank <= kMlaMaxC,
           "{}: MLA dims heads={} nope={} rope={} v={} kv_lora={} are outside what the CUDA kernels take "
           "(rope even and <= 64, kv_lora_rank <= 512; every DeepSeek-V2/V3 / Kimi-K2 checkpoint has 64 / 512)",
           op, a.num_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank);
  check_dev(*a.q, op, "q");
  check_dev(*a.latent, op, "latent");
  check_dev(*a.positions, op, "positions");
  check_dev(a.kv->k, op, "latent cache");
  MS_CHECK(a.q->dtype == DType::BF16 && a.latent->dtype == DType::BF16, "{}: q and latent must be BF16 (got {} / {})",
           op, dtype_name(a.q->dtype), dtype_name(a.latent->dtype));
  const int64_t T = a.positions->numel();
  const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim, L = a.kv_lora_rank + a.qk_rope_head_dim;
  MS_CHECK(a.q->numel() == T * a.num_heads * qk, "{}: q {} must be [{}, {} heads x {}]", op, shape_str(a.q->shape), T,
           a.num_heads, qk);
  MS_CHECK(a.latent->numel() == T * L, "{}: latent {} must be [{}, {}]", op, shape_str(a.latent->shape), T, L);
  const Tensor& c = a.kv->k;
  MS_CHECK(c.dtype == DType::BF16 || c.dtype == DType::F8_E4M3,
           "{}: the latent cache must be BF16 or F8_E4M3 (--kv-cache-dtype fp8) on CUDA, got {}", op,
           dtype_name(c.dtype));
  MS_CHECK(c.rank() == 4 && c.dim(2) == 1 && c.dim(3) == L,
           "{}: the latent cache {} must be [blocks, block_size, 1, {}] (kv_lora_rank + qk_rope_head_dim)", op,
           shape_str(c.shape), L);
  MS_CHECK(a.meta->block_size == 0 || a.meta->block_size == c.dim(1),
           "{}: meta.block_size {} but the cache has blocks of {}", op, a.meta->block_size, c.dim(1));
  MS_CHECK(a.rope.rotary_dim == a.qk_rope_head_dim, "{}: RoPE rotary_dim {} must equal qk_rope_head_dim {}", op,
           a.rope.rotary_dim, a.qk_rope_head_dim);
  return T;
}

}  // namespace

void CudaBackend::mla_rope_write_kv(const MlaArgs& a) {
  const char* op = "mla_rope_write_kv";
  prequant_ = {};
  const int64_t T = check_mla(a, op);
  MS_CHECK(a.latent_norm_weight != nullptr, "{}: kv_a_layernorm weight is null", op);
  check_dev(*a.latent_norm_weight, op, "kv_a_layernorm weight");
  MS_CHECK(a.latent_norm_weight->numel() == a.kv_lora_rank &&
               (a.latent_norm_weight->dtype == DType::BF16 || a.latent_norm_weight->dtype == DType::F32),
           "{}: kv_a_layernorm weight {} {} must be BF16 or F32 with {} elements", op,
           dtype_name(a.latent_norm_weight->dtype), shape_str(a.latent_norm_weight->shape), a.kv_lora_rank);
  const AttentionMeta& m = *a.meta;
  check_dev(m.slot_mapping, op, "slot_mapping");
  MS_CHECK(m.slot_mapping.numel() == T, "{}: slot_mapping has {} entries for {} tokens", op, m.slot_mapping.numel(), T);
  MlaRopeKvParams p;
  p.q = a.q->data, p.latent = a.latent->data;
  p.norm_w = a.latent_norm_weight->data, p.norm_w_bf16 = a.latent_norm_weight->dtype == DType::BF16;
  p.eps = a.eps;
  p.positions = a.positions->ptr<int32_t>();
  p.slot_mapping = m.slot_mapping.ptr<int32_t>();
  p.cache = a.kv->k.data, p.cache_fp8 = a.kv->fp8(), p.k_scale = a.kv->k_scale;
  p.rope = a.rope;
  p.T = int(T), p.H = a.num_heads, p.N = a.qk_nope_head_dim, p.R = a.qk_rope_head_dim, p.C = a.kv_lora_rank;
  launch_mla_rope_write_kv(p, stream_);
}

void CudaBackend::mla_attention(const MlaArgs& a) {
  const char* op = "mla_attention";
  prequant_ = {};
  const int64_t T = check_mla(a, op);
  MS_CHECK(a.kv_b != nullptr && a.out != nullptr, "{}: kv_b or out is null", op);
  const LinearWeight& w = *a.kv_b;
  check_dev(w.weight, op, "kv_b_proj");
  const int64_t kvw = a.qk_nope_head_dim + a.v_head_dim;
  MS_CHECK(w.weight.rank() == 2 && w.out_features() == a.num_heads * kvw && w.in_features() == a.kv_lora_rank,
           "{}: kv_b_proj {} must be [{} heads x (nope {} + v {}), kv_lora_rank {}]", op, shape_str(w.weight.shape),
           a.num_heads, a.qk_nope_head_dim, a.v_head_dim, a.kv_lora_rank);
  MS_CHECK(w.weight.dtype == DType::BF16 || w.fp8(), "{}: kv_b_proj must be BF16 or FP8 e4m3 (block-scaled), got {}",
           op, dtype_name(w.weight.dtype));
  if (w.fp8()) {
    check_dev(w.scale_inv, op, "kv_b_proj scale_inv");
    MS_CHECK(w.block_out > 0 && w.block_in > 0 && w.scale_inv.dtype == DType::F32 && w.scale_inv.rank() == 2 &&
                 w.scale_inv.dim(0) == ceil_div(w.out_features(), w.block_out) &&
                 w.scale_inv.dim(1) == ceil_div(w.in_features(), w.block_in),
             "{}: kv_b_proj scale_inv {} does not match blocks {}x{} of {}", op, shape_str(w.scale_inv.shape),
             w.block_out, w.block_in, shape_str(w.weight.shape));
  }
  check_dev(*a.out, op, "out");
  MS_CHECK(a.out->dtype == DType::BF16 && a.out->numel() == T * a.num_heads * a.v_head_dim,
           "{}: out {} {} must be BF16 [{}, {}]", op, dtype_name(a.out->dtype), shape_str(a.out->shape), T,
           a.num_heads * a.v_head_dim);
  const AttentionMeta& m = *a.meta;
  const int H = a.num_heads, C = a.kv_lora_rank, R = a.qk_rope_head_dim, L = C + R;
  MlaProjParams pp;
  pp.q = a.q->data, pp.out = a.out->data;
  pp.kv_b = w.weight.data, pp.kv_b_fp8 = w.fp8();
  if (w.fp8()) {
    pp.kv_b_scale_inv = w.scale_inv.ptr<float>();
    pp.block_out = w.block_out, pp.block_in = w.block_in, pp.scale_cols = int(w.scale_inv.dim(1));
  }
  pp.H = H, pp.N = a.qk_nope_head_dim, pp.R = R, pp.C = C, pp.V = a.v_head_dim;
  MlaFlashParams fp;
  fp.cache = a.kv->k.data, fp.cache_fp8 = a.kv->fp8(), fp.k_scale = a.kv->k_scale;
  fp.positions = a.positions->ptr<int32_t>();
  if (m.num_seqs > 0) {
    fp.query_start = m.query_start.ptr<int32_t>();
    fp.block_tables = m.block_tables.ptr<int32_t>();
    pp.query_start = fp.query_start;
  }
  fp.num_seqs = m.num_seqs, fp.max_blocks_per_seq = m.max_blocks_per_seq, fp.block_size = int(a.kv->k.dim(1));
  fp.H = H, fp.R = R, fp.C = C;
  pp.num_seqs = m.num_seqs;
  MlaOpDesc md;
  md.T = int(T), md.num_seqs = m.num_seqs, md.max_query_len = m.max_query_len, md.max_context_len = m.max_context_len;
  md.H = H, md.nope = a.qk_nope_head_dim, md.R = R, md.C = C, md.V = a.v_head_dim, md.cache_fp8 = a.kv->fp8();
  md.ws = workspace_view();
  const MlaKernel mk = select_mla(md, caps_, tuning);
  // Tokens per pass (mla_chunk_bytes), so a long prefill runs in chunks (a decode step is one pass).
  const int chunk = mk.chunk, splits = mk.splits;
  const int qmax = m.max_query_len > 0 ? std::min<int>(m.max_query_len, chunk) : std::min<int>(int(T), chunk);
  fp.row_tiles = ceil_div(qmax * H, kMlaRowTile);
  const int Tc = int(std::min<int64_t>(T, chunk));
  const size_t qa_bytes = size_t(Tc) * H * L * 2;
  const size_t head = mla_head_bytes(Tc, H, C, R), split_bytes = mla_split_bytes(Tc, H, C);
  char* ws = static_cast<char*>(workspace(kAttnPart, head + (splits > 1 ? split_bytes * splits : 0)));
  pp.q_abs = ws, fp.q_abs = ws;
  pp.o_lat = ws + qa_bytes, fp.o_lat = ws + qa_bytes;
  if (splits > 1) {
    fp.part_o = reinterpret_cast<float*>(ws + head);
    fp.part_ml = fp.part_o + size_t(splits) * Tc * H * C;
  }
  fp.splits = splits;
  for (int t0 = 0; t0 < int(T); t0 += chunk) {
    const int n = std::min<int>(chunk, int(T) - t0);
    pp.t0 = t0, pp.T = n;
    pp.mode = MlaProj::kQAbsorb, pp.alpha = a.scale;
    launch_mla_proj(pp, stream_);
    fp.t_lo = t0, fp.t_hi = t0 + n;
    launch_mla_flash(fp, stream_);
    pp.mode = MlaProj::kVOut, pp.alpha = 1.f;
    launch_mla_proj(pp, stream_);
  }
}

void CudaBackend::attention(const AttentionArgs& a) {
  AttnParams p = attention_params(a);
  const AttentionMeta& m = *a.meta;
  AttentionOpDesc d;
  d.T = p.T, d.num_seqs = p.num_seqs, d.max_query_len = p.max_query_len, d.max_context_len = m.max_context_len;
  d.Hq = p.Hq, d.Hkv = p.Hkv, d.D = p.D, d.block_size = p.block_size, d.kv_fp8 = p.kv_fp8;
  d.ws = workspace_view();
  const AttentionKernel k = select(d);
  // Split-KV partials (splits from max_context_len, so a captured grid is fixed; clamped to the
  // workspace inside a capture by the selector).
  if (k.splits > 1) {
    const size_t per_split = size_t(std::max(1, p.T)) * p.Hq * (p.D + 2) * 4;
    float* ws = static_cast<float*>(workspace(kAttnPart, per_split * k.splits));
    p.part_o = ws;
    p.part_ml = ws + size_t(k.splits) * p.T * p.Hq * p.D;
  }
  p.splits = k.splits;
  switch (k.id) {
    case AttentionKernel::kVerify: return launch_attention_verify(p, stream_);
    case AttentionKernel::kWgmma: return launch_attention_wgmma(p, stream_);
    case AttentionKernel::kPrefill: return launch_attention_prefill(p, stream_);
    case AttentionKernel::kTc: return launch_attention_tc(p, stream_);
    default: return launch_attention(p, stream_);
  }
}

}  // namespace moeserve
