// The CUDA MLA ops (k_mla.cu: latent norm / RoPE / cache write and the absorption GEMMs;
// k_mla_flash.cu: the flash attention over the latent cache, split-KV + combine) against the
// CPU reference ops (fp32, decompressed keys and values, checked against HF's formulas in
// tests/backend/test_cpu_mla.cpp) on the same bf16-exact inputs:
// - DeepSeek-V3's kv_lora_rank 512 and rope 64 with few heads: a prefill of one sequence and a
//   decode of another over an earlier cache in one batch, non-identity block tables, a padding
//   token; NeoX + YaRN and interleaved RoPE, bf16 and FP8 (128x128 block) kv_b, bf16 and e4m3
//   latent caches;
// - the real head dims (nope 128, rope 64, v 128, kv_lora 512) over random pre-filled caches of
//   16-token pages in shuffled order: decode at batch 1 / 8 / 64 and contexts 1 .. 4,100 (1 to
//   65 KV splits), 1 + 3 verify rows, prefill chunks longer than one pass (128 heads), bf16 and
//   e4m3 caches; a captured CUDA graph of the op equal to the eager op; and a shape off the
//   vector path (kv_lora 40, rope 6).
// Label gpu: skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/fp8_e4m3.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

struct MlaCase {
  RopeStyle style = RopeStyle::NeoX;
  bool yarn = false;
  bool fp8_kv_b = false;
  bool fp8_cache = false;
};

struct Dims {
  int H = 4, N = 32, R = 64, V = 48, C = 512;
};

