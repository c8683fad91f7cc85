// The tensor-core decode / verify attention (k_attn_verify.cu) against the CPU backend's
// attention on the same inputs (label gpu; skips without a GPU): bf16 and e4m3 caches, every
// sequence 1 + k query tokens (k = 0..4, causal within the step), contexts that cross pages
// and splits (1, 15, 16, 17, 300, 4,100 cached tokens before the step), GQA 48 / 8 at head_dim
// 128 (MiniMax-M2.5) and 8 / 2 at 64, non-identity block tables, a batch mixing sequences of
// different k with an empty sequence and padding rows after the last sequence.
// Bound: ||out - ref|| / ||ref|| < 1e-2 over the batch (test_cuda_attention's bf16 bound) AND
// < 2e-2 for every (token, head) row, so one wrong row (a causal limit, a split edge) cannot
// hide in the batch norm. The reference reads the same bytes: bf16-exact values (bf16 cache)
// or the e4m3 codes themselves (CPU FP8-KV attention).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/common/kernels.h"
#include "core/fp8_e4m3.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

struct VSeq {
  int ctx, qlen;  // cache length after the step (ctx >= qlen), query tokens (0: empty sequence)
};

struct VerifyRun {
  double batch_err = 0, worst_row = 0;
};

// Runs one batch on CUDA (verify kernel, or the generic kernel when !verify_kernel) and on
// the CPU; `pad` extra query rows after the last sequence (graph padding) are not compared.
VerifyRun run_case(int Hq, int Hkv, int D, int bs, bool fp8, const std::vector<VSeq>& seqs, int pad, uint32_t seed,
                   bool verify_kernel = true) {
  std::mt19937 rng(seed);
  const int S = int(seqs.size()), W = Hkv * D;
  int T = 0, max_q = 0, max_ctx = 0, max_blocks = 1, total = 0;
  for (auto& s : seqs) {
    T += s.qlen, max_q = std::max(max_q, s.qlen), max_ctx = std::max(max_ctx, s.ctx);
    max_blocks = std::max(max_blocks, (s.ctx + bs - 1) / bs);
    total += (s.ctx + bs - 1) / bs;
  }
  const int nb = total + 3;
  std::vector<int> perm(nb);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const float k_scale = fp8 ? 0.05f : 1.f, v_scale = fp8 ? 0.5f : 1.f;
  const size_t cache_n = size_t(nb) * bs * W;
  std::vector<float> kf, vf;
  std::vector<uint8_t> k8, v8;
  if (fp8) {
    std::normal_distribution<float> nd(0.f, 1.f);
    k8.resize(cache_n), v8.resize(cache_n);
    for (auto& b : k8) b = fp8::kv_store(2.f * nd(rng), k_scale);
    for (auto& b : v8) b = fp8::kv_store(nd(rng), v_scale);
  } else {
    kf = randn(cache_n, rng), vf = randn(cache_n, rng);
  }
  const auto q = randn(size_t(T + pad) * Hq * D, rng);
  std::vector<int32_t> qs(S + 1, 0), ctx(S), table(size_t(S) * max_blocks, 0), pos;
  int next = 0;
  for (int s = 0; s < S; ++s) {
    qs[s + 1] = qs[s] + seqs[s].qlen;
    ctx[s] = seqs[s].ctx;
    for (int b = 0; b < (ctx[s] + bs - 1) / bs; ++b) table[size_t(s) * max_blocks + b] = perm[next++];
    for (int i = 0; i < seqs[s].qlen; ++i) pos.push_back(ctx[s] - seqs[s].qlen + i);
  }
  for (int i = 0; i < pad; ++i) pos.push_back(0);
  const float scale = 1.f / std::sqrt(float(D));
  auto meta_on = [&](bool dev, int tokens) {
    auto up = [&](const std::vector<int32_t>& v, Shape sh) { return dev ? ints_to_device(v, sh) : host_i32(v, sh); };
    AttentionMeta m;
    m.num_seqs = S, m.num_tokens = tokens, m.block_size = bs, m.max_blocks_per_seq = max_blocks;
    m.max_query_len = max_q, m.max_context_len = max_ctx;
    m.positions = up(std::vector<int32_t>(pos.begin(), pos.begin() + tokens), {tokens});
    m.query_start = up(qs, {S + 1});
    m.context_lens = up(ctx, {S});
    m.block_tables = up(table, {S, max_blocks});
    return m;
  };
  const Shape cs{nb, bs, Hkv, D};
  auto cpu = make_cpu_backend();
  KVCacheLayer hkv;
  if (fp8) {
    hkv = {Tensor::host(DType::F8_E4M3, cs), Tensor::host(DType::F8_E4M3, cs), k_scale, v_scale};
    std::memcpy(hkv.k.data, k8.data(), cache_n), std::memcpy(hkv.v.data, v8.data(), cache_n);
  } else {
    hkv = {host_f32(kf, cs), host_f32(vf, cs)};
  }
  const AttentionMeta hm = meta_on(false, T);
  Tensor hq = host_f32(std::vector<float>(q.begin(), q.begin() + size_t(T) * Hq * D), {T, Hq * D});
  Tensor hout = cpu->alloc(DType::F32, {T, Hq * D});
  cpu->attention(AttentionArgs{&hq, &hkv, &hm, Hq, Hkv, D, scale, &hout});
  const auto ref = cpu->download_f32(hout);

  KVCacheLayer dkv = fp8 ? KVCacheLayer{gpu().upload(hkv.k), gpu().upload(hkv.v), k_scale, v_scale}
                         : KVCacheLayer{to_device(kf, DType::BF16, cs), to_device(vf, DType::BF16, cs)};
  const AttentionMeta dm = meta_on(true, T + pad);
  Tensor dq = to_device(q, DType::BF16, {T + pad, Hq * D});
  Tensor out = to_device(std::vector<float>(size_t(T + pad) * Hq * D, NAN), DType::BF16, {T + pad, Hq * D});
  gpu().tuning.use_attention_verify = verify_kernel;
  gpu().attention(AttentionArgs{&dq, &dkv, &dm, Hq, Hkv, D, scale, &out});
  gpu().tuning.use_attention_verify = true;
  auto got = gpu().download_f32(out);
  got.resize(ref.size());
  VerifyRun r;
  r.batch_err = rel_err(got, ref);
  for (size_t row = 0; row < size_t(T) * Hq; ++row) {
    const std::vector<float> a(got.begin() + row * D, got.begin() + (row + 1) * D);
    const std::vector<float> b(ref.begin() + row * D, ref.begin() + (row + 1) * D);
    r.worst_row = std::max(r.worst_row, rel_err(a, b));
  }
  return r;
}

