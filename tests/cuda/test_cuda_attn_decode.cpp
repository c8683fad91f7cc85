// qk_norm_rope_attention on CUDA (decode: one fused kernel, k_attn_decode.cu) against the CPU
// backend's qk_norm_rope_write_kv + attention on the same inputs: the attention output and
// both caches (the new token's k/v written at its slot, nothing else touched).
// Threshold: ||out - ref|| / ||ref|| < 1e-2 (bf16 activations and cache).
// Cases: M2.5 decode (48 q / 8 kv heads, head_dim 128, rotary 64) at contexts 1, 17, 1000,
// 1024, 3001, 4100 and 8192 (1 to 16 splits, partial 16-key chunks, several chunks per warp),
// batches of 3 to 8 mixed contexts with a padding sequence (slot -1, compared on the caches
// only), GQA groups 8 and 1, full rotary. Each case runs the fused kernel version 2
// (k_attn_decode2.cu, <= 8 and <= 16 splits), version 1 (k_attn_decode.cu) and the unfused
// CUDA path (attn_decode_max_tokens = 0); version 2 is also compared with version 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "test_util.h"

namespace moeserve::cuda {  // k_attn_decode2.cu diagnostics (not in kernels.h)
void attn_decode2_timing(bool on);
std::vector<unsigned long long> attn_decode2_read_timer();
}  // namespace moeserve::cuda

