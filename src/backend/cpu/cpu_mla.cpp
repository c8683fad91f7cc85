// CPU multi-head latent attention (MLA, DeepSeek-V2/V3, Kimi-K2), the fp32 reference: the
// latent cache holds kv_lora_rank + qk_rope_head_dim values per token (one "head"); keys and
// values are decompressed from it with kv_b_proj for every step, as HF's DeepseekV3Attention
// does (the "naive" form; the absorbed form is a CUDA-kernel matter).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/fp8_e4m3.h"
#include "core/thread_pool.h"

namespace moeserve::cpu {

namespace {

// Common shape checks of MlaArgs; returns T.
int64_t check_mla_args(const MlaArgs& a, const char* op) {
  MS_CHECK(a.q && a.latent && a.positions && a.kv && a.meta, "{}: null argument", op);
  MS_CHECK(a.num_heads > 0 && a.qk_nope_head_dim >= 0 && a.qk_rope_head_dim > 0 && a.qk_rope_head_dim % 2 == 0 &&
               a.v_head_dim > 0 && a.kv_lora_rank > 0,
           "{}: bad MLA dims heads={} nope={} rope={} v={} kv_lora={}", op, a.num_heads, a.qk_nope_head_dim,
           a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank);
  check_f32(*a.q, op, "q");
  check_f32(*a.latent, op, "latent");
  check_i32(*a.positions, op, "positions");
  const int64_t T = a.positions->numel();
  const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim, L = a.kv_lora_rank + a.qk_rope_head_dim;
  MS_CHECK(rows_of(*a.q) == T && cols_of(*a.q) == a.num_heads * qk, "{}: q {} must be [{}, {} heads x {}]", op,
           shape_str(a.q->shape), T, a.num_heads, qk);
  MS_CHECK(rows_of(*a.latent) == T && cols_of(*a.latent) == L, "{}: latent {} must be [{}, {}]", op,
           shape_str(a.latent->shape), T, L);
  const Tensor& c = a.kv->k;
  check_host(c, op, "latent cache");
  MS_CHECK(c.dtype == DType::F32 || c.dtype == DType::F8_E4M3,
           "{}: the latent cache must be F32 or F8_E4M3 (--kv-cache-dtype fp8) on the CPU backend, got {}", op,
           dtype_name(c.dtype));
  MS_CHECK(c.rank() == 4 && c.dim(2) == 1 && c.dim(3) == L,
           "{}: the latent cache {} must be [blocks, block_size, 1, {}] (kv_lora_rank + qk_rope_head_dim)", op,
           shape_str(c.shape), L);
  MS_CHECK(a.meta->block_size == 0 || a.meta->block_size == c.dim(1),
           "{}: meta.block_size {} but the cache has blocks of {}", op, a.meta->block_size, c.dim(1));
  MS_CHECK(a.rope.rotary_dim == a.qk_rope_head_dim,
           "{}: RoPE rotary_dim {} must equal qk_rope_head_dim {}", op, a.rope.rotary_dim, a.qk_rope_head_dim);
  MS_CHECK(a.rope.theta > 0.f && (a.rope.scaling != RopeScaling::Yarn || a.rope.original_max_position > 0) &&
               (a.rope.scaling == RopeScaling::None || a.rope.factor > 0.f),
           "{}: bad RoPE parameters", op);
  return T;
}

// Rotates x[0, rd) in place: NeoX (i, i + rd/2) or GPT-J (2i, 2i+1) pairs, angle i.
void rotate(float* x, int rd, RopeStyle style, const float* cs, const float* sn) {
  const int half = rd / 2;
  if (style == RopeStyle::NeoX) {
    for (int i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cs[i] - b * sn[i];
      x[i + half] = b * cs[i] + a * sn[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * cs[i] - b * sn[i];
      x[2 * i + 1] = b * cs[i] + a * sn[i];
    }
  }
}

}  // namespace

void mla_rope_write_kv(const MlaArgs& a) {
  const char* op = "mla_rope_write_kv";
  const int64_t T = check_mla_args(a, op);
  MS_CHECK(a.latent_norm_weight != nullptr, "{}: kv_a_layernorm weight is null", op);
  check_float_weight(*a.latent_norm_weight, op, "kv_a_layernorm weight", /*allow_fp8=*/false);
  MS_CHECK(a.latent_norm_weight->numel() == a.kv_lora_rank, "{}: kv_a_layernorm weight {} must have {} elements", op,
           shape_str(a.latent_norm_weight->shape), a.kv_lora_rank);
  const std::vector<float> w = to_f32_vector(*a.latent_norm_weight);
  const int64_t H = a.num_heads, nope = a.qk_nope_head_dim, rd = a.qk_rope_head_dim, qk = nope + rd;
  const int64_t C = a.kv_lora_rank, L = C + rd;
  const int32_t* pos = a.positions->ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) MS_CHECK(pos[t] >= 0, "{}: negative position {} at token {}", op, pos[t], t);
  std::vector<float> inv_freq(static_cast<size_t>(rd / 2));
  for (int64_t i = 0; i < rd / 2; ++i) inv_freq[size_t(i)] = rope_inv_freq(a.rope, int(i));
  const float mscale = a.rope.scaling == RopeScaling::Yarn ? a.rope.attention_factor : 1.f;
  float* q = a.q->ptr<float>();
  float* lat = a.latent->ptr<float>();
  ThreadPool::global().parallel_for(T, [&](int64_t b, int64_t e) {
    std::vector<float> cs(static_cast<size_t>(rd / 2)), sn(static_cast<size_t>(rd / 2));
    for (int64_t t = b; t < e; ++t) {
      // cos/sin as HF: fp32 angle pos * inv_freq, times YaRN's attention factor.
      for (size_t i = 0; i < inv_freq.size(); ++i) {
        const float angle = float(pos[t]) * inv_freq[i];
        cs[i] = float(std::cos(double(angle))) * mscale;
        sn[i] = float(std::sin(double(angle))) * mscale;
      }
      float* x = lat + t * L;
      // kv_a_layernorm over the latent (statistic in double, products in fp32 as HF).
      double ss = 0;
      for (int64_t j = 0; j < C; ++j) ss += double(x[j]) * double(x[j]);
      const float inv = 1.f / std::sqrt(float(ss / double(C)) + a.eps);
      for (int64_t j = 0; j < C; ++j) x[j] = w[size_t(j)] * (x[j] * inv);
      rotate(x + C, int(rd), a.rope.style, cs.data(), sn.data());
      for (int64_t h = 0; h < H; ++h) rotate(q + t * H * qk + h * qk + nope, int(rd), a.rope.style, cs.data(), sn.data());
    }
  }, 4);
  // The cache write.
  const AttentionMeta& m = *a.meta;
  check_i32(m.slot_mapping, op, "slot_mapping");
  MS_CHECK(m.slot_mapping.numel() == T, "{}: slot_mapping has {} entries for {} tokens", op, m.slot_mapping.numel(),
           T);
  const int64_t slots = a.kv->k.dim(0) * a.kv->k.dim(1);
  const int32_t* slot = m.slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (slot[t] < 0) continue;  // padding token
    MS_CHECK(slot[t] < slots, "{}: slot {} of token {} is outside the cache ({} slots)", op, slot[t], t, slots);
    if (a.kv->fp8()) {  // FP8 latent cache: e4m3(x / k_scale) (one per-tensor scale, as vLLM's MLA cache)
      uint8_t* c8 = a.kv->k.ptr<uint8_t>() + int64_t(slot[t]) * L;
      for (int64_t i = 0; i < L; ++i) c8[i] = fp8::kv_store(lat[t * L + i], a.kv->k_scale);
      continue;
    }
    std::memcpy(a.kv->k.ptr<float>() + int64_t(slot[t]) * L, lat + t * L, size_t(L) * sizeof(float));
  }
}

