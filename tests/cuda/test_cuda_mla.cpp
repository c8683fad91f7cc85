// The CUDA MLA ops (k_mla.cu: latent norm / RoPE / cache write, absorbed attention over the
// latent cache) against the CPU reference ops (fp32, decompressed keys and values, checked
// against HF's formulas in tests/backend/test_cpu_mla.cpp) on the same bf16-exact inputs:
// DeepSeek-V3's kv_lora_rank 512 and rope 64 with fewer heads, a prefill of one sequence and
// a decode of another over an earlier cache in one batch, through non-identity block tables,
// with a padding token; NeoX + YaRN and interleaved RoPE, bf16 and FP8 (128x128 block) kv_b,
// bf16 and e4m3 latent caches. Label gpu: skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
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
