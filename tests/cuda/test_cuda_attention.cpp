// Paged causal GQA attention vs a host reference (f64 softmax over the bf16 cache).
// Threshold: ||out - ref|| / ||ref|| < 1e-2 (bf16 output rounding; f32 accumulation).
// Cases cover decode (one query token, long contexts: split-KV), prefill, chunked prefill
// (query tokens after a cached prefix), mixed batches, GQA groups 6 / 2 / 1 and head_dim 64;
// batches with >= 64 query tokens and head_dim 128 run the tensor-core kernel (k_attn_tc.cu).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "backend/cuda/linear/kernels_fp8.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

struct SeqSpec {
  int ctx;   // tokens in the cache after this step
  int qlen;  // query tokens (the last qlen positions)
};
struct AttnCase {
  int Hq, Hkv, D, block_size;
  std::vector<SeqSpec> seqs;
};

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const AttnCase c = GetParam();
  std::mt19937 rng(c.Hq * 100 + c.D + int(c.seqs.size()));
  const int S = int(c.seqs.size()), bs = c.block_size, W = c.Hkv * c.D;
  int T = 0, max_q = 0, max_ctx = 0, max_blocks = 0, total_blocks = 0;
  for (auto& s : c.seqs) {
    T += s.qlen;
    max_q = std::max(max_q, s.qlen);
    max_ctx = std::max(max_ctx, s.ctx);
    max_blocks = std::max(max_blocks, (s.ctx + bs - 1) / bs);
    total_blocks += (s.ctx + bs - 1) / bs;
  }
  const int num_blocks = total_blocks + 3;
  // Physical blocks in a random order, so the block table matters.
  std::vector<int> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  auto kc = randn(size_t(num_blocks) * bs * W, rng), vc = randn(size_t(num_blocks) * bs * W, rng);
  auto q = randn(size_t(T) * c.Hq * c.D, rng);
  std::vector<int32_t> qstart(S + 1, 0), ctx(S), table(size_t(S) * max_blocks, 0);
  int next = 0;
  for (int s = 0; s < S; ++s) {
    qstart[s + 1] = qstart[s] + c.seqs[s].qlen;
    ctx[s] = c.seqs[s].ctx;
    for (int b = 0; b < (ctx[s] + bs - 1) / bs; ++b) table[size_t(s) * max_blocks + b] = perm[next++];
  }
  const float scale = 1.f / std::sqrt(float(c.D));
  // Reference.
  std::vector<float> ref(size_t(T) * c.Hq * c.D);
  const int G = c.Hq / c.Hkv;
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < c.seqs[s].qlen; ++i) {
      const int t = qstart[s] + i, pos = ctx[s] - c.seqs[s].qlen + i;
      for (int h = 0; h < c.Hq; ++h) {
        const int kvh = h / G;
        std::vector<double> sc(pos + 1);
        double mx = -1e300;
        for (int j = 0; j <= pos; ++j) {
          const size_t slot = size_t(table[size_t(s) * max_blocks + j / bs]) * bs + j % bs;
          double d = 0;
          for (int x = 0; x < c.D; ++x) d += double(q[(size_t(t) * c.Hq + h) * c.D + x]) * kc[slot * W + kvh * c.D + x];
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        double l = 0;
        for (auto& v : sc) l += (v = std::exp(v - mx));
        for (int x = 0; x < c.D; ++x) {
          double o = 0;
          for (int j = 0; j <= pos; ++j) {
            const size_t slot = size_t(table[size_t(s) * max_blocks + j / bs]) * bs + j % bs;
            o += sc[j] * vc[slot * W + kvh * c.D + x];
          }
          ref[(size_t(t) * c.Hq + h) * c.D + x] = float(o / l);
        }
      }
    }
  KVCacheLayer kv{to_device(kc, DType::BF16, {num_blocks, bs, c.Hkv, c.D}),
                  to_device(vc, DType::BF16, {num_blocks, bs, c.Hkv, c.D})};
  AttentionMeta meta;
  meta.num_seqs = S, meta.num_tokens = T, meta.block_size = bs, meta.max_blocks_per_seq = max_blocks;
  meta.max_query_len = max_q, meta.max_context_len = max_ctx;
  meta.query_start = ints_to_device(qstart, {S + 1});
  meta.context_lens = ints_to_device(ctx, {S});
  meta.block_tables = ints_to_device(table, {S, max_blocks});
  Tensor dq = to_device(q, DType::BF16, {T, c.Hq * c.D});
  // Mode 0: default (on Hopper the warp-specialised wgmma kernel, k_attn_ws.cu), 1: the
  // pipelined mma.sync prefill kernel, 2: the unpipelined tensor-core kernel, 3: the scalar
  // kernel only. (The earlier two-warpgroup wgmma kernel and the warp-specialised kernel's
  // opt-in variants, modes 4-14, left the tree with their code; the fused split-KV combine
  // likewise: docs/bench/cuda_switch_inventory.md.)
  // MOESERVE_TEST_ATTN_MODE=m: only mode m (diagnostics).
  const char* only = std::getenv("MOESERVE_TEST_ATTN_MODE");
  auto run_mode = [&](int mode, const KVCacheLayer& cache, const char* what) {
    gpu().tuning.use_attention_wgmma = mode == 0;
    gpu().tuning.use_attention_prefill = mode <= 1;
    gpu().tuning.use_attention_tc = mode < 3;
    Tensor out = to_device(std::vector<float>(size_t(T) * c.Hq * c.D, NAN), DType::BF16, {T, c.Hq * c.D});  // poisoned
    AttentionArgs a{&dq, &cache, &meta, c.Hq, c.Hkv, c.D, scale, &out};
    gpu().attention(a);
    EXPECT_LT(rel_err(gpu().download_f32(out), ref), 1e-2) << "mode " << mode << what;
  };
  for (int mode = 0; mode <= 3; ++mode)
    if (!(only && std::atoi(only) != mode)) run_mode(mode, kv, "");
  // Cache slots no query may see (past each sequence's context, unused blocks) set to NaN:
  // the warp-specialised kernel's cp.async copies must not let them reach the output
  // (0 * NaN; batches it takes: head_dim 128, >= 64 query tokens).
  if (!only && c.D == 128 && max_q >= 64) {
    std::vector<float> kn = kc, vn = vc;
    std::vector<char> used(size_t(num_blocks) * bs, 0);
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < ctx[s]; ++j) used[size_t(table[size_t(s) * max_blocks + j / bs]) * bs + j % bs] = 1;
    for (size_t slot = 0; slot < used.size(); ++slot)
      if (!used[slot])
        for (int x = 0; x < W; ++x) kn[slot * W + x] = vn[slot * W + x] = NAN;
    KVCacheLayer kv_nan{to_device(kn, DType::BF16, {num_blocks, bs, c.Hkv, c.D}),
                        to_device(vn, DType::BF16, {num_blocks, bs, c.Hkv, c.D})};
    run_mode(0, kv_nan, " (NaN outside the contexts)");
  }
  gpu().tuning.use_attention_wgmma = true;
  gpu().tuning.use_attention_prefill = true;
  gpu().tuning.use_attention_tc = true;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaAttention,
    ::testing::Values(
        AttnCase{48, 8, 128, 16, {{1, 1}}},                             // first decode token
        AttnCase{48, 8, 128, 16, {{1000, 1}}},                          // decode, split-KV
        AttnCase{48, 8, 128, 16, {{3001, 1}, {17, 1}, {640, 1}}},       // decode batch
        AttnCase{48, 8, 128, 16, {{77, 77}}},                           // prefill
        AttnCase{48, 8, 128, 32, {{300, 37}, {5, 1}, {64, 64}}},        // chunked prefill + decode + prefill
        AttnCase{4, 2, 64, 16, {{200, 13}, {700, 1}}},                  // G = 2, head_dim 64
        AttnCase{8, 8, 128, 16, {{129, 129}, {2000, 1}}},               // MHA (G = 1)
        AttnCase{12, 1, 96, 8, {{50, 3}}},                              // G = 12, head_dim 96
        // Tensor-core prefill path (>= 64 query tokens, head_dim 128): several query tiles,
        // a cached prefix (chunked prefill), a partial last tile, and a decode row alongside.
        AttnCase{48, 8, 128, 16, {{1100, 520}, {90, 70}, {300, 1}}},
        // wgmma kernel (sm_90a): pair mode (even groups: 2 heads x 64 tokens per block) and
        // single mode (odd groups: 1 head x 128 tokens); exact tiles, 1- and 17-token prompts
        // beside longer ones, 1000+ tokens after a cached prefix, block size 32, and head_dim
        // 64 with >= 64 tokens (falls back to the scalar kernel).
        AttnCase{48, 8, 128, 16, {{128, 128}}},                         // G = 6, two full tiles
        AttnCase{12, 2, 128, 16, {{300, 300}, {17, 17}, {1, 1}}},       // G = 6, prompts 300/17/1
        AttnCase{16, 2, 128, 16, {{1500, 1030}, {64, 64}}},             // G = 8, prefix 470
        AttnCase{4, 4, 128, 16, {{1200, 1100}, {300, 200}, {33, 17}}},  // G = 1, prefixes
        AttnCase{6, 2, 128, 32, {{200, 150}, {1000, 65}}},              // G = 3 (single mode)
        AttnCase{8, 1, 64, 16, {{100, 100}}},                          // head_dim 64 fallback
        // Warp-specialised kernel: lengths that are no multiple of the 64-row / 128-key tiles
        // (a last tile of 1 key, a consumer with no valid row, a block of one tile), several
        // ring wraps, a cached prefix that is no multiple of the block size, block size 64.
        AttnCase{48, 8, 128, 16, {{641, 641}, {63, 63}, {129, 1}}},    // G = 6
        AttnCase{6, 2, 128, 16, {{700, 193}, {65, 65}}},               // G = 3: 128 tokens per block
        AttnCase{12, 2, 128, 64, {{1281, 1000}, {190, 130}}},          // G = 6, block size 64
        AttnCase{16, 2, 128, 8, {{300, 200}, {90, 1}}},                // block size 8: generic loader
        AttnCase{8, 2, 128, 256, {{600, 600}, {260, 70}}}));           // block size 256: generic loader

// On a Hopper part the sm_90a build must take the wgmma path (else the cases above would
// silently test only the fallback).
TEST(CudaAttentionWgmma, AvailableOnHopper) {
  SKIP_WITHOUT_GPU();
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major != 9) GTEST_SKIP() << "not compute capability 9.x";
  gpu();
  EXPECT_TRUE(cuda::attention_wgmma_available());
}

}  // namespace
}  // namespace moeserve::test
