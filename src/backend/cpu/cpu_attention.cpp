// CPU attention ops: QK-norm (none / per head / full width) + RoPE (NeoX or GPT-J, partial,
// linear or YaRN scaling), paged KV writes, and causal GQA attention over the paged cache.
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

// One of q/k: RMSNorm over the whole row (all heads) or over each head, then RoPE on each
// head in place.
struct NormRopeSide {
  const char* name;
  float* x;              // [T, width]
  int64_t width;         // local heads * head_dim
  const float* weight;   // [width] (full width), [head_dim] (per head) or null (none)
  const float* ss;       // [T] pre-reduced sums of squares, or null
  int64_t full_width;    // divisor of the sum of squares
};

// cos/sin of pos * inv_freq[i] as HF computes them in float32: inv_freq = 1 / theta^(2i/rd)
// in fp32, the angle as an fp32 product, cos/sin of that fp32 angle.
void rope_table(int32_t pos, const std::vector<float>& inv_freq, float* cos_out, float* sin_out) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float angle = float(pos) * inv_freq[i];
    cos_out[i] = float(std::cos(double(angle)));
    sin_out[i] = float(std::sin(double(angle)));
  }
}

void norm_rope_token(const NormRopeSide& s, int64_t t, const RopeSpec& rope, QkNormMode mode, float eps,
                     const float* cs, const float* sn, float* tmp) {
  float* x = s.x + t * s.width;
  const int64_t D = rope.head_dim;
  if (mode == QkNormMode::FullWidth) {
    double ss;
    if (s.ss) {
      ss = double(s.ss[t]);
    } else {
      ss = 0;
      for (int64_t j = 0; j < s.width; ++j) ss += double(x[j]) * double(x[j]);
    }
    const float inv = 1.f / std::sqrt(float(ss / double(s.full_width)) + eps);
    for (int64_t j = 0; j < s.width; ++j) x[j] = s.weight[j] * (x[j] * inv);
  } else if (mode == QkNormMode::PerHead) {
    for (int64_t h0 = 0; h0 < s.width; h0 += D) {
      double ss = 0;
      for (int64_t j = 0; j < D; ++j) ss += double(x[h0 + j]) * double(x[h0 + j]);
      const float inv = 1.f / std::sqrt(float(ss / double(D)) + eps);
      for (int64_t j = 0; j < D; ++j) x[h0 + j] = s.weight[j] * (x[h0 + j] * inv);
    }
  }
  const int rd = rope.rotary_dim;
  for (int64_t h0 = 0; h0 < s.width; h0 += D) {
    float* hx = x + h0;
    if (rope.style == RopeStyle::NeoX) {
      const int64_t half = rd / 2;
      for (int64_t i = 0; i < half; ++i) {
        const float a = hx[i], b = hx[i + half];
        hx[i] = a * cs[i] - b * sn[i];
        hx[i + half] = b * cs[i] + a * sn[i];
      }
    } else {
      for (int j = 0; j < rd; ++j) {
        int partner, f;
        float sign;
        rope_pair(rope.style, rd, j, &partner, &sign, &f);
        tmp[j] = hx[j] * cs[f] + sign * hx[partner] * sn[f];
      }
      std::memcpy(hx, tmp, size_t(rd) * sizeof(float));
    }
  }
}

NormRopeSide make_side(const char* name, Tensor* x, const Tensor* w, const Tensor* ss, int64_t full_width,
                       int64_t T, int64_t head_dim, QkNormMode mode, std::vector<float>& w_f32) {
  MS_CHECK(x != nullptr && (w != nullptr || mode == QkNormMode::None), "qk_norm_rope: {} or its norm weight is null",
           name);
  check_f32(*x, "qk_norm_rope", name);
  NormRopeSide s{name, x->ptr<float>(), cols_of(*x), nullptr, nullptr, 0};
  MS_CHECK(rows_of(*x) == T, "qk_norm_rope: {} {} has {} rows, positions has {}", name, shape_str(x->shape),
           rows_of(*x), T);
  MS_CHECK(s.width % head_dim == 0, "qk_norm_rope: {} width {} is not a multiple of head_dim {}", name,
           s.width, head_dim);
  if (mode == QkNormMode::None) return s;
  check_float_weight(*w, "qk_norm_rope", "norm weight", /*allow_fp8=*/false);
  const int64_t want = mode == QkNormMode::PerHead ? head_dim : s.width;
  MS_CHECK(w->numel() == want, "qk_norm_rope: {} norm weight {} must have {} elements", name,
           shape_str(w->shape), want);
  w_f32 = to_f32_vector(*w);
  s.weight = w_f32.data();
  MS_CHECK(full_width >= 0, "qk_norm_rope: negative full width for {}", name);
  s.full_width = full_width > 0 ? full_width : s.width;
  if (ss) {
    check_f32(*ss, "qk_norm_rope", "sum of squares");
    MS_CHECK(ss->numel() == T, "qk_norm_rope: {} sum of squares {} must have {} elements", name,
             shape_str(ss->shape), T);
    MS_CHECK(s.full_width >= s.width, "qk_norm_rope: {} full width {} is below the local width {}", name,
             s.full_width, s.width);
    s.ss = ss->ptr<float>();
  } else {
    // Computed from the local rows: the mean is over the local width.
    s.full_width = s.width;
  }
  return s;
}

}  // namespace

void qk_norm_rope(const QkNormRopeArgs& a) {
  MS_CHECK(a.positions != nullptr, "qk_norm_rope: positions is null");
  check_i32(*a.positions, "qk_norm_rope", "positions");
  const RopeSpec& rope = a.rope;
  MS_CHECK(rope.head_dim > 0 && rope.rotary_dim >= 0 && rope.rotary_dim <= rope.head_dim &&
               rope.rotary_dim % 2 == 0,
           "qk_norm_rope: bad rope params head_dim={} rotary_dim={}", rope.head_dim, rope.rotary_dim);
  MS_CHECK(rope.theta > 0.f, "qk_norm_rope: rope theta must be positive, got {}", rope.theta);
  MS_CHECK(rope.scaling != RopeScaling::Yarn || rope.original_max_position > 0,
           "qk_norm_rope: YaRN needs original_max_position");
  MS_CHECK(rope.scaling == RopeScaling::None || rope.factor > 0.f, "qk_norm_rope: rope factor {} must be positive",
           rope.factor);
  const int64_t T = a.positions->numel();
  std::vector<float> wq, wk;
  const NormRopeSide q =
      make_side("q", a.q, a.q_norm_weight, a.q_sum_squares, a.q_full_width, T, rope.head_dim, a.norm, wq);
  const NormRopeSide k =
      make_side("k", a.k, a.k_norm_weight, a.k_sum_squares, a.k_full_width, T, rope.head_dim, a.norm, wk);
  const int32_t* pos = a.positions->ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    MS_CHECK(pos[t] >= 0, "qk_norm_rope: negative position {} at token {}", pos[t], t);

  const int64_t half = rope.rotary_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = rope_inv_freq(rope, int(i));
  const float mscale = rope.scaling == RopeScaling::Yarn ? rope.attention_factor : 1.f;
  ThreadPool::global().parallel_for(T, [&](int64_t b, int64_t e) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half)), tmp(size_t(rope.rotary_dim));
    for (int64_t t = b; t < e; ++t) {
      rope_table(pos[t], inv_freq, cs.data(), sn.data());
      if (mscale != 1.f)
        for (int64_t i = 0; i < half; ++i) cs[size_t(i)] *= mscale, sn[size_t(i)] *= mscale;
      norm_rope_token(q, t, rope, a.norm, a.eps, cs.data(), sn.data(), tmp.data());
      norm_rope_token(k, t, rope, a.norm, a.eps, cs.data(), sn.data(), tmp.data());
    }
  }, 4);
}