namespace moeserve::test {
namespace {

struct DecCase {
  int Hq, Hkv, rot;
  std::vector<int> ctx;  // per sequence, including this step's token; 0: a padding sequence
  int tp = 1;  // > 1: given sums of squares over a row `tp` times wider (tensor-parallel QK-norm)
};

class CudaQkNormRopeAttention : public ::testing::TestWithParam<DecCase> {};

TEST_P(CudaQkNormRopeAttention, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const DecCase c = GetParam();
  const int D = 128, bs = 16, S = int(c.ctx.size()), T = S, QW = c.Hq * D, KW = c.Hkv * D;
  std::mt19937 rng(c.Hq * 7 + S * 131 + c.ctx[0]);
  int max_blocks = 1, total = 0, max_ctx = 1;
  for (int x : c.ctx) {
    const int n = std::max(1, (x + bs - 1) / bs);
    max_blocks = std::max(max_blocks, n);
    total += n;
    max_ctx = std::max(max_ctx, std::max(x, 1));
  }
  const int num_blocks = total + 2;
  std::vector<int> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> qstart(S + 1), ctx(S), table(size_t(S) * max_blocks, 0), pos(S), slots(S);
  int next = 0;
  for (int s = 0; s < S; ++s) {
    qstart[s + 1] = s + 1;
    const bool pad = c.ctx[s] == 0;
    ctx[s] = pad ? 1 : c.ctx[s];
    for (int b = 0; b < (ctx[s] + bs - 1) / bs; ++b) table[size_t(s) * max_blocks + b] = perm[next++];
    pos[s] = pad ? 0 : ctx[s] - 1;
    slots[s] = pad ? -1 : table[size_t(s) * max_blocks + pos[s] / bs] * bs + pos[s] % bs;
  }
  auto q = randn(size_t(T) * QW, rng), k = randn(size_t(T) * KW, rng), v = randn(size_t(T) * KW, rng);
  auto qn = randn(QW, rng, 0.5f), kn = randn(KW, rng, 0.5f);
  auto kc = randn(size_t(num_blocks) * bs * KW, rng), vc = randn(size_t(num_blocks) * bs * KW, rng);
  const float scale = 1.f / std::sqrt(float(D));
  // Tensor-parallel QK-norm inputs: this rank's sum of squares plus the other ranks' share.
  std::vector<float> qss(T), kss(T);
  for (int t = 0; t < T; ++t) {
    std::uniform_real_distribution<float> other(0.f, 1.f);
    for (int i = 0; i < QW; ++i) qss[t] += q[size_t(t) * QW + i] * q[size_t(t) * QW + i];
    for (int i = 0; i < KW; ++i) kss[t] += k[size_t(t) * KW + i] * k[size_t(t) * KW + i];
    qss[t] += other(rng) * QW * (c.tp - 1), kss[t] += other(rng) * KW * (c.tp - 1);
  }

  auto run = [&](Backend& b, bool on_gpu) {
    auto F = [&](const std::vector<float>& x, const Shape& s) {
      return on_gpu ? to_device(x, DType::BF16, s) : host_f32(x, s);
    };
    auto I = [&](const std::vector<int32_t>& x, const Shape& s) {
      return on_gpu ? ints_to_device(x, s) : host_i32(x, s);
    };
    Tensor tq = F(q, {T, QW}), tk = F(k, {T, KW}), tv = F(v, {T, KW}), tqn = F(qn, {QW}), tkn = F(kn, {KW});
    Tensor tpos = I(pos, {T});
    KVCacheLayer kv{F(kc, {num_blocks, bs, c.Hkv, D}), F(vc, {num_blocks, bs, c.Hkv, D})};
    AttentionMeta m;
    m.num_seqs = S, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = max_blocks;
    m.max_query_len = 1, m.max_context_len = max_ctx;
    m.query_start = I(qstart, {S + 1});
    m.context_lens = I(ctx, {S});
    m.block_tables = I(table, {S, max_blocks});
    m.slot_mapping = I(slots, {T});
    m.positions = tpos;
    Tensor out = on_gpu ? to_device(std::vector<float>(size_t(T) * QW, NAN), DType::BF16, {T, QW})
                        : b.alloc(DType::F32, {T, QW});
    QkNormRopeArgs qa;
    qa.q = &tq, qa.k = &tk, qa.q_norm_weight = &tqn, qa.k_norm_weight = &tkn, qa.positions = &tpos;
    qa.rope = {D, c.rot, 5e6f};
    qa.eps = 1e-6f;
    Tensor tqss = on_gpu ? to_device(qss, DType::F32, {T}) : host_f32(qss, {T});
    Tensor tkss = on_gpu ? to_device(kss, DType::F32, {T}) : host_f32(kss, {T});
    if (c.tp > 1) {
      qa.q_sum_squares = &tqss, qa.k_sum_squares = &tkss;
      qa.q_full_width = int64_t(c.tp) * QW, qa.k_full_width = int64_t(c.tp) * KW;
    }
    AttentionArgs aa{&tq, &kv, &m, c.Hq, c.Hkv, D, scale, &out};
    b.qk_norm_rope_attention(qa, tv, kv, m, aa);
    return std::vector<std::vector<float>>{b.download_f32(out), b.download_f32(kv.k), b.download_f32(kv.v)};
  };
  auto cpu = make_cpu_backend();
  auto r = run(*cpu, false);
  // Padding sequences: the fused kernel attends to the fresh (unwritten) key, the unfused
  // path to whatever the dummy slot holds; their rows are not compared.
  auto real_rows = [&](std::vector<float> x) {
    for (int s = 0; s < S; ++s)
      if (c.ctx[s] == 0) std::fill(x.begin() + size_t(s) * QW, x.begin() + size_t(s + 1) * QW, 0.f);
    return x;
  };
  // Variants: version 2 (<= 8 splits; <= 16 splits: 16-block clusters where the device
  // co-schedules them), version 1 (k_attn_decode.cu, the fallback for shapes version 2
  // refuses), the unfused CUDA path. (Version 2's pulled merge and 4-warp variants left the
  // tree: docs/bench/cuda_switch_inventory.md.)
  struct Var {
    int version, max_splits;
  };
  const Var vars[] = {{2, 8}, {2, 16}, {1, 8}, {0, 8}};
  const int kV1 = 2, kVars = 4;
  std::vector<float> v1_out, v2_out, v2_cache_k;
  for (int var = 0; var < kVars; ++var) {
    const int fused = vars[var].version > 0;
    gpu().tuning.attn_decode_max_tokens = fused ? 64 : 0;
    gpu().tuning.attn_decode_version = vars[var].version;
    gpu().tuning.attn_decode_max_splits = vars[var].max_splits;
    auto g = run(gpu(), true);
    EXPECT_LT(rel_err(real_rows(g[0]), real_rows(r[0])), 1e-2) << "attention out, variant " << var;
    EXPECT_LT(rel_err(g[1], r[1]), 1e-2) << "k cache, variant " << var;
    EXPECT_LT(rel_err(g[2], r[2]), 1e-2) << "v cache, variant " << var;
    // The new token's k row itself (a few hundred values inside a large cache).
    for (int s = 0; s < S; ++s) {
      if (slots[s] < 0) continue;
      const size_t o = size_t(slots[s]) * KW;
      std::vector<float> gk(g[1].begin() + o, g[1].begin() + o + KW), rk(r[1].begin() + o, r[1].begin() + o + KW);
      EXPECT_LT(rel_err(gk, rk), 1e-2) << "new k row of sequence " << s << ", variant " << var;
      // Both fused versions round the new k to bf16 after norm + RoPE the same way.
      if (var == kV1) {
        std::vector<float> v2k(v2_cache_k.begin() + o, v2_cache_k.begin() + o + KW);
        EXPECT_LT(rel_err(v2k, gk), 2e-3) << "new k row of sequence " << s << ": version 2 vs 1";
      }
    }
    if (var == 0) v2_out = real_rows(g[0]), v2_cache_k = g[1];
    if (var == kV1) v1_out = real_rows(g[0]);
  }
  // Version 2 rounds P to bf16 for the tensor-core P V; against version 1 (fp32 P) it stays
  // within a few bf16 ulps of the output.
  EXPECT_LT(rel_err(v2_out, v1_out), 5e-3) << "version 2 vs version 1";
  gpu().tuning.attn_decode_version = 2;
  gpu().tuning.attn_decode_max_splits = 8;
  gpu().tuning.attn_decode_max_tokens = 64;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaQkNormRopeAttention,
                         ::testing::Values(DecCase{48, 8, 64, {1024}},             // M2.5 batch 1, 8 splits
                                           DecCase{48, 8, 64, {1}},                // first token
                                           DecCase{48, 8, 64, {17}},               // one partial chunk
                                           DecCase{48, 8, 64, {1000}},             // partial chunks
                                           DecCase{48, 8, 64, {4100}},             // several chunks per warp
                                           DecCase{48, 8, 64, {8192}},             // 16 splits (v2)
                                           DecCase{48, 8, 64, {3001}},             // several iterations
                                           DecCase{48, 8, 64, {8192, 1, 17}},      // batch 3
                                           DecCase{48, 8, 64, {129, 4100, 1000, 0, 16, 2047}},  // batch 6
                                           DecCase{48, 8, 64, {3001, 17, 0, 640}},  // mixed + padding
                                           DecCase{48, 8, 64, {200, 129, 64, 65, 1, 300, 1000, 128}},
                                           DecCase{16, 2, 128, {500}},             // G = 8, full rotary
                                           DecCase{24, 4, 64, {1000, 3, 300}, 2},  // TP = 2: given sums
                                           DecCase{4, 4, 32, {200, 70}}));         // G = 1


// Diagnostics, not a check (runs only with MOESERVE_ATTN_TIMING=1): M2.5 shapes, batch 1,
// contexts 1024 and 8192; wall time per call of 200 back-to-back fused calls for both
// versions, and version 2's phase timer (us from block entry, mean / max over blocks; entry
// skew = globaltimer spread of the blocks' starts).
TEST(CudaAttnDecodeTiming, Phases) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_ATTN_TIMING")) GTEST_SKIP() << "set MOESERVE_ATTN_TIMING=1";
  const int D = 128, bs = 16, Hq = 48, Hkv = 8, QW = Hq * D, KW = Hkv * D;
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  for (int C : {1024, 8192}) {
    std::mt19937 rng(C);
    const int nb = (C + bs - 1) / bs;
    std::vector<int32_t> table(nb), qstart{0, 1}, ctx{C}, pos{C - 1}, slots(1);
    std::iota(table.begin(), table.end(), 0);
    slots[0] = (C - 1);
    Tensor tq = to_device(randn(QW, rng), DType::BF16, {1, QW}), tk = to_device(randn(KW, rng), DType::BF16, {1, KW});
    Tensor tv = to_device(randn(KW, rng), DType::BF16, {1, KW});
    Tensor tqn = to_device(randn(QW, rng, 0.5f), DType::BF16, {QW}), tkn = to_device(randn(KW, rng, 0.5f), DType::BF16, {KW});
    Tensor tpos = ints_to_device(pos, {1});
    KVCacheLayer kv{to_device(randn(size_t(nb) * bs * KW, rng), DType::BF16, {nb, bs, Hkv, D}),
                    to_device(randn(size_t(nb) * bs * KW, rng), DType::BF16, {nb, bs, Hkv, D})};
    AttentionMeta m;
    m.num_seqs = 1, m.num_tokens = 1, m.block_size = bs, m.max_blocks_per_seq = nb;
    m.max_query_len = 1, m.max_context_len = C;
    m.query_start = ints_to_device(qstart, {2});
    m.context_lens = ints_to_device(ctx, {1});
    m.block_tables = ints_to_device(table, {1, nb});
    m.slot_mapping = ints_to_device(slots, {1});
    m.positions = tpos;
    Tensor out = to_device(std::vector<float>(QW, 0.f), DType::BF16, {1, QW});
    QkNormRopeArgs qa;
    qa.q = &tq, qa.k = &tk, qa.q_norm_weight = &tqn, qa.k_norm_weight = &tkn, qa.positions = &tpos;
    qa.rope = {D, 64, 5e6f};
    AttentionArgs aa{&tq, &kv, &m, Hq, Hkv, D, 1.f / std::sqrt(float(D)), &out};
    for (int ver : {1, 2}) {
      gpu().tuning.attn_decode_version = ver;
      for (int i = 0; i < 20; ++i) gpu().qk_norm_rope_attention(qa, tv, kv, m, aa);
      gpu().synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      const int N = 200;
      for (int i = 0; i < N; ++i) gpu().qk_norm_rope_attention(qa, tv, kv, m, aa);
      gpu().synchronize();
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / N;
      std::printf("ctx %d version %d: %.2f us per call (back to back)\n", C, ver, us);
    }
    {
      cuda::attn_decode2_timing(true);
      gpu().qk_norm_rope_attention(qa, tv, kv, m, aa);
      gpu().synchronize();
      cuda::attn_decode2_timing(false);
      const auto t = cuda::attn_decode2_read_timer();
      const int nblk = 8 * Hkv;  // splits are 8 at both contexts by default
      unsigned long long g_min = ~0ull, g_max = 0, g_end = 0;
      for (int b = 0; b < nblk; ++b) {
        g_min = std::min(g_min, t[b * 10]), g_max = std::max(g_max, t[b * 10]);
        g_end = std::max(g_end, t[b * 10 + 9]);
      }
      std::printf("ctx %d version 2 timer (%d blocks): entry skew %.2f us, first entry to last exit %.2f us\n", C,
                  nblk, (g_max - g_min) / 1e3, (g_end - g_min) / 1e3);
      const char* names[] = {"",         "pre-wait",          "wait",     "loads+sums",
                             "normalise", "key loop (warp 0)", "partials", "block merge (+push)", "cluster barrier"};
      for (int p = 1; p <= 8; ++p) {
        double sum = 0, mx = 0;
        for (int b = 0; b < nblk; ++b) {
          const double us = double(t[b * 10 + p]) / (clock_khz * 1e-3);
          sum += us, mx = std::max(mx, us);
        }
        std::printf("  %-20s mean %7.2f us  max %7.2f us\n", names[p], sum / nblk, mx);
      }
    }
  }
  gpu().tuning.attn_decode_version = 2;
}

}  // namespace
}  // namespace moeserve::test