const int kContexts[] = {1, 15, 16, 17, 300, 4100};

TEST(CudaAttnVerify, SupportedShapes) {
  cuda::AttnParams p;
  p.Hq = 48, p.Hkv = 8, p.D = 128, p.block_size = 16;
  for (int q = 1; q <= 5; ++q) {
    p.max_query_len = q;
    EXPECT_TRUE(cuda::attention_verify_supported(p)) << q;  // 6 x 5 = 30 rows <= 32
  }
  p.max_query_len = 6;
  EXPECT_FALSE(cuda::attention_verify_supported(p));  // 36 rows
  p.max_query_len = 1, p.D = 96;
  EXPECT_FALSE(cuda::attention_verify_supported(p));
  p.D = 64, p.Hq = 4, p.Hkv = 2;  // the demo model: G = 2, up to 16 query tokens
  p.max_query_len = 16;
  EXPECT_TRUE(cuda::attention_verify_supported(p));
  p.max_query_len = 17;
  EXPECT_FALSE(cuda::attention_verify_supported(p));
}

// One batch per (cache dtype, k): every context of kContexts (before the step) with 1 + k query
// tokens, M2.5's heads; the same contexts alone (batch 1: many splits, most of them empty at
// short contexts).
TEST(CudaAttnVerify, MatchesCpuPerK) {
  SKIP_WITHOUT_GPU();
  for (bool fp8 : {false, true})
    for (int k = 0; k <= 4; ++k) {
      std::vector<VSeq> batch;
      for (int c : kContexts) batch.push_back({c + k, 1 + k});
      const VerifyRun r = run_case(48, 8, 128, 16, fp8, batch, 0, 100 + k + 10 * fp8);
      EXPECT_LT(r.batch_err, 1e-2) << (fp8 ? "e4m3" : "bf16") << " k " << k;
      EXPECT_LT(r.worst_row, 2e-2) << (fp8 ? "e4m3" : "bf16") << " k " << k;
      std::printf("[verify] %s k=%d batch of 6: rel err %.3g, worst row %.3g\n", fp8 ? "e4m3" : "bf16", k,
                  r.batch_err, r.worst_row);
      for (int c : {1, 17, 4100}) {
        const VerifyRun r1 = run_case(48, 8, 128, 16, fp8, {{c + k, 1 + k}}, 0, 200 + c + k);
        EXPECT_LT(r1.batch_err, 1e-2) << (fp8 ? "e4m3" : "bf16") << " k " << k << " ctx " << c;
        EXPECT_LT(r1.worst_row, 2e-2) << (fp8 ? "e4m3" : "bf16") << " k " << k << " ctx " << c;
      }
    }
}

// Mixed k per sequence, an empty sequence and 3 padding rows; the same batch at head_dim 64 with
// G = 4 and block size 32.
TEST(CudaAttnVerify, MixedBatchAndPadding) {
  SKIP_WITHOUT_GPU();
  const std::vector<VSeq> mixed = {{301, 5}, {16, 1}, {4102, 3}, {0, 0}, {17, 2}, {1, 1}, {19, 4}};
  for (bool fp8 : {false, true}) {
    const VerifyRun a = run_case(48, 8, 128, 16, fp8, mixed, 3, 7 + fp8);
    EXPECT_LT(a.batch_err, 1e-2) << (fp8 ? "e4m3" : "bf16");
    EXPECT_LT(a.worst_row, 2e-2) << (fp8 ? "e4m3" : "bf16");
    const VerifyRun b = run_case(8, 2, 64, 32, fp8, mixed, 3, 9 + fp8);
    EXPECT_LT(b.batch_err, 1e-2) << "D 64 " << (fp8 ? "e4m3" : "bf16");
    EXPECT_LT(b.worst_row, 2e-2) << "D 64 " << (fp8 ? "e4m3" : "bf16");
    // The generic kernel on the same batch: the same reference, the same bound.
    const VerifyRun c = run_case(48, 8, 128, 16, fp8, mixed, 3, 7 + fp8, false);
    EXPECT_LT(c.batch_err, 1e-2) << "generic " << (fp8 ? "e4m3" : "bf16");
    std::printf("[verify] mixed %s: rel err %.3g (worst row %.3g), D 64 %.3g, generic kernel %.3g\n",
                fp8 ? "e4m3" : "bf16", a.batch_err, a.worst_row, b.batch_err, c.batch_err);
  }
}

// The demo model's shapes (head_dim 64, 4 / 2 heads, block 16): G = 2, so up to 16 query
// tokens per sequence take this kernel (two m tiles from 9 tokens), prefill chunks with no
// cached context before them included (ctx == qlen).
TEST(CudaAttnVerify, DemoShapesUpTo16Tokens) {
  SKIP_WITHOUT_GPU();
  for (bool fp8 : {false, true})
    for (int q : {1, 2, 4, 5, 8, 9, 12, 16}) {
      std::vector<VSeq> batch;
      for (int c : {0, 1, 15, 16, 17, 40, 300, 1000}) batch.push_back({c + q, q});
      const VerifyRun r = run_case(4, 2, 64, 16, fp8, batch, 2, 500 + q + 50 * fp8);
      EXPECT_LT(r.batch_err, 1e-2) << (fp8 ? "e4m3" : "bf16") << " qlen " << q;
      EXPECT_LT(r.worst_row, 2e-2) << (fp8 ? "e4m3" : "bf16") << " qlen " << q;
      const VerifyRun g = run_case(4, 2, 64, 16, fp8, batch, 2, 500 + q + 50 * fp8, false);
      std::printf("[verify] demo shapes %s qlen %d: rel err %.3g (worst row %.3g), generic kernel %.3g (%.3g)\n",
                  fp8 ? "e4m3" : "bf16", q, r.batch_err, r.worst_row, g.batch_err, g.worst_row);
      for (int c : {0, 7, 33}) {
        const VerifyRun r1 = run_case(4, 2, 64, 16, fp8, {{c + q, q}}, 0, 600 + c + q);
        EXPECT_LT(r1.worst_row, 2e-2) << (fp8 ? "e4m3" : "bf16") << " qlen " << q << " ctx " << c;
      }
    }
}

// Graph safety: one capture of a decode bucket (4 sequences x 5 query rows, max_context_len
// fixed as a decode graph has it), replayed after the step's metadata changed in place: other
// context lengths (crossing pages and splits), then other query starts (k = 1, 4, 0, 4 and 7
// padding rows). Every replay matches the CPU on that step's metadata.
TEST(CudaAttnVerify, CapturedGraphFollowsDeviceMetadata) {
  SKIP_WITHOUT_GPU();
  const int Hq = 48, Hkv = 8, D = 128, bs = 16, S = 4, T = 20, W = Hkv * D, max_ctx = 4200;
  const int mb = (max_ctx + bs - 1) / bs, nb = S * mb;
  std::mt19937 rng(77);
  for (bool fp8 : {false, true}) {
    const float k_scale = fp8 ? 0.05f : 1.f, v_scale = fp8 ? 0.5f : 1.f;
    const Shape cs{nb, bs, Hkv, D};
    const size_t n = size_t(nb) * bs * W;
    auto cpu = make_cpu_backend();
    KVCacheLayer hkv;
    if (fp8) {
      hkv = {Tensor::host(DType::F8_E4M3, cs), Tensor::host(DType::F8_E4M3, cs), k_scale, v_scale};
      std::normal_distribution<float> nd(0.f, 1.f);
      for (size_t i = 0; i < n; ++i) {
        hkv.k.ptr<uint8_t>()[i] = fp8::kv_store(2.f * nd(rng), k_scale);
        hkv.v.ptr<uint8_t>()[i] = fp8::kv_store(nd(rng), v_scale);
      }
    } else {
      hkv = {host_f32(randn(n, rng), cs), host_f32(randn(n, rng), cs)};
    }
    KVCacheLayer dkv = fp8 ? KVCacheLayer{gpu().upload(hkv.k), gpu().upload(hkv.v), k_scale, v_scale}
                           : KVCacheLayer{to_device(cpu->download_f32(hkv.k), DType::BF16, cs),
                                          to_device(cpu->download_f32(hkv.v), DType::BF16, cs)};
    std::vector<int32_t> table(size_t(S) * mb);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    const auto q = randn(size_t(T) * Hq * D, rng);
    Tensor dq = to_device(q, DType::BF16, {T, Hq * D});
    Tensor out = gpu().alloc(DType::BF16, {T, Hq * D});
    AttentionMeta dm;
    dm.num_seqs = S, dm.num_tokens = T, dm.block_size = bs, dm.max_blocks_per_seq = mb;
    dm.max_query_len = 5, dm.max_context_len = max_ctx;
    dm.query_start = ints_to_device({0, 5, 10, 15, 20}, {S + 1});
    dm.context_lens = ints_to_device({300, 17, 4100, 5}, {S});
    dm.block_tables = ints_to_device(table, {S, mb});
    dm.positions = ints_to_device(std::vector<int32_t>(T, 0), {T});
    const AttentionArgs args{&dq, &dkv, &dm, Hq, Hkv, D, 0.088f, &out};
    gpu().attention(args);  // eager run first: sizes the split workspace
    gpu().synchronize();
    gpu().begin_capture();
    gpu().attention(args);
    CudaGraph graph = gpu().end_capture();
    struct Step {
      std::vector<int32_t> qs, ctx;
    };
    for (const Step& st : {Step{{0, 5, 10, 15, 20}, {5, 4100, 16, 301}}, Step{{0, 2, 7, 8, 13}, {18, 300, 1, 4099}}}) {
      gpu().copy_from_host(dm.query_start, st.qs.data(), st.qs.size() * 4);
      gpu().copy_from_host(dm.context_lens, st.ctx.data(), st.ctx.size() * 4);
      graph.replay(gpu().stream());
      gpu().synchronize();
      const int Tr = st.qs[S];
      AttentionMeta hm;
      hm.num_seqs = S, hm.num_tokens = Tr, hm.block_size = bs, hm.max_blocks_per_seq = mb;
      hm.max_query_len = 5, hm.max_context_len = max_ctx;
      hm.query_start = host_i32(st.qs, {S + 1});
      hm.context_lens = host_i32(st.ctx, {S});
      hm.block_tables = host_i32(table, {S, mb});
      std::vector<int32_t> hpos;  // the CPU's causal limit comes from the positions
      for (int q = 0; q < S; ++q)
        for (int i = st.qs[q]; i < st.qs[q + 1]; ++i) hpos.push_back(st.ctx[q] - (st.qs[q + 1] - i));
      hm.positions = host_i32(hpos, {Tr});
      Tensor hq = host_f32(std::vector<float>(q.begin(), q.begin() + size_t(Tr) * Hq * D), {Tr, Hq * D});
      Tensor hout = cpu->alloc(DType::F32, {Tr, Hq * D});
      cpu->attention(AttentionArgs{&hq, &hkv, &hm, Hq, Hkv, D, 0.088f, &hout});
      auto got = gpu().download_f32(out);
      got.resize(size_t(Tr) * Hq * D);
      const double e = rel_err(got, cpu->download_f32(hout));
      EXPECT_LT(e, 1e-2) << (fp8 ? "e4m3" : "bf16") << " replay with " << Tr << " rows";
      std::printf("[verify] graph replay %s, %d rows: rel err %.3g\n", fp8 ? "e4m3" : "bf16", Tr, e);
    }
  }
}

// Kernel time (CUDA events) of one M2.5 layer's attention op (48 / 8 heads, head_dim 128) with
// this kernel and with the generic one; returns {generic ms, verify ms}.
struct AttnTime {
  double generic_ms, verify_ms, gb;
};
AttnTime time_attention(bool fp8, int B, int ctx, int k) {
  const int Hq = 48, Hkv = 8, D = 128, bs = 16, W = Hkv * D, nbps = (ctx + k + bs) / bs;
  const int nb = B * nbps, T = B * (1 + k);
  KVCacheLayer kv{gpu().alloc(fp8 ? DType::F8_E4M3 : DType::BF16, {nb, bs, Hkv, D}),
                  gpu().alloc(fp8 ? DType::F8_E4M3 : DType::BF16, {nb, bs, Hkv, D}), 0.1f, 0.1f};
  gpu().fill_random(kv.k, 1, 1.f);
  gpu().fill_random(kv.v, 2, 1.f);
  std::vector<int32_t> qs(B + 1), cl(B, ctx + k), table(size_t(B) * nbps), pos;
  for (int s = 0; s <= B; ++s) qs[s] = s * (1 + k);
  std::iota(table.begin(), table.end(), 0);
  for (int s = 0; s < B; ++s)
    for (int i = 0; i <= k; ++i) pos.push_back(ctx + i);
  AttentionMeta m;
  m.num_seqs = B, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = nbps;
  m.max_query_len = 1 + k, m.max_context_len = ctx + k;
  m.positions = ints_to_device(pos, {T});
  m.query_start = ints_to_device(qs, {B + 1});
  m.context_lens = ints_to_device(cl, {B});
  m.block_tables = ints_to_device(table, {B, nbps});
  std::mt19937 rng(3);
  Tensor q = to_device(randn(size_t(T) * Hq * D, rng), DType::BF16, {T, Hq * D});
  Tensor out = gpu().alloc(DType::BF16, {T, Hq * D});
  double ms[2];
  for (int v = 0; v < 2; ++v) {
    gpu().tuning.use_attention_verify = v == 1;
    ms[v] = event_median_ms([&] { gpu().attention(AttentionArgs{&q, &kv, &m, Hq, Hkv, D, 0.088f, &out}); });
  }
  gpu().tuning.use_attention_verify = true;
  return {ms[0], ms[1], double(B) * (ctx + k) * W * 2 * (fp8 ? 1 : 2) / 1e9};
}

// Printed: batch 1 and 32, verify k = 0 and 3 (the step-level figures are bench-model's).
TEST(CudaAttnVerify, BenchAgainstGeneric) {
  SKIP_WITHOUT_GPU();
  for (bool fp8 : {false, true})
    for (int B : {1, 32})
      for (int ctx : {8192, 65536})
        for (int k : {0, 3}) {
          if (B == 32 && ctx > 8192) continue;
          const AttnTime t = time_attention(fp8, B, ctx, k);
          std::printf("[verify-bench] %s batch %d ctx %d k %d: generic %.1f us, verify %.1f us (%.0f GB/s), %.2fx\n",
                      fp8 ? "e4m3" : "bf16", B, ctx, k, t.generic_ms * 1e3, t.verify_ms * 1e3,
                      t.gb / (t.verify_ms * 1e-3), t.generic_ms / t.verify_ms);
        }
}

// Issue 23 item 3a, the throughput regime: one-token decode at batch 64-256, contexts 1k-32k
// (up to 34 GB of KV per call; MOESERVE_BENCH=1 only). Printed: GB/s of the KV bytes read and
// the fraction of the H200's measured 4.50 TB/s read bandwidth.
TEST(CudaAttnVerify, BenchThroughputRegime) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_BENCH")) GTEST_SKIP() << "set MOESERVE_BENCH=1";
  for (bool fp8 : {false, true})
    for (int B : {64, 128, 256})
      for (int ctx : {1024, 8192, 32768}) {
        const AttnTime t = time_attention(fp8, B, ctx, 0);
        const double bw = t.gb / (t.verify_ms * 1e-3);
        std::printf("[verify-tput] %s batch %d ctx %d: KV %.2f GB, verify %.1f us = %.0f GB/s (%.0f%% of 4.50 TB/s), "
                    "generic %.1f us\n",
                    fp8 ? "e4m3" : "bf16", B, ctx, t.gb, t.verify_ms * 1e3, bw, bw / 45.0, t.generic_ms * 1e3);
      }
}

}  // namespace
}  // namespace moeserve::test