namespace {
// [num_blocks, block_size, Hkv, head_dim] F32 or F8_E4M3 (--kv-cache-dtype fp8) cache checks;
// returns num_blocks * block_size.
int64_t check_cache(const Tensor& c, const char* name, int64_t hkv_x_hd, const char* op) {
  check_host(c, op, name);
  MS_CHECK(c.dtype == DType::F32 || c.dtype == DType::F8_E4M3,
           "{}: KV cache {} must be F32 or F8_E4M3 on the CPU backend, got {}", op, name, dtype_name(c.dtype));
  MS_CHECK(c.rank() == 4, "{}: KV cache {} must be [blocks, block_size, kv_heads, head_dim], got {}", op,
           name, shape_str(c.shape));
  MS_CHECK(c.dim(2) * c.dim(3) == hkv_x_hd, "{}: KV cache {} {} does not hold rows of {} values", op, name,
           shape_str(c.shape), hkv_x_hd);
  return c.dim(0) * c.dim(1);
}
}  // namespace

void write_kv(const Tensor& k, const Tensor& v, KVCacheLayer& kv, const AttentionMeta& meta) {
  check_f32(k, "write_kv", "k");
  check_f32(v, "write_kv", "v");
  MS_CHECK(rows_of(k) == rows_of(v), "write_kv: k {} and v {} differ in rows", shape_str(k.shape), shape_str(v.shape));
  const int64_t T = rows_of(k), W = cols_of(k), WV = cols_of(v);
  const int64_t slots = check_cache(kv.k, "k", W, "write_kv");
  MS_CHECK(check_cache(kv.v, "v", WV, "write_kv") == slots && kv.k.dim(2) == kv.v.dim(2),
           "write_kv: K cache {} and V cache {} differ", shape_str(kv.k.shape), shape_str(kv.v.shape));
  MS_CHECK(meta.block_size == 0 || meta.block_size == kv.k.dim(1),
           "write_kv: meta.block_size {} but the cache has blocks of {}", meta.block_size, kv.k.dim(1));
  check_i32(meta.slot_mapping, "write_kv", "slot_mapping");
  MS_CHECK(meta.slot_mapping.numel() == T, "write_kv: slot_mapping has {} entries for {} tokens",
           meta.slot_mapping.numel(), T);
  MS_CHECK(kv.k.dtype == kv.v.dtype, "write_kv: K cache {} and V cache {} dtypes differ", dtype_name(kv.k.dtype),
           dtype_name(kv.v.dtype));
  const int32_t* slot = meta.slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (slot[t] < 0) continue;  // padding token: nothing to store
    MS_CHECK(slot[t] < slots, "write_kv: slot {} of token {} is outside the cache ({} slots)", slot[t], t, slots);
    const float* kr = k.ptr<float>() + t * W;
    const float* vr = v.ptr<float>() + t * WV;
    if (kv.fp8()) {  // e4m3(x / scale), the bytes the CUDA write kernels store (core/fp8_e4m3.h)
      uint8_t* kc = kv.k.ptr<uint8_t>() + int64_t(slot[t]) * W;
      uint8_t* vc = kv.v.ptr<uint8_t>() + int64_t(slot[t]) * WV;
      for (int64_t c = 0; c < W; ++c) kc[c] = fp8::kv_store(kr[c], kv.k_scale);
      for (int64_t c = 0; c < WV; ++c) vc[c] = fp8::kv_store(vr[c], kv.v_scale);
      continue;
    }
    std::memcpy(kv.k.ptr<float>() + int64_t(slot[t]) * W, kr, size_t(W) * 4);
    std::memcpy(kv.v.ptr<float>() + int64_t(slot[t]) * WV, vr, size_t(WV) * 4);
  }
}

