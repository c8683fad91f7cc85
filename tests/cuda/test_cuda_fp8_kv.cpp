// The FP8 KV cache on CUDA (label gpu; every test skips without a GPU), against the CPU
// reference backend's FP8-KV results:
// - write_kv and the fused QK-norm + RoPE + KV write store exactly the CPU's bytes
//   (core/fp8_e4m3.h is compiled into both), saturation and NaN included;
// - attention over an e4m3 cache (decode with split-KV, decode batches, prefill, chunked
//   prefill, the spec-decode verify shape of 1 + k query tokens per sequence, head dims 128 /
//   64 / 96 / 50, every kernel selection mode) vs the CPU's attention over the same bytes:
//   ||out - ref|| / ||ref|| < 1e-2, the bf16 bound of test_cuda_attention;
// - the golden fixtures through RankExecutor with --kv-cache-dtype fp8 on CUDA (decode graphs
//   on) vs the same on the CPU: teacher-forced logits within test_cuda_golden's bf16 bound.
#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>

#include "../model/golden_fixture.h"
#include "../model/kv_fp8_fixture.h"
#include "backend/cpu/cpu_backend.h"
#include "core/fp8_e4m3.h"
#include "runtime/model_executor.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

Tensor fp8_host(const std::vector<uint8_t>& codes, const Shape& s) {
  Tensor t = Tensor::host(DType::F8_E4M3, s);
  std::memcpy(t.data, codes.data(), codes.size());
  return t;
}

std::vector<uint8_t> download_codes(const Tensor& dev) {
  // download_f32 decodes exactly; re-encoding a decoded code gives the code back (NaN: 0x7f).
  std::vector<uint8_t> out;
  for (float x : gpu().download_f32(dev)) out.push_back(fp8::e4m3_from_f32(x));
  return out;
}

AttentionMeta slots_meta(const std::vector<int32_t>& slots, bool device) {
  AttentionMeta m;
  m.num_tokens = int(slots.size());
  m.slot_mapping = device ? ints_to_device(slots, {int(slots.size())}) : host_i32(slots, {int(slots.size())});
  return m;
}

TEST(CudaFp8Kv, WriteKvBytesEqualCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int T = 37, Hkv = 4, D = 128, W = Hkv * D, blocks = 8, bs = 16;
  auto k = randn(size_t(T) * W, rng, 3.f), v = randn(size_t(T) * W, rng, 0.02f);
  // Edge values (bf16-exact): saturation beyond 448 * scale, +-inf, NaN, e4m3 subnormals, zeros.
  const float inf = INFINITY;
  const float edges[] = {1e4f, -1e4f, inf, -inf, NAN, 1e-3f, -3e-4f, 0.f, -0.f, 200.f};
  for (size_t i = 0; i < std::size(edges); ++i) k[i] = v[i + 50] = bf16_to_f32(f32_to_bf16(edges[i]));
  std::vector<int32_t> slots(T);
  for (int t = 0; t < T; ++t) slots[t] = (t * 7) % (blocks * bs);
  slots[3] = -1;  // a padding token: not written
  const float ks = 0.75f, vs = 0.01f;
  // CUDA.
  KVCacheLayer dkv{gpu().alloc(DType::F8_E4M3, {blocks, bs, Hkv, D}), gpu().alloc(DType::F8_E4M3, {blocks, bs, Hkv, D}),
                   ks, vs};
  gpu().write_kv(to_device(k, DType::BF16, {T, W}), to_device(v, DType::BF16, {T, W}), dkv, slots_meta(slots, true));
  // CPU.
  auto cpu = make_cpu_backend();
  KVCacheLayer hkv{cpu->alloc(DType::F8_E4M3, {blocks, bs, Hkv, D}), cpu->alloc(DType::F8_E4M3, {blocks, bs, Hkv, D}),
                   ks, vs};
  cpu->write_kv(host_f32(k, {T, W}), host_f32(v, {T, W}), hkv, slots_meta(slots, false));
  const auto gk = download_codes(dkv.k), gv = download_codes(dkv.v);
  const uint8_t* ck = hkv.k.ptr<uint8_t>();
  const uint8_t* cv = hkv.v.ptr<uint8_t>();
  int64_t nonzero = 0;
  for (size_t i = 0; i < gk.size(); ++i) {
    // 0x80 (-0) decodes to -0.f and re-encodes to 0x80: the comparison is bitwise.
    ASSERT_EQ(gk[i], ck[i]) << "K byte " << i;
    ASSERT_EQ(gv[i], cv[i]) << "V byte " << i;
    nonzero += ck[i] != 0;
  }
  EXPECT_GT(nonzero, int64_t(T - 1) * W / 2);
  EXPECT_EQ(ck[size_t(slots[0]) * W + 0], 0x7e);  // 1e4 / 0.75 saturates to 448
  EXPECT_EQ(ck[size_t(slots[0]) * W + 2], 0x7e);  // +inf -> 448 (satfinite)
  EXPECT_EQ(ck[size_t(slots[0]) * W + 4], 0x7f);  // NaN
}

// The fused QK-norm + RoPE + KV write (the path serve's decode takes) stores e4m3 of the
// k it normalised and rotated in place, with the layer's scales.
TEST(CudaFp8Kv, FusedQkNormRopeWriteKvStoresE4m3) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  for (int T : {1, 5, 200}) {  // decode (cluster slices), small, prefill (vector kernel path refuses FP8)
    const int Hq = 48, Hkv = 8, D = 128, blocks = 16, bs = 16;
    const int qw = Hq * D, kw = Hkv * D;
    Tensor q = to_device(randn(size_t(T) * qw, rng), DType::BF16, {T, qw});
    Tensor k = to_device(randn(size_t(T) * kw, rng), DType::BF16, {T, kw});
    Tensor v = to_device(randn(size_t(T) * kw, rng), DType::BF16, {T, kw});
    Tensor qn = to_device(randn(size_t(qw), rng, 0.1f), DType::BF16, {qw});
    Tensor kn = to_device(randn(size_t(kw), rng, 0.1f), DType::BF16, {kw});
    std::vector<int32_t> pos(T), slots(T);
    for (int t = 0; t < T; ++t) pos[t] = 100 + t, slots[t] = (t * 3) % (blocks * bs);
    Tensor pt = ints_to_device(pos, {T});
    AttentionMeta m = slots_meta(slots, true);
    KVCacheLayer kv{gpu().alloc(DType::F8_E4M3, {blocks, bs, Hkv, D}), gpu().alloc(DType::F8_E4M3, {blocks, bs, Hkv, D}),
                    0.5f, 2.f};
    QkNormRopeArgs a;
    a.q = &q, a.k = &k, a.q_norm_weight = &qn, a.k_norm_weight = &kn, a.positions = &pt;
    a.rope.head_dim = D, a.rope.rotary_dim = 64, a.rope.theta = 5e6f;
    gpu().qk_norm_rope_write_kv(a, v, kv, m);
    const auto kr = gpu().download_f32(k), vr = gpu().download_f32(v);  // k after norm + RoPE (bf16)
    const auto gk = download_codes(kv.k), gv = download_codes(kv.v);
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < kw; ++c) {
        const size_t i = size_t(t) * kw + c, o = size_t(slots[t]) * kw + c;
        ASSERT_EQ(gk[o], fp8::kv_store(kr[i], 0.5f)) << "T " << T << " token " << t << " col " << c;
        ASSERT_EQ(gv[o], fp8::kv_store(vr[i], 2.f)) << "T " << T << " token " << t << " col " << c;
      }
  }
}

struct SeqSpec {
  int ctx, qlen;
};
struct Fp8AttnCase {
  int Hq, Hkv, D, block_size;
  std::vector<SeqSpec> seqs;
  float k_scale, v_scale;
};
void PrintTo(const Fp8AttnCase& c, std::ostream* os) {
  *os << c.Hq << "x" << c.Hkv << "x" << c.D << " bs" << c.block_size << " seqs " << c.seqs.size();
}