void check_mla_vs_cpu(const MlaCase& mc) {
  SKIP_WITHOUT_GPU();
  const Dims d;
  const int qk = d.N + d.R, L = d.C + d.R, kvw = d.N + d.V;
  std::mt19937 rng(101 + int(mc.style) + 2 * int(mc.yarn) + 4 * int(mc.fp8_kv_b) + 8 * int(mc.fp8_cache));
  const int bs = 16, nb = 12;
  auto cpu = make_cpu_backend();
  const DType cdt_gpu = mc.fp8_cache ? DType::F8_E4M3 : DType::BF16;
  const DType cdt_cpu = mc.fp8_cache ? DType::F8_E4M3 : DType::F32;
  KVCacheLayer kv_c{cpu->alloc(cdt_cpu, {nb, bs, 1, L}), cpu->alloc(DType::F32, {nb, bs, 1, 0})};
  KVCacheLayer kv_g{gpu().alloc(cdt_gpu, {nb, bs, 1, L}), gpu().alloc(DType::BF16, {nb, bs, 1, 0})};
  if (mc.fp8_cache) kv_c.k_scale = kv_g.k_scale = 0.05f;
  RopeSpec rope;
  rope.head_dim = rope.rotary_dim = d.R;
  rope.theta = 10000.f;
  rope.style = mc.style;
  if (mc.yarn) {
    rope.scaling = RopeScaling::Yarn;
    rope.factor = 40.f;
    rope.original_max_position = 64;
    rope.attention_factor = 1.2f;
  }
  std::vector<float> nw = randn(size_t(d.C), rng, 0.2f);
  for (auto& w : nw) w = bf16_to_f32(f32_to_bf16(w + 1.f));
  const Tensor nw_c = host_f32(nw, {d.C}), nw_g = to_device(nw, DType::BF16, {d.C});
  HostWeight kvb = make_weight(d.H * kvw, d.C, mc.fp8_kv_b, rng);
  if (!mc.fp8_kv_b)  // bf16 kv_b of a useful magnitude (make_weight's bf16 weights are 1/64)
    for (auto& w : kvb.deq) w = bf16_to_f32(f32_to_bf16(w * 8.f));
  if (!mc.fp8_kv_b) kvb.dev.weight = to_device(kvb.deq, DType::BF16, {d.H * kvw, d.C});
  const LinearWeight kvb_c{host_f32(kvb.deq, {d.H * kvw, d.C}), Tensor{}, 0, 0};
  const std::vector<int32_t> table0{9, 2, 7}, table1{1, 10, 4};
  auto slot = [&](const std::vector<int32_t>& tb, int p) { return tb[size_t(p / bs)] * bs + p % bs; };
  const float scale = 1.f / std::sqrt(float(qk));

  // Sequence 0: a prefill of 7 tokens (positions 0..6). Sequence 1: 37 earlier tokens written by a
  // first call, then one decode token at position 37.
  const int T0 = 7, T1 = 38;
  const auto q_all = randn(size_t(T0 + T1) * d.H * qk, rng), lat_all = randn(size_t(T0 + T1) * L, rng);
  auto pos_of = [&](int i) { return i < T0 ? i : i - T0; };
  struct Out {
    std::vector<float> cpu, gpu;
  };
  auto run = [&](const std::vector<int>& toks, const std::vector<int>& qstart,
                 const std::vector<std::vector<int32_t>>& tables, bool attend, bool pad) {
    std::vector<float> q, lat;
    std::vector<int32_t> pos, slots;
    for (int i : toks) {
      q.insert(q.end(), q_all.begin() + i * d.H * qk, q_all.begin() + (i + 1) * d.H * qk);
      lat.insert(lat.end(), lat_all.begin() + i * L, lat_all.begin() + (i + 1) * L);
      pos.push_back(pos_of(i));
      slots.push_back(slot(i < T0 ? table0 : table1, pos_of(i)));
    }
    const int S = int(tables.size());
    std::vector<int32_t> bt, ctx;
    for (auto& tb : tables) bt.insert(bt.end(), tb.begin(), tb.end());
    for (int s = 0; s < S; ++s) ctx.push_back(pos[size_t(qstart[size_t(s + 1)] - 1)] + 1);
    Out o;
    for (int dev = 0; dev < 2; ++dev) {
      Backend& be = dev == 0 ? static_cast<Backend&>(*cpu) : static_cast<Backend&>(gpu());
      const bool g = dev == 1;
      // A padding token (slot -1) after the sequences' tokens, as a graph bucket has: on CUDA in
      // both calls; the CPU's attention takes only the sequences' tokens (its write skips it too).
      if (pad && (g || !attend)) {
        q.insert(q.end(), size_t(d.H * qk), 0.5f);
        lat.insert(lat.end(), size_t(L), 0.5f);
        pos.push_back(0);
        slots.push_back(-1);
      }
      const int T = int(pos.size());
      Tensor qt = g ? to_device(q, DType::BF16, {T, d.H * qk}) : host_f32(q, {T, d.H * qk});
      Tensor lt = g ? to_device(lat, DType::BF16, {T, L}) : host_f32(lat, {T, L});
      Tensor pt = g ? ints_to_device(pos, {T}) : host_i32(pos, {T});
      Tensor out = be.alloc(g ? DType::BF16 : DType::F32, {T, d.H * d.V});
      AttentionMeta m;
      m.num_seqs = S, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = 3;
      m.max_query_len = 0, m.max_context_len = 0;
      for (int s = 0; s < S; ++s) {
        m.max_query_len = std::max(m.max_query_len, qstart[size_t(s + 1)] - qstart[size_t(s)]);
        m.max_context_len = std::max(m.max_context_len, ctx[size_t(s)]);
      }
      const std::vector<int32_t> qs(qstart.begin(), qstart.end());
      m.positions = pt;
      m.query_start = g ? ints_to_device(qs, {S + 1}) : host_i32(qs, {S + 1});
      m.context_lens = g ? ints_to_device(ctx, {S}) : host_i32(ctx, {S});
      m.block_tables = g ? ints_to_device(bt, {S, 3}) : host_i32(bt, {S, 3});
      m.slot_mapping = g ? ints_to_device(slots, {T}) : host_i32(slots, {T});
      MlaArgs a;
      a.q = &qt, a.latent = &lt, a.latent_norm_weight = g ? &nw_g : &nw_c, a.positions = &pt, a.rope = rope;
      a.kv = g ? &kv_g : &kv_c, a.meta = &m, a.kv_b = g ? &kvb.dev : &kvb_c;
      a.num_heads = d.H, a.qk_nope_head_dim = d.N, a.qk_rope_head_dim = d.R, a.v_head_dim = d.V;
      a.kv_lora_rank = d.C, a.scale = scale, a.out = &out;
      if (attend) be.mla_rope_attention(a);
      else be.mla_rope_write_kv(a);
      auto v = be.download_f32(out);
      v.resize(size_t(int(toks.size()) * d.H * d.V));  // the padding row is not compared
      (g ? o.gpu : o.cpu) = v;
      if (pad && (g || !attend)) {
        q.resize(q.size() - size_t(d.H * qk)), lat.resize(lat.size() - size_t(L));
        pos.pop_back(), slots.pop_back();
      }
    }
    return o;
  };
  std::vector<int> first;
  for (int i = T0; i < T0 + T1 - 1; ++i) first.push_back(i);
  run(first, {0, int(first.size())}, {table1}, /*attend=*/false, /*pad=*/true);
  std::vector<int> second{0, 1, 2, 3, 4, 5, 6, T0 + T1 - 1};
  const Out o = run(second, {0, T0, T0 + 1}, {table0, table1}, /*attend=*/true, /*pad=*/true);
  const double err = rel_err(o.gpu, o.cpu);
  std::printf("[mla cuda] style %d yarn %d fp8 kv_b %d fp8 cache %d: rel L2 err vs CPU %.3g\n", int(mc.style),
              int(mc.yarn), int(mc.fp8_kv_b), int(mc.fp8_cache), err);
  // bf16 q / latent / out and a bf16 (or e4m3) cache against the fp32 reference.
  EXPECT_LT(err, mc.fp8_cache ? 6e-2 : 2e-2);
  // The cache rows written (both calls): CUDA's bf16 / e4m3 latents vs the CPU's.
  const auto cc = cpu->download_f32(kv_c.k), cg = gpu().download_f32(kv_g.k);
  std::vector<float> rc, rg;
  for (int i = 0; i < T0 + T1; ++i) {
    const int64_t r = int64_t(slot(i < T0 ? table0 : table1, pos_of(i))) * L;
    rc.insert(rc.end(), cc.begin() + r, cc.begin() + r + L);
    rg.insert(rg.end(), cg.begin() + r, cg.begin() + r + L);
  }
  EXPECT_LT(rel_err(rg, rc), mc.fp8_cache ? 2e-2 : 8e-3);
}