std::vector<int32_t> check_attention_meta(const AttentionMeta& m, int64_t T, int64_t nblocks, int64_t bs,
                                          const char* op) {
  const int64_t S = m.num_seqs;
  check_i32(m.positions, op, "positions");
  check_i32(m.query_start, op, "query_start");
  check_i32(m.context_lens, op, "context_lens");
  MS_CHECK(m.positions.numel() == T, "{}: {} positions for {} tokens", op, m.positions.numel(), T);
  MS_CHECK(S >= 0 && m.query_start.numel() == S + 1 && m.context_lens.numel() == S,
           "{}: query_start ({}) / context_lens ({}) do not match {} sequences", op, m.query_start.numel(),
           m.context_lens.numel(), S);
  const int32_t* qs = m.query_start.ptr<int32_t>();
  const int32_t* ctx = m.context_lens.ptr<int32_t>();
  const int32_t* pos = m.positions.ptr<int32_t>();
  const int64_t mb = m.max_blocks_per_seq;
  const int32_t* bt = nullptr;
  if (S > 0) {
    check_i32(m.block_tables, op, "block_tables");
    MS_CHECK(mb > 0 && m.block_tables.numel() == S * mb, "{}: block_tables {} is not [{}, {}]", op,
             shape_str(m.block_tables.shape), S, mb);
    bt = m.block_tables.ptr<int32_t>();
  }
  MS_CHECK(S == 0 ? T == 0 : (qs[0] == 0 && qs[S] == T), "{}: query_start must run from 0 to {}", op, T);
  std::vector<int32_t> seq_of(static_cast<size_t>(T));
  for (int64_t s = 0; s < S; ++s) {
    MS_CHECK(qs[s] <= qs[s + 1], "{}: query_start decreases at sequence {}", op, s);
    MS_CHECK(ctx[s] >= 0 && ctx[s] <= mb * bs, "{}: context length {} of sequence {} exceeds {} blocks of {}", op,
             ctx[s], s, mb, bs);
    for (int64_t b = 0; b < (ctx[s] + bs - 1) / bs; ++b)
      MS_CHECK(bt[s * mb + b] >= 0 && bt[s * mb + b] < nblocks,
               "{}: block {} of sequence {} is {}, outside the cache ({} blocks)", op, b, s, bt[s * mb + b],
               nblocks);
    for (int64_t t = qs[s]; t < qs[s + 1]; ++t) {
      MS_CHECK(pos[t] >= 0 && pos[t] < ctx[s],
               "{}: token {} of sequence {} at position {} is outside its context of {}", op, t, s, pos[t], ctx[s]);
      seq_of[size_t(t)] = int32_t(s);
    }
  }
  return seq_of;
}

void attention(const AttentionArgs& a) {
  MS_CHECK(a.q && a.kv && a.meta && a.out, "attention: null argument");
  const AttentionMeta& m = *a.meta;
  check_f32(*a.q, "attention", "q");
  check_f32(*a.out, "attention", "out");
  MS_CHECK(a.num_q_heads > 0 && a.num_kv_heads > 0 && a.head_dim > 0 && a.num_q_heads % a.num_kv_heads == 0,
           "attention: bad head counts q={} kv={} head_dim={}", a.num_q_heads, a.num_kv_heads, a.head_dim);
  const int64_t hd = a.head_dim, Hq = a.num_q_heads, Hkv = a.num_kv_heads;
  const int64_t vd = a.v_head_dim > 0 ? a.v_head_dim : hd;
  const int64_t T = rows_of(*a.q);
  MS_CHECK(cols_of(*a.q) == Hq * hd, "attention: q {} must have {} columns", shape_str(a.q->shape), Hq * hd);
  MS_CHECK(rows_of(*a.out) == T && cols_of(*a.out) == Hq * vd, "attention: out {} must be [{}, {}]",
           shape_str(a.out->shape), T, Hq * vd);
  check_cache(a.kv->k, "k", Hkv * hd, "attention");
  check_cache(a.kv->v, "v", Hkv * vd, "attention");
  MS_CHECK(a.kv->k.dim(0) == a.kv->v.dim(0) && a.kv->k.dim(1) == a.kv->v.dim(1) && a.kv->k.dim(2) == Hkv &&
               a.kv->v.dim(2) == Hkv,
           "attention: K cache {} / V cache {} do not match {} kv heads", shape_str(a.kv->k.shape),
           shape_str(a.kv->v.shape), Hkv);
  const int64_t nblocks = a.kv->k.dim(0), bs = a.kv->k.dim(1);
  MS_CHECK(m.block_size == 0 || m.block_size == bs, "attention: meta.block_size {} but the cache has blocks of {}",
           m.block_size, bs);

  const std::vector<int32_t> seq_of = check_attention_meta(m, T, nblocks, bs, "attention");
  const int32_t* pos = m.positions.ptr<int32_t>();
  const int64_t mb = m.max_blocks_per_seq;
  const int32_t* bt = m.num_seqs > 0 ? m.block_tables.ptr<int32_t>() : nullptr;

  MS_CHECK(a.kv->k.dtype == a.kv->v.dtype, "attention: K cache {} and V cache {} dtypes differ",
           dtype_name(a.kv->k.dtype), dtype_name(a.kv->v.dtype));
  const bool fp8 = a.kv->fp8();
  const float ks = a.kv->k_scale, vs = a.kv->v_scale;
  const int64_t group = Hq / Hkv;
  const float scale = a.scale;
  // One task per (token, query head): scores over positions 0..p, fp32 softmax with the
  // max subtracted, then the probability-weighted sum of V.
  ThreadPool::global().parallel_for(T * Hq, [&](int64_t b, int64_t e) {
    std::vector<float> scores, qv(static_cast<size_t>(hd)), acc(static_cast<size_t>(vd));
    std::vector<float> deq(static_cast<size_t>(std::max(hd, vd)));
    // Row r of a cache as f32: the f32 cache itself, or e4m3 * scale into `deq` (FP8 cache).
    auto row = [&](const Tensor& c, int64_t r, int64_t w, float sc) -> const float* {
      if (!fp8) return c.ptr<float>() + r * w;
      const uint8_t* b = c.ptr<uint8_t>() + r * w;
      for (int64_t d = 0; d < w; ++d) deq[size_t(d)] = fp8::kv_load(b[d], sc);
      return deq.data();
    };
    for (int64_t item = b; item < e; ++item) {
      const int64_t t = item / Hq, h = item % Hq, kvh = h / group;
      const int64_t s = seq_of[size_t(t)];
      const int64_t n = int64_t(pos[t]) + 1;
      const int32_t* table = bt + s * mb;
      std::memcpy(qv.data(), a.q->ptr<float>() + t * Hq * hd + h * hd, size_t(hd) * 4);  // out may alias q
      scores.resize(size_t(n));
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = int64_t(table[j / bs]) * bs + j % bs;
        scores[size_t(j)] = dot_f32(qv.data(), row(a.kv->k, slot * Hkv + kvh, hd, ks), hd) * scale;
        mx = std::max(mx, scores[size_t(j)]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) {
        scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
        sum += scores[size_t(j)];
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = int64_t(table[j / bs]) * bs + j % bs;
        const float* vr = row(a.kv->v, slot * Hkv + kvh, vd, vs);
        const float p = scores[size_t(j)];
        for (int64_t d = 0; d < vd; ++d) acc[size_t(d)] += p * vr[d];
      }
      float* o = a.out->ptr<float>() + t * Hq * vd + h * vd;
      const float inv = 1.f / sum;
      for (int64_t d = 0; d < vd; ++d) o[d] = acc[size_t(d)] * inv;
    }
  });
}

}  // namespace moeserve::cpu