class CudaFp8KvAttention : public ::testing::TestWithParam<Fp8AttnCase> {};

TEST_P(CudaFp8KvAttention, MatchesCpuFp8Reference) {
  SKIP_WITHOUT_GPU();
  const Fp8AttnCase c = GetParam();
  std::mt19937 rng(c.Hq * 31 + c.D + int(c.seqs.size()));
  const int S = int(c.seqs.size()), bs = c.block_size, W = c.Hkv * c.D;
  int T = 0, max_q = 0, max_ctx = 0, max_blocks = 0, total = 0;
  for (auto& s : c.seqs) {
    T += s.qlen, max_q = std::max(max_q, s.qlen), max_ctx = std::max(max_ctx, s.ctx);
    max_blocks = std::max(max_blocks, (s.ctx + bs - 1) / bs);
    total += (s.ctx + bs - 1) / bs;
  }
  const int nb = total + 2;
  std::vector<int> perm(nb);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  // The cache as e4m3 codes of random K/V (what write_kv would have stored).
  std::vector<uint8_t> kc(size_t(nb) * bs * W), vc(kc.size());
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& b : kc) b = fp8::kv_store(nd(rng), c.k_scale);
  for (auto& b : vc) b = fp8::kv_store(nd(rng), c.v_scale);
  const auto q = randn(size_t(T) * c.Hq * c.D, rng);  // bf16-exact: both backends see the same q
  std::vector<int32_t> qs(S + 1, 0), ctx(S), table(size_t(S) * max_blocks, 0), pos;
  int next = 0;
  for (int s = 0; s < S; ++s) {
    qs[s + 1] = qs[s] + c.seqs[s].qlen;
    ctx[s] = c.seqs[s].ctx;
    for (int b = 0; b < (ctx[s] + bs - 1) / bs; ++b) table[size_t(s) * max_blocks + b] = perm[next++];
    for (int i = 0; i < c.seqs[s].qlen; ++i) pos.push_back(ctx[s] - c.seqs[s].qlen + i);
  }
  const float scale = 1.f / std::sqrt(float(c.D));
  auto meta_on = [&](bool dev) {
    auto up = [&](const std::vector<int32_t>& v, Shape sh) { return dev ? ints_to_device(v, sh) : host_i32(v, sh); };
    AttentionMeta m;
    m.num_seqs = S, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = max_blocks;
    m.max_query_len = max_q, m.max_context_len = max_ctx;
    m.positions = up(pos, {T});
    m.query_start = up(qs, {S + 1});
    m.context_lens = up(ctx, {S});
    m.block_tables = up(table, {S, max_blocks});
    return m;
  };
  // CPU reference over the same bytes.
  auto cpu = make_cpu_backend();
  const Shape cs{nb, bs, c.Hkv, c.D};
  KVCacheLayer hkv{fp8_host(kc, cs), fp8_host(vc, cs), c.k_scale, c.v_scale};
  const AttentionMeta hm = meta_on(false);
  Tensor hq = host_f32(q, {T, c.Hq * c.D});
  Tensor hout = cpu->alloc(DType::F32, {T, c.Hq * c.D});
  cpu->attention(AttentionArgs{&hq, &hkv, &hm, c.Hq, c.Hkv, c.D, scale, &hout});
  const auto ref = cpu->download_f32(hout);
  // CUDA, every kernel selection mode (FP8 caches must land on a kernel that reads them).
  KVCacheLayer dkv{gpu().upload(hkv.k), gpu().upload(hkv.v), c.k_scale, c.v_scale};
  const AttentionMeta dm = meta_on(true);
  Tensor dq = to_device(q, DType::BF16, {T, c.Hq * c.D});
  for (int mode = 0; mode <= 3; ++mode) {
    gpu().tuning.use_attention_wgmma = mode == 0;
    gpu().tuning.use_attention_prefill = mode <= 1;
    gpu().tuning.use_attention_tc = mode < 3;
    Tensor out = to_device(std::vector<float>(size_t(T) * c.Hq * c.D, NAN), DType::BF16, {T, c.Hq * c.D});
    gpu().attention(AttentionArgs{&dq, &dkv, &dm, c.Hq, c.Hkv, c.D, scale, &out});
    const double e = rel_err(gpu().download_f32(out), ref);
    EXPECT_LT(e, 1e-2) << "mode " << mode;
    if (mode == 0) std::printf("[fp8-kv] cuda attention vs cpu fp8 reference: %.3g\n", e);
  }
  gpu().tuning.use_attention_wgmma = gpu().tuning.use_attention_prefill = gpu().tuning.use_attention_tc = true;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaFp8KvAttention,
    ::testing::Values(Fp8AttnCase{48, 8, 128, 16, {{1, 1}}, 1.f, 1.f},                      // first decode token
                      Fp8AttnCase{48, 8, 128, 16, {{4000, 1}}, 0.05f, 0.02f},               // decode, split-KV
                      Fp8AttnCase{48, 8, 128, 16, {{3001, 1}, {17, 1}, {640, 1}}, 1.f, 1.f}, // decode batch
                      Fp8AttnCase{48, 8, 128, 16, {{300, 300}}, 0.5f, 2.f},                 // prefill (tc sizes)
                      Fp8AttnCase{48, 8, 128, 32, {{300, 37}, {5, 1}, {64, 64}}, 1.f, 1.f}, // chunked + decode
                      // Spec-decode verify: 1 + k query tokens per sequence over long contexts.
                      Fp8AttnCase{48, 8, 128, 16, {{1500, 4}, {901, 4}, {77, 4}}, 0.1f, 0.1f},
                      Fp8AttnCase{4, 2, 64, 16, {{200, 13}, {700, 1}}, 1.f, 1.f},           // head_dim 64
                      Fp8AttnCase{12, 1, 96, 8, {{50, 3}}, 1.f, 1.f},                       // G = 12
                      Fp8AttnCase{6, 2, 50, 16, {{90, 5}}, 1.f, 1.f}));                     // head_dim % 8 != 0