void mla_attention(const MlaArgs& a) {
  const char* op = "mla_attention";
  const int64_t T = check_mla_args(a, op);
  MS_CHECK(a.kv_b != nullptr && a.out != nullptr, "{}: kv_b or out is null", op);
  check_linear_weight(*a.kv_b, op);
  const int64_t H = a.num_heads, nope = a.qk_nope_head_dim, rd = a.qk_rope_head_dim, qk = nope + rd;
  const int64_t vd = a.v_head_dim, C = a.kv_lora_rank, L = C + rd, kvw = nope + vd;
  MS_CHECK(a.kv_b->out_features() == H * kvw && a.kv_b->in_features() == C,
           "{}: kv_b_proj {} must be [{} heads x (nope {} + v {}), kv_lora_rank {}]", op,
           shape_str(a.kv_b->weight.shape), H, nope, vd, C);
  check_f32(*a.out, op, "out");
  MS_CHECK(rows_of(*a.out) == T && cols_of(*a.out) == H * vd, "{}: out {} must be [{}, {}]", op,
           shape_str(a.out->shape), T, H * vd);
  const AttentionMeta& m = *a.meta;
  const int64_t nblocks = a.kv->k.dim(0), bs = a.kv->k.dim(1);
  const std::vector<int32_t> seq_of = check_attention_meta(m, T, nblocks, bs, op);
  const int32_t* pos = m.positions.ptr<int32_t>();
  const int32_t* qs = m.num_seqs > 0 ? m.query_start.ptr<int32_t>() : nullptr;
  const int32_t* bt = m.num_seqs > 0 ? m.block_tables.ptr<int32_t>() : nullptr;
  const int64_t mb = m.max_blocks_per_seq;
  const bool fp8 = a.kv->fp8();
  const float* q = a.q->ptr<float>();
  float* out = a.out->ptr<float>();
  const float scale = a.scale;

  // per sequence: cached rows [n, L] (f32; dequantised for an FP8 cache), latents [n, C], decompressed [n, H * kvw]
  std::vector<float> rows, lat, kv;
  for (int64_t s = 0; s < m.num_seqs; ++s) {
    if (qs[s] == qs[s + 1]) continue;
    int64_t n = 0;  // positions any query token of this sequence reads
    for (int64_t t = qs[s]; t < qs[s + 1]; ++t) n = std::max<int64_t>(n, int64_t(pos[t]) + 1);
    const int32_t* table = bt + s * mb;
    lat.resize(size_t(n * C));
    rows.resize(size_t(n * L));
    std::vector<const float*> rot(static_cast<size_t>(n));  // k_rot of position j
    for (int64_t j = 0; j < n; ++j) {
      const int64_t r = int64_t(table[j / bs]) * bs + j % bs;
      float* dst = rows.data() + j * L;
      if (fp8) {
        const uint8_t* b = a.kv->k.ptr<uint8_t>() + r * L;
        for (int64_t i = 0; i < L; ++i) dst[i] = fp8::kv_load(b[i], a.kv->k_scale);
      } else {
        std::memcpy(dst, a.kv->k.ptr<float>() + r * L, size_t(L) * sizeof(float));
      }
      std::memcpy(lat.data() + j * C, dst, size_t(C) * sizeof(float));
      rot[size_t(j)] = dst + C;
    }
    // [k_nope | v] of every head at every position: kv_b_proj over the latents (HF's expand_kv).
    kv.resize(size_t(n * H * kvw));
    linear_f32(lat.data(), n, *a.kv_b, kv.data());
    const int64_t t0 = qs[s], nt = qs[s + 1] - qs[s];
    // One task per (token, head): scores over positions 0..p, fp32 softmax with the max
    // subtracted, then the probability-weighted sum of V.
    ThreadPool::global().parallel_for(nt * H, [&](int64_t b, int64_t e) {
      std::vector<float> scores, qv(static_cast<size_t>(qk)), acc(static_cast<size_t>(vd));
      for (int64_t item = b; item < e; ++item) {
        const int64_t t = t0 + item / H, h = item % H;
        const int64_t np = int64_t(pos[t]) + 1;
        std::memcpy(qv.data(), q + t * H * qk + h * qk, size_t(qk) * sizeof(float));
        scores.resize(size_t(np));
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < np; ++j) {
          const float* kn = kv.data() + (j * H + h) * kvw;
          const float sc = (dot_f32(qv.data(), kn, nope) + dot_f32(qv.data() + nope, rot[size_t(j)], rd)) * scale;
          scores[size_t(j)] = sc;
          mx = std::max(mx, sc);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < np; ++j) {
          scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
          sum += scores[size_t(j)];
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = 0; j < np; ++j) {
          const float* vr = kv.data() + (j * H + h) * kvw + nope;
          const float p = scores[size_t(j)];
          for (int64_t d = 0; d < vd; ++d) acc[size_t(d)] += p * vr[d];
        }
        float* o = out + t * H * vd + h * vd;
        const float inv = 1.f / sum;
        for (int64_t d = 0; d < vd; ++d) o[d] = acc[size_t(d)] * inv;
      }
    });
  }
  (void)seq_of;
}

}  // namespace moeserve::cpu