TEST(CudaMla, NeoxYarnBf16MatchesCpu) { check_mla_vs_cpu({RopeStyle::NeoX, true, false, false}); }
TEST(CudaMla, InterleavedFp8KvbMatchesCpu) { check_mla_vs_cpu({RopeStyle::GptJ, false, true, false}); }
TEST(CudaMla, Fp8LatentCacheMatchesCpu) { check_mla_vs_cpu({RopeStyle::GptJ, true, true, true}); }

// ---- the real head dims over pre-filled caches ----

struct SeqSpec {
  int cached;  // positions 0 .. cached - 1 already in the cache (random latents)
  int nq;      // this step's tokens, at positions cached .. cached + nq - 1
};
struct BigCase {
  int H = 16, N = 128, R = 64, V = 128, C = 512;
  bool fp8_cache = false, fp8_kv_b = false;
  bool graph = false;  // also capture the attention op in a CUDA graph: its replay must equal the eager op
  std::vector<SeqSpec> seqs;
  uint32_t seed = 1;
};

// One mla_rope_attention step of cs.seqs on both backends; returns the rel L2 error of out.
// cpu_ref false (the timing cases): CUDA only; returns 0 when every output is finite and some
// are non-zero, else infinity.
double run_big(const BigCase& cs, double* gpu_ms = nullptr, bool cpu_ref = true) {
  const int H = cs.H, N = cs.N, R = cs.R, V = cs.V, C = cs.C, qk = N + R, L = C + R, kvw = N + V, bs = 16;
  std::mt19937 rng(cs.seed);
  const int S = int(cs.seqs.size());
  int max_blocks = 0, total_blocks = 0, T = 0, max_q = 0, max_ctx = 0;
  for (const auto& q : cs.seqs) {
    const int nb = (q.cached + q.nq + bs - 1) / bs;
    max_blocks = std::max(max_blocks, nb), total_blocks += nb, T += q.nq;
    max_q = std::max(max_q, q.nq), max_ctx = std::max(max_ctx, q.cached + q.nq);
  }
  const int NB = total_blocks + 3;
  std::vector<int32_t> ids(static_cast<size_t>(NB));
  for (int i = 0; i < NB; ++i) ids[size_t(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> bt(size_t(S) * max_blocks, 0), qs{0}, ctx, pos, slots;
  int next = 0;
  for (int s = 0; s < S; ++s) {
    const int nb = (cs.seqs[size_t(s)].cached + cs.seqs[size_t(s)].nq + bs - 1) / bs;
    for (int b = 0; b < nb; ++b) bt[size_t(s) * max_blocks + b] = ids[size_t(next++)];
    qs.push_back(qs.back() + cs.seqs[size_t(s)].nq);
    ctx.push_back(cs.seqs[size_t(s)].cached + cs.seqs[size_t(s)].nq);
    for (int i = 0; i < cs.seqs[size_t(s)].nq; ++i) {
      const int ps = cs.seqs[size_t(s)].cached + i;
      pos.push_back(ps);
      slots.push_back(bt[size_t(s) * max_blocks + ps / bs] * bs + ps % bs);
    }
  }
  // The cache contents: random latents (normal, like kv_a_layernorm's output) in every slot.
  const size_t cache_elems = size_t(NB) * bs * L;
  Tensor cpu_cache, gpu_cache;
  if (!cpu_ref) {  // timing only: random bf16 on the device (no host reference needs them)
    gpu_cache = gpu().alloc(DType::BF16, {NB, bs, 1, L});
    gpu().fill_random(gpu_cache, cs.seed, 1.f);
    cpu_cache = Tensor::host(DType::F32, {1, bs, 1, L});
  } else if (cs.fp8_cache) {
    Tensor h = Tensor::host(DType::F8_E4M3, {NB, bs, 1, L});
    std::normal_distribution<float> d(0.f, 1.f);
    for (size_t i = 0; i < cache_elems; ++i) h.ptr<uint8_t>()[i] = fp8::kv_store(d(rng), 0.05f);
    gpu_cache = gpu().upload(h);
    cpu_cache = h;
  } else {
    const auto v = randn(cache_elems, rng);
    cpu_cache = host_f32(v, {NB, bs, 1, L});
    gpu_cache = to_device(v, DType::BF16, {NB, bs, 1, L});
  }
  auto cpu = make_cpu_backend();
  KVCacheLayer kv_c{cpu_cache, cpu->alloc(DType::F32, {NB, bs, 1, 0})};
  KVCacheLayer kv_g{gpu_cache, gpu().alloc(DType::BF16, {NB, bs, 1, 0})};
  if (cs.fp8_cache) kv_c.k_scale = kv_g.k_scale = 0.05f;
  RopeSpec rope;
  rope.head_dim = rope.rotary_dim = R;
  rope.theta = 10000.f;
  rope.scaling = RopeScaling::Yarn, rope.factor = 40.f, rope.original_max_position = 4096;
  rope.attention_factor = 1.1f;
  std::vector<float> nw = randn(size_t(C), rng, 0.2f);
  for (auto& w : nw) w = bf16_to_f32(f32_to_bf16(w + 1.f));
  const Tensor nw_c = host_f32(nw, {C}), nw_g = to_device(nw, DType::BF16, {C});
  HostWeight kvb = make_weight(H * kvw, C, cs.fp8_kv_b, rng);
  if (!cs.fp8_kv_b) {
    for (auto& w : kvb.deq) w = bf16_to_f32(f32_to_bf16(w * 8.f));
    kvb.dev.weight = to_device(kvb.deq, DType::BF16, {H * kvw, C});
  }
  const LinearWeight kvb_c{host_f32(kvb.deq, {H * kvw, C}), Tensor{}, 0, 0};
  const auto q = randn(size_t(T) * H * qk, rng), lat = randn(size_t(T) * L, rng);
  std::vector<float> outs[2];
  for (int dev = cpu_ref ? 0 : 1; dev < 2; ++dev) {
    const bool g = dev == 1;
    Backend& be = g ? static_cast<Backend&>(gpu()) : static_cast<Backend&>(*cpu);
    // CUDA gets a padding token after the sequences' tokens (a graph bucket's row).
    std::vector<float> qv = q, lv = lat;
    std::vector<int32_t> pv = pos, sv = slots;
    if (g) {
      qv.insert(qv.end(), size_t(H * qk), 0.5f), lv.insert(lv.end(), size_t(L), 0.5f);
      pv.push_back(0), sv.push_back(-1);
    }
    const int Tn = int(pv.size());
    Tensor qt = g ? to_device(qv, DType::BF16, {Tn, H * qk}) : host_f32(qv, {Tn, H * qk});
    Tensor lt = g ? to_device(lv, DType::BF16, {Tn, L}) : host_f32(lv, {Tn, L});
    Tensor pt = g ? ints_to_device(pv, {Tn}) : host_i32(pv, {Tn});
    Tensor out = be.alloc(g ? DType::BF16 : DType::F32, {Tn, H * V});
    AttentionMeta m;
    m.num_seqs = S, m.num_tokens = Tn, m.block_size = bs, m.max_blocks_per_seq = max_blocks;
    m.max_query_len = max_q, m.max_context_len = max_ctx;
    m.positions = pt;
    m.query_start = g ? ints_to_device(qs, {S + 1}) : host_i32(qs, {S + 1});
    m.context_lens = g ? ints_to_device(ctx, {S}) : host_i32(ctx, {S});
    m.block_tables = g ? ints_to_device(bt, {S, max_blocks}) : host_i32(bt, {S, max_blocks});
    m.slot_mapping = g ? ints_to_device(sv, {Tn}) : host_i32(sv, {Tn});
    MlaArgs a;
    a.q = &qt, a.latent = &lt, a.latent_norm_weight = g ? &nw_g : &nw_c, a.positions = &pt, a.rope = rope;
    a.kv = g ? &kv_g : &kv_c, a.meta = &m, a.kv_b = g ? &kvb.dev : &kvb_c;
    a.num_heads = H, a.qk_nope_head_dim = N, a.qk_rope_head_dim = R, a.v_head_dim = V, a.kv_lora_rank = C;
    a.scale = 0.9f / std::sqrt(float(qk)), a.out = &out;
    be.mla_rope_attention(a);
    outs[dev] = be.download_f32(out);
    if (g) {
      // The padding row is zero (its o_proj input must not be garbage).
      for (int i = 0; i < H * V; ++i) EXPECT_EQ(outs[dev][size_t(T) * H * V + i], 0.f) << "padding row, col " << i;
      outs[dev].resize(size_t(T) * H * V);
      if (cs.graph) {  // no allocation, no host sync inside: capturable; zero out, replay, compare
        gpu().begin_capture();
        gpu().mla_attention(a);
        CudaGraph graph = gpu().end_capture();
        gpu().fill_random(out, 3, 1.f);
        graph.replay(gpu().stream());
        gpu().synchronize();
        auto replayed = gpu().download_f32(out);
        replayed.resize(size_t(T) * H * V);
        size_t diff = 0;
        for (size_t i = 0; i < replayed.size(); ++i) diff += replayed[i] != outs[dev][i];
        EXPECT_EQ(diff, 0u) << "graph replay differs from the eager op";
      }
      if (gpu_ms) {  // the attention op alone (the cache writes repeat the same values)
        *gpu_ms = event_median_ms([&] { gpu().mla_attention(a); }, 5);
      }
    }
  }
  if (!cpu_ref) {
    bool nonzero = false;
    for (float v : outs[1]) {
      if (!std::isfinite(v)) return INFINITY;
      nonzero |= v != 0.f;
    }
    return nonzero ? 0.0 : INFINITY;
  }
  return rel_err(outs[1], outs[0]);
}

void expect_big(const char* what, BigCase cs) {
  SKIP_WITHOUT_GPU();
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    cs.fp8_cache = fp8 == 1;
    const double err = run_big(cs);
    std::printf("[mla cuda] %s, %s cache: rel L2 err vs CPU %.3g\n", what, fp8 ? "e4m3" : "bf16", err);
    EXPECT_LT(err, fp8 ? 3e-2 : 1.5e-2) << what << (fp8 ? " e4m3" : " bf16");
    cs.seed += 7;
  }
}

TEST(CudaMla, DecodeBatch1AcrossContextsAndSplits) {
  // Context 1 (one key), a page boundary (16 + 1), short split counts and 4,100 (128 splits).
  for (int c : {0, 16, 200, 1000, 4099}) {
    BigCase cs;
    cs.seqs = {{c, 1}};
    cs.seed = 11 + uint32_t(c);
    expect_big(("decode batch 1 context " + std::to_string(c + 1)).c_str(), cs);
  }
}

TEST(CudaMla, DecodeBatch8And64MixedContexts) {
  BigCase b8;
  b8.H = 64, b8.fp8_kv_b = true, b8.graph = true;  // Kimi-K2.5's 64 heads: one row tile per token; in a graph
  for (int i = 0; i < 8; ++i) b8.seqs.push_back({(i * 211) % 600 + i, 1});
  expect_big("decode batch 8 (64 heads, FP8 kv_b)", b8);
  BigCase b64;
  for (int i = 0; i < 64; ++i) b64.seqs.push_back({i == 5 ? 4099 : (i * 37) % 300, 1});
  expect_big("decode batch 64 (16 heads)", b64);
}

TEST(CudaMla, VerifyRowsOnePlusThree) {
  BigCase cs;
  for (int i = 0; i < 6; ++i) cs.seqs.push_back({100 + 311 * i, 4});
  expect_big("verify 6 x (1 + 3) rows", cs);
}

TEST(CudaMla, PrefillChunksAndMixedBatch) {
  SKIP_WITHOUT_GPU();  // before gpu(), which throws without a device
  // 128 heads (DeepSeek-V3 on one GPU: two row tiles per token) with passes of 120 tokens: the
  // 300-token prefill spans three passes; a chunked prefill over 500 cached tokens and a decode.
  BigCase cs;
  cs.H = 128;
  cs.seqs = {{0, 300}, {500, 40}, {77, 1}};
  const size_t keep = gpu().tuning.mla_chunk_bytes;
  gpu().tuning.mla_chunk_bytes = size_t(120) * 128 * (576 + 512) * 2;
  expect_big("prefill 300 + chunk 40 over 500 + decode (128 heads, 120-token passes)", cs);
  gpu().tuning.mla_chunk_bytes = keep;
}

TEST(CudaMla, OddLatentDimsTakeTheElementPath) {
  BigCase cs;
  cs.H = 4, cs.N = 16, cs.R = 6, cs.V = 24, cs.C = 40;
  cs.seqs = {{0, 9}, {45, 1}};
  expect_big("kv_lora 40, rope 6", cs);
}

// Timing of the attention op (absorb + flash + combine + V projection) at Kimi-K2.5's shapes
// (64 heads, bf16 cache, FP8 kv_b): the latent and kv_b bytes per step over the time, against
// the H200's ~4.8 TB/s (printed). CUDA only (the CPU reference would take minutes at these
// sizes): the check is finite, non-zero output; accuracy is the cases above.
TEST(CudaMla, DecodeTimingKimiShapes) {
  SKIP_WITHOUT_GPU();
  for (int B : {1, 8, 64})
    for (int ctx : {1024, 8192}) {
      BigCase cs;
      cs.H = 64, cs.fp8_kv_b = true;
      for (int i = 0; i < B; ++i) cs.seqs.push_back({ctx - 1, 1});
      double ms = 0;
      const double err = run_big(cs, &ms, /*cpu_ref=*/false);
      const double bytes = double(B) * ctx * 576 * 2 + 64.0 * 256 * 512;
      std::printf("[mla cuda timing] batch %d context %d: %.3f ms per layer (%.0f GB/s of latents + kv_b), err %.3g\n",
                  B, ctx, ms, bytes / (ms * 1e-3) / 1e9, err);
      EXPECT_EQ(err, 0.0) << "batch " << B << " context " << ctx;
    }
}

TEST(CudaMla, RefusesBadShapesClearly) {
  SKIP_WITHOUT_GPU();
  MlaArgs a;
  try {
    gpu().mla_attention(a);
    ADD_FAILURE() << "an empty MlaArgs must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mla_attention"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve::test