// Golden fixtures: RankExecutor on CUDA with --kv-cache-dtype fp8 (graphs on: FP8 decode
// inside captured graphs) vs the CPU executor with an FP8 cache, teacher-forced.
class CudaFp8KvGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFp8KvGolden, TeacherForcedMatchesCpuFp8) {
  SKIP_WITHOUT_GPU();
  const GoldenRef g = load_golden(GetParam());
  GenerateOptions go;
  go.prompt_ids = g.prompt;
  go.max_tokens = int(g.generated.size());
  // Calibrated per-layer scales (amax / 448), as an FP8 checkpoint ships them.
  const fs::path dir = fixture_with_scales(GetParam(), calibrated_scales(golden_fixture(GetParam()), go), false);
  ExecutorOptions eo;
  eo.model_dir = dir.string();
  eo.block_size = 16;
  eo.num_kv_blocks = 64;
  eo.kv_cache_dtype = "fp8";
  RankExecutor dev(make_cuda_backend(0), eo);
  auto host = make_cpu_executor(eo);
  ASSERT_EQ(dev.kv_cache()[0].k.dtype, DType::F8_E4M3);
  EXPECT_NE(dev.kv_cache()[0].k_scale, 1.f);
  const auto a = teacher_forced(dev, g), b = teacher_forced(*host, g);
  const double e = max_rel_err(a, b), e_hf = max_rel_err(a, g.logits);
  std::printf("[fp8-kv] %s: cuda fp8 KV vs cpu fp8 KV %.3g, vs HF (bf16-KV-free f32 reference) %.3g\n",
              GetParam().c_str(), e, e_hf);
  EXPECT_LE(e, 2e-2) << GetParam();  // test_cuda_golden's bf16 bound
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFp8KvGolden,
                         ::testing::Values("tiny_bf16", "tiny_fp8_b128", "tiny_fp8_partial"));

}  // namespace
}  // namespace moeserve::test
