// The CPU MLA ops (Backend::mla_rope_write_kv / mla_attention) against a direct double-precision
// computation written here from HF's DeepseekV3Attention: latent RMSNorm, RoPE of the rope parts
// (NeoX and interleaved pairs, YaRN with an attention factor), keys / values decompressed with
// kv_b_proj, causal softmax; two sequences in one batch (a prefill and a decode over an earlier
// cache) through a non-identity block table; padding slots are not written.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"

namespace moeserve {
namespace {

using testing::f32_tensor;
using testing::i32_tensor;
using testing::randn;

struct Dims {
  int H = 3, nope = 8, rope = 6, v = 5, C = 10;
};

// Rotates x[0, rd) of one vector in double (HF: q*cos + rotate_half(q)*sin, or the interleaved form).
void rope_ref(std::vector<double>& x, size_t off, const RopeSpec& r, int pos) {
  const int rd = r.rotary_dim, half = rd / 2;
  const double m = r.scaling == RopeScaling::Yarn ? r.attention_factor : 1.0;
  std::vector<double> y(static_cast<size_t>(rd));
  for (int i = 0; i < half; ++i) {
    const double a = double(float(pos) * rope_inv_freq(r, i));
    const double c = std::cos(a) * m, s = std::sin(a) * m;
    const int p = r.style == RopeStyle::NeoX ? i : 2 * i, q = r.style == RopeStyle::NeoX ? i + half : 2 * i + 1;
    y[size_t(p)] = x[off + size_t(p)] * c - x[off + size_t(q)] * s;
    y[size_t(q)] = x[off + size_t(q)] * c + x[off + size_t(p)] * s;
  }
  for (int j = 0; j < rd; ++j) x[off + size_t(j)] = y[size_t(j)];
}

// fp8: an F8_E4M3 latent cache (--kv-cache-dtype fp8, k_scale 0.02); the reference then reads
// the latents the cache holds (dequantised), so the attention read path is checked exactly.
void check_mla(RopeStyle style, bool yarn, bool fp8 = false) {
  const Dims d;
  const int qk = d.nope + d.rope, L = d.C + d.rope, kvw = d.nope + d.v;
  std::mt19937 rng(11 + int(style) * 3 + int(yarn));
  // Sequence 0: prefill of 5 tokens at positions 0..4. Sequence 1: 4 earlier tokens then 1 decode
  // token at position 4 (its earlier latents written by a first call).
  const int bs = 2, nb = 8;
  auto be = make_cpu_backend();
  KVCacheLayer kv{be->alloc(fp8 ? DType::F8_E4M3 : DType::F32, {nb, bs, 1, L}), be->alloc(DType::F32, {nb, bs, 1, 0})};
  if (fp8) kv.k_scale = 0.02f;
  RopeSpec rope;
  rope.head_dim = rope.rotary_dim = d.rope;
  rope.theta = 1000.f;
  rope.style = style;
  if (yarn) {
    rope.scaling = RopeScaling::Yarn;
    rope.factor = 8.f;
    rope.original_max_position = 16;
    rope.attention_factor = 1.13f;
  }
  const auto norm_w = randn(rng, size_t(d.C), 0.3f);
  std::vector<float> nw(norm_w);
  for (auto& w : nw) w += 1.f;
  const Tensor norm_t = f32_tensor(nw, {d.C});
  const auto kvb = randn(rng, size_t(d.H * kvw * d.C), 0.4f);
  LinearWeight kv_b{f32_tensor(kvb, {d.H * kvw, d.C}), Tensor{}, 0, 0};
  const std::vector<int32_t> table0{5, 2, 7}, table1{1, 6, 3};
  auto slot = [&](const std::vector<int32_t>& tb, int p) { return tb[size_t(p / bs)] * bs + p % bs; };
  const float scale = 0.37f;

  // All tokens' raw q and latent (sequence 1's 5 tokens: the first 4 go in a first call).
  const int T0 = 5, T1 = 5;
  const auto q_all = randn(rng, size_t((T0 + T1) * d.H * qk)), lat_all = randn(rng, size_t((T0 + T1) * L));
  // Reference: per token, normalised + rotated latent and rotated q, in double.
  std::vector<double> qr(q_all.begin(), q_all.end()), lr(lat_all.begin(), lat_all.end());
  auto pos_of = [&](int i) { return i < T0 ? i : i - T0; };
  for (int i = 0; i < T0 + T1; ++i) {
    double ss = 0;
    for (int j = 0; j < d.C; ++j) ss += lr[size_t(i * L + j)] * lr[size_t(i * L + j)];
    const double inv = 1 / std::sqrt(ss / d.C + 1e-6);
    for (int j = 0; j < d.C; ++j) lr[size_t(i * L + j)] *= inv * nw[size_t(j)];
    rope_ref(lr, size_t(i * L + d.C), rope, pos_of(i));
    for (int h = 0; h < d.H; ++h) rope_ref(qr, size_t((i * d.H + h) * qk + d.nope), rope, pos_of(i));
  }
  auto ref_out = [&](int i, int seq_first, std::vector<double>& o) {  // token i attends seq_first..i
    o.assign(size_t(d.H * d.v), 0);
    for (int h = 0; h < d.H; ++h) {
      std::vector<double> sc;
      for (int j = seq_first; j <= i; ++j) {
        double s = 0;
        for (int a = 0; a < d.nope; ++a) {
          double k = 0;
          for (int c = 0; c < d.C; ++c) k += double(kvb[size_t((h * kvw + a) * d.C + c)]) * lr[size_t(j * L + c)];
          s += qr[size_t((i * d.H + h) * qk + a)] * k;
        }
        for (int a = 0; a < d.rope; ++a) s += qr[size_t((i * d.H + h) * qk + d.nope + a)] * lr[size_t(j * L + d.C + a)];
        sc.push_back(s * scale);
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double z = 0;
      for (auto& s : sc) z += (s = std::exp(s - mx));
      for (int j = seq_first; j <= i; ++j)
        for (int a = 0; a < d.v; ++a) {
          double vv = 0;
          for (int c = 0; c < d.C; ++c)
            vv += double(kvb[size_t((h * kvw + d.nope + a) * d.C + c)]) * lr[size_t(j * L + c)];
          o[size_t(h * d.v + a)] += sc[size_t(j - seq_first)] / z * vv;
        }
    }
  };

  auto run = [&](const std::vector<int>& toks, const std::vector<int>& seq_start, const std::vector<int>& ctx,
                 const std::vector<std::vector<int32_t>>& tables, bool attend, std::vector<int32_t> slots_override) {
    const int T = int(toks.size());
    std::vector<float> q, lat;
    std::vector<int32_t> pos, slots;
    for (int i : toks) {
      q.insert(q.end(), q_all.begin() + i * d.H * qk, q_all.begin() + (i + 1) * d.H * qk);
      lat.insert(lat.end(), lat_all.begin() + i * L, lat_all.begin() + (i + 1) * L);
      pos.push_back(pos_of(i));
      slots.push_back(slot(i < T0 ? table0 : table1, pos_of(i)));
    }
    if (!slots_override.empty()) slots = slots_override;
    Tensor qt = f32_tensor(q, {T, d.H * qk}), lt = f32_tensor(lat, {T, L}), pt = i32_tensor(pos, {T});
    Tensor out = be->alloc(DType::F32, {T, d.H * d.v});
    std::vector<int32_t> bt;
    for (auto& tb : tables) bt.insert(bt.end(), tb.begin(), tb.end());
    const int S = int(tables.size());
    std::vector<int32_t> qs(seq_start.begin(), seq_start.end());
    AttentionMeta m;
    m.num_seqs = S;
    m.num_tokens = T;
    m.block_size = bs;
    m.max_blocks_per_seq = 3;
    m.positions = pt;
    m.query_start = i32_tensor(qs, {S + 1});
    m.context_lens = i32_tensor(std::vector<int32_t>(ctx.begin(), ctx.end()), {S});
    m.block_tables = i32_tensor(bt, {S, 3});
    m.slot_mapping = i32_tensor(slots, {T});
    MlaArgs a;
    a.q = &qt;
    a.latent = &lt;
    a.latent_norm_weight = &norm_t;
    a.positions = &pt;
    a.rope = rope;
    a.kv = &kv;
    a.meta = &m;
    a.kv_b = &kv_b;
    a.num_heads = d.H;
    a.qk_nope_head_dim = d.nope;
    a.qk_rope_head_dim = d.rope;
    a.v_head_dim = d.v;
    a.kv_lora_rank = d.C;
    a.scale = scale;
    a.out = &out;
    if (attend) be->mla_rope_attention(a);
    else be->mla_rope_write_kv(a);
    return be->download_f32(out);
  };
  // First call: sequence 1's 4 earlier tokens, cache writes only; a padding token (slot -1) too.
  run({5, 6, 7, 8, 8}, {0, 5}, {5}, {table1}, false,
      {slot(table1, 0), slot(table1, 1), slot(table1, 2), slot(table1, 3), -1});
  // Second call: sequence 0's prefill and sequence 1's decode in one batch.
  const auto got = run({0, 1, 2, 3, 4, 9}, {0, 5, 6}, {5, 5}, {table0, table1}, true, {});
  if (fp8) {  // every token's latent as the cache holds it: e4m3(x / 0.02) * 0.02, |error| <= 2^-4 |x|
    const auto cache = be->download_f32(kv.k);
    for (int i = 0; i < T0 + T1; ++i)
      for (int c = 0; c < L; ++c) {
        const double held = double(cache[size_t(slot(i < T0 ? table0 : table1, pos_of(i)) * L + c)]) * 0.02;
        EXPECT_LE(std::fabs(held - lr[size_t(i * L + c)]), std::fabs(lr[size_t(i * L + c)]) / 16 + 1e-3) << i << " " << c;
        lr[size_t(i * L + c)] = held;
      }
  }
  double num = 0, den = 0;
  std::vector<double> o;
  for (int r = 0; r < 6; ++r) {
    const int i = r < 5 ? r : 9;
    ref_out(i, i < T0 ? 0 : T0, o);
    for (int c = 0; c < d.H * d.v; ++c) {
      num = std::max(num, std::fabs(double(got[size_t(r * d.H * d.v + c)]) - o[size_t(c)]));
      den = std::max(den, std::fabs(o[size_t(c)]));
    }
  }
  std::printf("[mla] style %d yarn %d: max|d|/max|ref| = %.3g\n", int(style), int(yarn), num / den);
  EXPECT_LE(num / den, 1e-5);
  if (fp8) return;
  // The cache holds the reference latents where the tokens went.
  const auto cache = be->download_f32(kv.k);
  for (int c = 0; c < L; ++c)
    EXPECT_NEAR(cache[size_t(slot(table1, 3) * L + c)], lr[size_t(8 * L + c)], 1e-5);
}

TEST(CpuMla, InterleavedRopeMatchesDirect) { check_mla(RopeStyle::GptJ, false); }
TEST(CpuMla, NeoxYarnMatchesDirect) { check_mla(RopeStyle::NeoX, true); }
TEST(CpuMla, Fp8LatentCacheMatchesDirect) { check_mla(RopeStyle::NeoX, false, /*fp8=*/true); }

TEST(CpuMla, RefusesBadShapes) {
  auto be = make_cpu_backend();
  Tensor q = be->alloc(DType::F32, {1, 3 * 14}), lat = be->alloc(DType::F32, {1, 16}), pos = be->alloc(DType::I32, {1});
  KVCacheLayer kv{be->alloc(DType::F32, {2, 2, 1, 15}), Tensor{}};  // wrong latent width
  AttentionMeta m;
  MlaArgs a;
  a.q = &q;
  a.latent = &lat;
  a.positions = &pos;
  a.kv = &kv;
  a.meta = &m;
  a.num_heads = 3;
  a.qk_nope_head_dim = 8;
  a.qk_rope_head_dim = 6;
  a.v_head_dim = 5;
  a.kv_lora_rank = 10;
  a.rope.head_dim = a.rope.rotary_dim = 6;
  try {
    be->mla_rope_write_kv(a);
    FAIL() << "a cache of 15 values per token must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_lora_rank + qk_rope_head_dim"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve
