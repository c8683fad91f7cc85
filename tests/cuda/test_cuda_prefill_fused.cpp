// Prefill fusions into the FP8 activation format (cuda_prefill.cpp, cuda_backend.h
// prefill_attn_q8 / prefill_moe_norm_quant) against the unfused CUDA path and the CPU op:
// - the warp-specialised attention's FP8 epilogue (launch_attention_ws_q8): its bf16 output
//   is bit-identical to launch_attention_ws's, its e4m3 codes and both scale layouts to
//   quantising that output (launch_quant_fp8_vec), and the dequantised codes are within the
//   quantisation bound 2^-4 (+ 1e-2 for the bf16 output) of the CPU attention op;
// - attention + o_proj through the backend, fused vs unfused: o bit-identical where both take
//   cuBLASLt on all rows (T % 8 == 0); else (the fused path runs all rows on the mma.sync
//   kernel, the unfused one all but T % 8) within 1e-2;
// - add_rms_norm_route + moe_experts, fused vs unfused: residual, x, routing and the expert
//   output bit-identical; the output within 2 x (2^-4 + 1e-2) of the CPU op (two FP8
//   quantisations, test_cuda_prefill.cpp's bound).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/kernels_fp8.h"
#include "backend/cuda/kernels_prefill.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

constexpr double kQuantBound = 0.0625 + 1e-2;

std::vector<uint8_t> download_u8(const Tensor& t) {
  std::vector<uint8_t> h(t.nbytes());
  gpu().synchronize();
  cudaMemcpy(h.data(), t.data, h.size(), cudaMemcpyDeviceToHost);
  return h;
}
std::vector<uint16_t> download_u16(const Tensor& t) {
  std::vector<uint16_t> h(t.numel());
  gpu().synchronize();
  cudaMemcpy(h.data(), t.data, h.size() * 2, cudaMemcpyDeviceToHost);
  return h;
}

// A paged prefill batch (random block order) on the device and the host.
struct AttnBatch {
  int Hq, Hkv, T = 0, S, bs = 16, max_q = 0, max_ctx = 0, max_blocks = 0, num_blocks = 0;
  std::vector<float> q, kc, vc;
  std::vector<int32_t> qstart, ctx, table;
  Tensor dq;
  KVCacheLayer kv, hkv;
  AttentionMeta meta, hmeta;
};
AttnBatch make_batch(int Hq, int Hkv, const std::vector<std::pair<int, int>>& seqs, uint32_t seed) {
  AttnBatch b;
  b.Hq = Hq, b.Hkv = Hkv, b.S = int(seqs.size());
  std::mt19937 rng(seed);
  const int D = 128, W = Hkv * D;
  b.qstart.assign(b.S + 1, 0);
  for (int s = 0; s < b.S; ++s) {
    const auto [ctx, qlen] = seqs[s];
    b.T += qlen, b.max_q = std::max(b.max_q, qlen), b.max_ctx = std::max(b.max_ctx, ctx);
    b.max_blocks = std::max(b.max_blocks, (ctx + b.bs - 1) / b.bs);
    b.num_blocks += (ctx + b.bs - 1) / b.bs;
    b.qstart[s + 1] = b.qstart[s] + qlen;
    b.ctx.push_back(ctx);
  }
  b.num_blocks += 2;
  std::vector<int> perm(b.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  b.table.assign(size_t(b.S) * b.max_blocks, 0);
  int next = 0;
  for (int s = 0; s < b.S; ++s)
    for (int k = 0; k < (b.ctx[s] + b.bs - 1) / b.bs; ++k) b.table[size_t(s) * b.max_blocks + k] = perm[next++];
  b.kc = randn(size_t(b.num_blocks) * b.bs * W, rng);
  b.vc = randn(size_t(b.num_blocks) * b.bs * W, rng);
  b.q = randn(size_t(b.T) * Hq * D, rng);
  b.dq = to_device(b.q, DType::BF16, {b.T, Hq * D});
  b.kv = {to_device(b.kc, DType::BF16, {b.num_blocks, b.bs, Hkv, D}),
          to_device(b.vc, DType::BF16, {b.num_blocks, b.bs, Hkv, D})};
  b.hkv = {host_f32(b.kc, {b.num_blocks, b.bs, Hkv, D}), host_f32(b.vc, {b.num_blocks, b.bs, Hkv, D})};
  for (AttentionMeta* m : {&b.meta, &b.hmeta}) {
    m->num_seqs = b.S, m->num_tokens = b.T, m->block_size = b.bs, m->max_blocks_per_seq = b.max_blocks;
    m->max_query_len = b.max_q, m->max_context_len = b.max_ctx;
  }
  b.meta.query_start = ints_to_device(b.qstart, {b.S + 1});
  b.meta.context_lens = ints_to_device(b.ctx, {b.S});
  b.meta.block_tables = ints_to_device(b.table, {b.S, b.max_blocks});
  b.hmeta.query_start = host_i32(b.qstart, {b.S + 1});
  b.hmeta.context_lens = host_i32(b.ctx, {b.S});
  b.hmeta.block_tables = host_i32(b.table, {b.S, b.max_blocks});
  std::vector<int32_t> pos;  // query token i of sequence s sits at ctx - qlen + i
  for (int s = 0; s < b.S; ++s)
    for (int i = 0; i < seqs[s].second; ++i) pos.push_back(b.ctx[s] - seqs[s].second + i);
  b.meta.positions = ints_to_device(pos, {b.T});
  b.hmeta.positions = host_i32(pos, {b.T});
  return b;
}

bool on_hopper() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major == 9 && cuda::attention_wgmma_available();
}

struct FusedAttnCase {
  int Hq, Hkv;
  std::vector<std::pair<int, int>> seqs;  // (context, query tokens)
};
class CudaPrefillFusedAttn : public ::testing::TestWithParam<FusedAttnCase> {};

TEST_P(CudaPrefillFusedAttn, Fp8EpilogueMatchesQuantAndCpu) {
  SKIP_WITHOUT_GPU();
  if (!on_hopper()) GTEST_SKIP() << "the warp-specialised kernel needs sm_90a";
  const FusedAttnCase c = GetParam();
  AttnBatch b = make_batch(c.Hq, c.Hkv, c.seqs, 17 + c.Hq + int(c.seqs.size()));
  const int T = b.T, K = c.Hq * 128, G = c.Hq;
  cuda::AttnParams p;
  p.q = b.dq.data, p.k_cache = b.kv.k.data, p.v_cache = b.kv.v.data;
  p.query_start = b.meta.query_start.ptr<int32_t>(), p.context_lens = b.meta.context_lens.ptr<int32_t>();
  p.block_tables = b.meta.block_tables.ptr<int32_t>();
  p.num_seqs = b.S, p.T = T, p.max_query_len = b.max_q, p.max_blocks_per_seq = b.max_blocks, p.block_size = b.bs;
  p.Hq = c.Hq, p.Hkv = c.Hkv, p.D = 128, p.scale = 1.f / std::sqrt(128.f);
  p.kv_rows = int64_t(b.num_blocks) * b.bs;
  CudaBackend& be = gpu();
  // Unfused: bf16 output, then the vectorised quantisation in both scale layouts.
  Tensor out0 = to_device(std::vector<float>(size_t(T) * K, NAN), DType::BF16, {T, K});
  p.out = out0.data;
  cuda::launch_attention_ws(p, be.stream());
  Tensor q0 = be.alloc(DType::U8, {T, K}), s0_row = be.alloc(DType::F32, {T, G}), s0_tok = be.alloc(DType::F32, {G, T});
  cuda::QuantParams qp;
  qp.x = out0.data, qp.ldx = K, qp.R = T, qp.K = K, qp.q = q0.ptr<uint8_t>(), qp.s = s0_row.ptr<float>();
  qp.s_row = G, qp.s_grp = 1;
  cuda::launch_quant_fp8_vec(qp, be.stream());
  qp.s = s0_tok.ptr<float>(), qp.s_row = 1, qp.s_grp = T;
  cuda::launch_quant_fp8_vec(qp, be.stream());
  // Fused.
  Tensor out1 = to_device(std::vector<float>(size_t(T) * K, NAN), DType::BF16, {T, K});
  Tensor q1 = be.alloc(DType::U8, {T, K}), s1_row = be.alloc(DType::F32, {T, G}), s1_tok = be.alloc(DType::F32, {G, T});
  p.out = out1.data;
  cuda::AttnQ8Out q8{q1.ptr<uint8_t>(), s1_tok.ptr<float>(), s1_row.ptr<float>()};
  cuda::launch_attention_ws_q8(p, q8, be.stream());
  EXPECT_EQ(download_u16(out0), download_u16(out1)) << "bf16 output";
  const auto qa = download_u8(q0), qb = download_u8(q1);
  EXPECT_EQ(qa, qb) << "e4m3 codes";
  const auto sr0 = be.download_f32(s0_row), sr1 = be.download_f32(s1_row);
  const auto st0 = be.download_f32(s0_tok), st1 = be.download_f32(s1_tok);
  EXPECT_EQ(0, std::memcmp(sr0.data(), sr1.data(), sr0.size() * 4)) << "row-major scales";
  EXPECT_EQ(0, std::memcmp(st0.data(), st1.data(), st0.size() * 4)) << "token-fastest scales";
  // Dequantised codes vs the CPU op (f32 attention over the same bf16 inputs).
  auto cpu = make_cpu_backend();
  Tensor hq = host_f32(b.q, {T, K}), hout = Tensor::host(DType::F32, {T, K});
  AttentionArgs ha{&hq, &b.hkv, &b.hmeta, c.Hq, c.Hkv, 128, p.scale, &hout};
  cpu->attention(ha);
  std::vector<float> ref(hout.ptr<float>(), hout.ptr<float>() + hout.numel()), deq(ref.size());
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) deq[size_t(t) * K + k] = fp8_e4m3_to_f32(qb[size_t(t) * K + k]) * sr1[size_t(t) * G + k / 128];
  const double e = rel_err(deq, ref);
  std::printf("[prefill fused] attention FP8 epilogue T=%d Hq=%d Hkv=%d: dequantised vs CPU op %.3e\n", T, c.Hq, c.Hkv, e);
  EXPECT_LT(e, kQuantBound);
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaPrefillFusedAttn,
                         ::testing::Values(FusedAttnCase{12, 2, {{300, 300}, {17, 17}, {1, 1}}},  // G = 6: pair mode
                                           FusedAttnCase{6, 2, {{700, 193}, {65, 65}}},          // G = 3: single mode
                                           FusedAttnCase{8, 8, {{256, 256}}}));                  // MHA

// attention + o_proj through the backend with the FP8 epilogue on vs off.
TEST(CudaPrefillFused, AttentionOprojSameAsUnfused) {
  SKIP_WITHOUT_GPU();
  if (!on_hopper()) GTEST_SKIP() << "the warp-specialised kernel needs sm_90a";
  CudaBackend& be = gpu();
  for (const auto& seqs : {std::vector<std::pair<int, int>>{{400, 256}}, std::vector<std::pair<int, int>>{{300, 300}}}) {
    const int Hq = 12, Hkv = 2, H = 384;
    AttnBatch b = make_batch(Hq, Hkv, seqs, 5);
    const int T = b.T, K = Hq * 128;
    std::mt19937 rng(9);
    HostWeight wo = make_weight(H, K, true, rng);
    std::vector<uint16_t> attn[2], o[2];
    const bool saved = be.prefill_attn_q8;
    for (int fused = 0; fused < 2; ++fused) {
      be.prefill_attn_q8 = fused == 1;
      const uint64_t uses = be.prequant_uses();
      Tensor out = to_device(std::vector<float>(size_t(T) * K, NAN), DType::BF16, {T, K});
      Tensor dout = to_device(std::vector<float>(size_t(T) * H, NAN), DType::BF16, {T, H});
      AttentionArgs a{&b.dq, &b.kv, &b.meta, Hq, Hkv, 128, 1.f / std::sqrt(128.f), &out};
      be.attention(a);
      be.linear(out, wo.dev, dout);
      attn[fused] = download_u16(out), o[fused] = download_u16(dout);
      EXPECT_EQ(be.prequant_uses() - uses, uint64_t(fused)) << "T=" << T << ": o_proj took the epilogue's codes";
    }
    be.prefill_attn_q8 = saved;
    EXPECT_EQ(attn[0], attn[1]) << "T=" << T << ": bf16 attention output";
    if (T % 8 == 0) {
      EXPECT_EQ(o[0], o[1]) << "T=" << T << ": o_proj output";
    } else {
      std::vector<float> f0(o[0].size()), f1(o[1].size());
      for (size_t i = 0; i < f0.size(); ++i) f0[i] = bf16_to_f32(o[0][i]), f1[i] = bf16_to_f32(o[1][i]);
      const double e = rel_err(f1, f0);
      std::printf("[prefill fused] attention + o_proj T=%d: fused vs unfused %.3e\n", T, e);
      EXPECT_LT(e, 1e-2);
    }
  }
}

// add_rms_norm_route + moe_experts with the experts' quantisation fused into the norm, on vs off.
TEST(CudaPrefillFused, NormQuantExpertsSameAsUnfused) {
  SKIP_WITHOUT_GPU();
  CudaBackend& be = gpu();
  const int T = 320, H = 384, I = 256, E = 8, K = 2;  // T > moe_gemv_max_tokens: the FP8 grouped GEMMs
  std::mt19937 rng(31);
  MoeWeights moe, hmoe;
  moe.num_experts = hmoe.num_experts = E;
  moe.top_k = hmoe.top_k = K;
  add_random_experts(E, H, I, rng, moe, hmoe);
  moe.gate = to_device(randn(size_t(E) * H, rng, 0.05f, false), DType::F32, {E, H});
  const auto res0 = randn(size_t(T) * H, rng), add = randn(size_t(T) * H, rng), nw = randn(H, rng, 0.2f);
  Tensor dadd = to_device(add, DType::BF16, {T, H}), dnw = to_device(nw, DType::BF16, {H});
  std::vector<uint16_t> res[2], x[2], y[2];
  std::vector<float> ids[2], w[2];
  for (int fused = 0; fused < 2; ++fused) {
    be.prefill_moe_norm_quant = fused == 1;
    const uint64_t uses = be.prequant_uses();
    Tensor dres = to_device(res0, DType::BF16, {T, H});
    Tensor dx = be.alloc(DType::BF16, {T, H}), dy = to_device(std::vector<float>(size_t(T) * H, NAN), DType::BF16, {T, H});
    MoeRouting r;
    be.add_rms_norm_route(dres, dadd, dnw, 1e-6f, dx, moe, r);
    be.moe_experts(dx, moe, r, dy);
    res[fused] = download_u16(dres), x[fused] = download_u16(dx), y[fused] = download_u16(dy);
    ids[fused] = be.download_f32(r.expert_ids), w[fused] = be.download_f32(r.weights);
    EXPECT_EQ(be.prequant_uses() - uses, uint64_t(fused)) << "the experts took the norm's codes";
  }
  be.prefill_moe_norm_quant = true;
  EXPECT_EQ(res[0], res[1]) << "residual";
  EXPECT_EQ(x[0], x[1]) << "normed x";
  EXPECT_EQ(ids[0], ids[1]) << "expert ids";
  EXPECT_EQ(0, std::memcmp(w[0].data(), w[1].data(), w[0].size() * 4)) << "routing weights";
  EXPECT_EQ(y[0], y[1]) << "expert output";
  // The CPU op on the GPU's normed x and routing (f32, exactly dequantised weights).
  auto cpu = make_cpu_backend();
  std::vector<float> xf(x[1].size()), yf(y[1].size());
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x[1][i]), yf[i] = bf16_to_f32(y[1][i]);
  std::vector<int32_t> hid(ids[1].begin(), ids[1].end());
  MoeRouting hr{host_i32(hid, {T, K}), host_f32(w[1], {T, K})};
  Tensor hout = Tensor::host(DType::F32, {T, H});
  cpu->moe_experts(host_f32(xf, {T, H}), hmoe, hr, hout);
  const double e = rel_err(yf, std::vector<float>(hout.ptr<float>(), hout.ptr<float>() + hout.numel()));
  std::printf("[prefill fused] norm + experts' quantisation T=%d: vs CPU op %.3e\n", T, e);
  ASSERT_GT(T, be.moe_gemv_max_tokens);
  EXPECT_LT(e, 2 * kQuantBound);
}


// Timings at M2.5 shapes and 8,192 tokens, fused vs unfused (run with MOESERVE_BENCH=1;
// otherwise skipped): attention + o_proj with the FP8 epilogue off / on, and the
// post-attention norm + router + experts with the experts' quantisations as before / on the
// 16-byte-load kernel / fused into the norm / both. Four rounds, the configurations in turn,
// in reverse order on odd rounds (the clock drifts within a round).
TEST(CudaPrefillFusedBench, M25Ops8k) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_BENCH")) GTEST_SKIP() << "set MOESERVE_BENCH=1";
  CudaBackend& b = gpu();
  const int T = 8192, H = 3072, Hq = 48, Hkv = 8, D = 128, E = 256, K = 8, I = 1536;
  auto pr = [](const char* what, const std::vector<std::pair<const char*, double>>& v) {
    std::printf("[fused bench] %s:", what);
    for (auto& [n, ms] : v) std::printf(" %s %.4f ms |", n, ms);
    std::printf("\n");
  };
  {
    PagedPrefill pp = make_paged_prefill(T, Hq, Hkv, D, 16);
    Tensor attn = b.alloc(DType::BF16, {T, Hq * D}), o = b.alloc(DType::BF16, {T, H});
    AttentionArgs a{&pp.q, &pp.kv, &pp.meta, Hq, Hkv, D, 0.088f, &attn};
    const LinearWeight wo = rand_fp8(H, Hq * D, 51);
    const bool saved = b.prefill_attn_q8;
    for (int round = 0; round < 4; ++round) {
      std::vector<std::pair<const char*, double>> v;
      for (int k = 0; k < 2; ++k) {
        const int q8 = round % 2 ? 1 - k : k;
        b.prefill_attn_q8 = q8 == 1;
        v.push_back({q8 ? "attention (q8)" : "attention", event_median_ms([&] { b.attention(a); })});
        v.push_back({q8 ? "attention (q8) + o_proj" : "attention + o_proj", event_median_ms([&] {
                       b.attention(a);
                       b.linear(attn, wo, o);
                     })});
      }
      pr("attention + o_proj", v);
    }
    b.prefill_attn_q8 = saved;
  }
  {
    MoeWeights moe;
    moe.num_experts = E, moe.top_k = K;
    moe.gate = b.alloc(DType::F32, {E, H});
    b.fill_random(moe.gate, 21, 0.02f);
    for (int e = 0; e < E; ++e) moe.experts.push_back({rand_fp8(I, H, 100 + 3 * e), rand_fp8(I, H, 101 + 3 * e), rand_fp8(H, I, 102 + 3 * e)});
    Tensor res = b.alloc(DType::BF16, {T, H}), add = b.alloc(DType::BF16, {T, H}), nw = b.alloc(DType::BF16, {H});
    Tensor x = b.alloc(DType::BF16, {T, H}), y = b.alloc(DType::BF16, {T, H});
    b.fill_random(res, 41, 1.f);
    b.fill_random(add, 42, 0.01f);  // (small: the residual barely grows over the repetitions)
    b.fill_random(nw, 43, 1.f);
    MoeRouting r;
    const bool saved_nq = b.prefill_moe_norm_quant, saved_vec = b.prefill_moe_quant_vec;
    for (int round = 0; round < 4; ++round) {
      std::vector<std::pair<const char*, double>> v;
      for (int k = 0; k < 4; ++k) {  // before, quantisations on the vec kernel, x's fused into the norm, both
        const int mode = round % 2 ? 3 - k : k;
        b.prefill_moe_quant_vec = mode & 1;
        b.prefill_moe_norm_quant = mode & 2;
        const char* n[4] = {"before", "quant_vec", "norm fused", "both"};
        v.push_back({n[mode], event_median_ms([&] {
                       b.add_rms_norm_route(res, add, nw, 1e-6f, x, moe, r);
                       b.moe_experts(x, moe, r, y);
                     })});
      }
      pr("norm + route + experts", v);
    }
    b.prefill_moe_norm_quant = saved_nq, b.prefill_moe_quant_vec = saved_vec;
  }
}

}  // namespace
}  // namespace moeserve::test
