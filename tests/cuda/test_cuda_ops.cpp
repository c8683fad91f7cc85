// CUDA elementwise ops and linear layers vs fp32 host references.
// Error thresholds (||out - ref|| / ||ref||): bf16 outputs of elementwise ops 8e-3 (one bf16
// rounding is <= 2^-9 relative); f32 outputs 1e-5; linear 1e-2 (bf16 output rounding plus, on
// the tensor-core path, bf16 rounding of each dequantised weight).
#include <cmath>
#include <cstdlib>
#include <tuple>

#include "backend/cuda/common/kernels.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

// The run-time dispatch asks which compiled code the device runs (k_arch.cu). It can never be
// newer than the device, and MOESERVE_EXPECT_CODE_ARCH (set by the GPU check scripts, e.g. 901
// for the sm_90a build on an H200, 800 for an arch-80 build there, which JIT-compiles the
// compute_80 PTX) pins the exact value.
TEST(CudaOps, CodeArchMatchesBuild) {
  SKIP_WITHOUT_GPU();
  gpu();  // selects device 0
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  const int arch = cuda::code_arch();
  EXPECT_GE(arch, 800);
  EXPECT_LE(arch, major * 100 + minor * 10);
  if (cuda::code_has_sm90a()) EXPECT_EQ(arch, 900);
  if (const char* e = std::getenv("MOESERVE_EXPECT_CODE_ARCH"))
    EXPECT_EQ(arch + (cuda::code_has_sm90a() ? 1 : 0), std::atoi(e));
}

TEST(CudaOps, Embedding) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  const int V = 1000, H = 3072, T = 9;
  auto table = randn(size_t(V) * H, rng);
  std::vector<int32_t> ids(T);
  for (auto& i : ids) i = int(rng() % V);
  Tensor dt = to_device(table, DType::BF16, {V, H});
  Tensor di = ints_to_device(ids, {T});
  Tensor out = gpu().alloc(DType::BF16, {T, H});
  gpu().embedding(dt, di, out);
  auto got = gpu().download_f32(out);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) ASSERT_EQ(got[size_t(t) * H + h], table[size_t(ids[t]) * H + h]) << t << "," << h;
}

void ref_rms(const std::vector<float>& x, const std::vector<float>& w, int T, int C, float eps, std::vector<float>& y) {
  y.resize(x.size());
  for (int t = 0; t < T; ++t) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[size_t(t) * C + c]) * x[size_t(t) * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) y[size_t(t) * C + c] = float(x[size_t(t) * C + c] * r * w[c]);
  }
}

class CudaNorm : public ::testing::TestWithParam<std::tuple<int, int>> {};
TEST_P(CudaNorm, RmsNormAndAddRmsNorm) {
  SKIP_WITHOUT_GPU();
  auto [T, C] = GetParam();
  std::mt19937 rng(T * 1000 + C);
  auto x = randn(size_t(T) * C, rng), res = randn(size_t(T) * C, rng), w = randn(C, rng, 0.5f);
  Tensor dx = to_device(x, DType::BF16, {T, C}), dw = to_device(w, DType::BF16, {C});
  Tensor out = gpu().alloc(DType::BF16, {T, C});
  gpu().rms_norm(dx, dw, 1e-6f, out);
  std::vector<float> ref;
  ref_rms(x, w, T, C, 1e-6f, ref);
  EXPECT_LT(rel_err(gpu().download_f32(out), ref), 8e-3);

  Tensor dres = to_device(res, DType::BF16, {T, C});
  gpu().add_rms_norm(dres, dx, dw, 1e-6f, out);
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + res[i];
  EXPECT_LT(rel_err(gpu().download_f32(dres), sum), 8e-3);
  ref_rms(sum, w, T, C, 1e-6f, ref);
  EXPECT_LT(rel_err(gpu().download_f32(out), ref), 8e-3);

  // add and row_sum_squares
  Tensor dsum = gpu().alloc(DType::F32, {T, C});
  Tensor dres2 = to_device(res, DType::BF16, {T, C});
  gpu().add(dx, dres2, dsum);
  EXPECT_LT(rel_err(gpu().download_f32(dsum), sum), 1e-6);
  Tensor ss = gpu().alloc(DType::F32, {T});
  gpu().row_sum_squares(dx, ss);
  std::vector<float> ref_ss(T);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) ref_ss[t] += x[size_t(t) * C + c] * x[size_t(t) * C + c];
  EXPECT_LT(rel_err(gpu().download_f32(ss), ref_ss), 1e-5);
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaNorm,
                         ::testing::Values(std::make_tuple(1, 3072), std::make_tuple(7, 3072), std::make_tuple(3, 6144),
                                           std::make_tuple(5, 77), std::make_tuple(300, 1024),
                                           std::make_tuple(2, 8192), std::make_tuple(2, 8200), std::make_tuple(1, 40)));

// Host reference of full-width QK-norm + partial NeoX RoPE on one [T, W] tensor.
void ref_qk(std::vector<float>& x, const std::vector<float>& w, int T, int W, int D, int rot, float theta,
            const std::vector<int>& pos, const std::vector<float>* sumsq, int64_t full, float eps) {
  for (int t = 0; t < T; ++t) {
    float* r = &x[size_t(t) * W];
    double ss = 0;
    for (int c = 0; c < W; ++c) ss += double(r[c]) * r[c];
    if (sumsq) ss = (*sumsq)[t];
    const double f = 1.0 / std::sqrt(ss / double(full) + eps);
    for (int c = 0; c < W; ++c) r[c] = float(r[c] * f * w[c]);
    for (int h = 0; h < W / D; ++h)
      for (int i = 0; i < rot / 2; ++i) {
        const double inv = 1.0 / std::pow(double(theta), 2.0 * i / rot);
        const double ang = double(pos[t]) * inv;
        const float a = r[h * D + i], b = r[h * D + i + rot / 2];
        r[h * D + i] = float(a * std::cos(ang) - b * std::sin(ang));
        r[h * D + i + rot / 2] = float(b * std::cos(ang) + a * std::sin(ang));
      }
  }
}

struct QkCase {
  int T, Hq, Hkv, D, rot;
  bool given_sums;
};
class CudaQkNormRope : public ::testing::TestWithParam<QkCase> {};
TEST_P(CudaQkNormRope, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const QkCase c = GetParam();
  std::mt19937 rng(c.T * 7 + c.Hq);
  const int Wq = c.Hq * c.D, Wk = c.Hkv * c.D;
  auto q = randn(size_t(c.T) * Wq, rng), k = randn(size_t(c.T) * Wk, rng);
  auto wq = randn(Wq, rng, 0.5f), wk = randn(Wk, rng, 0.5f);
  std::vector<int> pos(c.T);
  for (auto& p : pos) p = int(rng() % 4096);
  Tensor dq = to_device(q, DType::BF16, {c.T, Wq}), dk = to_device(k, DType::BF16, {c.T, Wk});
  Tensor dwq = to_device(wq, DType::BF16, {Wq}), dwk = to_device(wk, DType::BF16, {Wk});
  std::vector<float> posf(pos.begin(), pos.end());
  Tensor dpos = to_device(posf, DType::I32, {c.T});
  QkNormRopeArgs a;
  a.q = &dq, a.k = &dk, a.q_norm_weight = &dwq, a.k_norm_weight = &dwk, a.positions = &dpos;
  a.rope = {c.D, c.rot, 5e6f};
  std::vector<float> qs(c.T), ks(c.T);
  Tensor dqs, dks;
  if (c.given_sums) {  // as under TP=2: the global sums cover twice the local width
    for (auto& v : qs) v = float(Wq) * 2.f * 1.3f;
    for (auto& v : ks) v = float(Wk) * 2.f * 0.7f;
    dqs = to_device(qs, DType::F32, {c.T});
    dks = to_device(ks, DType::F32, {c.T});
    a.q_sum_squares = &dqs, a.k_sum_squares = &dks;
    a.q_full_width = 2 * Wq, a.k_full_width = 2 * Wk;
  }
  gpu().qk_norm_rope(a);
  ref_qk(q, wq, c.T, Wq, c.D, c.rot, 5e6f, pos, c.given_sums ? &qs : nullptr, c.given_sums ? 2 * Wq : Wq, 1e-6f);
  ref_qk(k, wk, c.T, Wk, c.D, c.rot, 5e6f, pos, c.given_sums ? &ks : nullptr, c.given_sums ? 2 * Wk : Wk, 1e-6f);
  EXPECT_LT(rel_err(gpu().download_f32(dq), q), 8e-3);
  EXPECT_LT(rel_err(gpu().download_f32(dk), k), 8e-3);
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaQkNormRope,
                         ::testing::Values(QkCase{5, 48, 8, 128, 64, false}, QkCase{3, 48, 8, 128, 64, true},
                                           QkCase{4, 6, 2, 64, 64, false}, QkCase{2, 3, 1, 32, 16, false}));

struct LinCase {
  int T, N, K;
  bool fp8;
  int bo, bi;
};
class CudaLinear : public ::testing::TestWithParam<LinCase> {};
TEST_P(CudaLinear, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const LinCase c = GetParam();
  std::mt19937 rng(c.T * 31 + c.N + c.K);
  HostWeight w = make_weight(c.N, c.K, c.fp8, rng, c.bo, c.bi);
  auto x = randn(size_t(c.T) * c.K, rng);
  Tensor dx = to_device(x, DType::BF16, {c.T, c.K});
  auto ref = ref_linear(x, w.deq, c.T, c.N, c.K);
  // Default dispatch, then each path forced: GEMM only, GEMV only.
  const int saved_max = gpu().tuning.linear_gemv_max_tokens, saved_narrow = gpu().tuning.linear_gemv_narrow_n;
  const int saved_tc = gpu().tuning.linear_gemv_tc_max_tokens;
  // Modes 2 and 3 force the GEMV with and without the tensor-core FP8 kernel.
  for (int mode = 0; mode < 4; ++mode) {
    gpu().tuning.linear_gemv_max_tokens = mode == 0 ? saved_max : mode == 1 ? 0 : 1 << 20;
    gpu().tuning.linear_gemv_narrow_n = mode == 1 ? 0 : saved_narrow;
    gpu().tuning.linear_gemv_tc_max_tokens = mode == 1 ? 0 : saved_tc;
    gpu().tuning.use_gemv_tc = mode != 3;
    for (DType od : {DType::BF16, DType::F32}) {
      Tensor out = gpu().alloc(od, {c.T, c.N});
      gpu().linear(dx, w.dev, out);
      EXPECT_LT(rel_err(gpu().download_f32(out), ref), 1e-2) << "out " << dtype_name(od) << " mode " << mode;
    }
  }
  gpu().tuning.use_gemv_tc = true;
  gpu().tuning.linear_gemv_tc_max_tokens = saved_tc;
  gpu().tuning.linear_gemv_max_tokens = saved_max;
  gpu().tuning.linear_gemv_narrow_n = saved_narrow;
}
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaLinear,
    ::testing::Values(LinCase{1, 6144, 3072, true, 128, 128},   // q_proj, decode (GEMV)
                      LinCase{4, 1024, 3072, true, 128, 128},   // k_proj
                      LinCase{8, 3072, 6144, true, 128, 128},   // o_proj
                      LinCase{11, 144, 128, true, 128, 128},    // tensor-core GEMV: half row group, 1 chunk
                      LinCase{9, 1536, 3072, true, 128, 128},   // narrow N: GEMV path by default
                      LinCase{64, 3072, 6144, true, 128, 128},
                      LinCase{200, 384, 320, true, 128, 128},   // partial scale blocks
                      LinCase{5, 100, 80, true, 128, 128},      // N, K not multiples of the block
                      LinCase{3, 37, 72, true, 128, 128},       // K % 16 != 0: scalar GEMV path
                      LinCase{70, 37, 72, true, 128, 128},      // K % 16 != 0: scalar GEMM staging
                      LinCase{20, 130, 256, true, 64, 32},      // other block sizes
                      LinCase{1, 32000, 3072, false, 0, 0},     // bf16 lm_head-like, GEMV
                      LinCase{33, 1000, 3072, false, 0, 0}));   // bf16 (each case also runs both paths forced)

TEST(CudaOps, WriteKv) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int blocks = 6, bs = 16, Hkv = 8, D = 128, T = 5, W = Hkv * D;
  auto k = randn(size_t(T) * W, rng), v = randn(size_t(T) * W, rng);
  std::vector<int32_t> slots = {3, 17, -1, 95, 40};
  KVCacheLayer kv{gpu().alloc(DType::BF16, {blocks, bs, Hkv, D}), gpu().alloc(DType::BF16, {blocks, bs, Hkv, D})};
  AttentionMeta meta;
  meta.slot_mapping = ints_to_device(slots, {T});
  gpu().write_kv(to_device(k, DType::BF16, {T, W}), to_device(v, DType::BF16, {T, W}), kv, meta);
  auto kc = gpu().download_f32(kv.k), vc = gpu().download_f32(kv.v);
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int c = 0; c < W; ++c) {
      ASSERT_EQ(kc[size_t(slots[t]) * W + c], k[size_t(t) * W + c]);
      ASSERT_EQ(vc[size_t(slots[t]) * W + c], v[size_t(t) * W + c]);
    }
  }
  double other = 0;  // untouched slots stay zero (slot 2's token is padding)
  for (int s = 0; s < blocks * bs; ++s)
    if (s != 3 && s != 17 && s != 95 && s != 40)
      for (int c = 0; c < W; ++c) other += std::abs(kc[size_t(s) * W + c]);
  EXPECT_EQ(other, 0.0);
}

TEST(CudaOps, BadInputsThrow) {
  SKIP_WITHOUT_GPU();
  Tensor x = gpu().alloc(DType::BF16, {2, 64});
  Tensor w = gpu().alloc(DType::BF16, {63});
  Tensor out = gpu().alloc(DType::BF16, {2, 64});
  EXPECT_THROW(gpu().rms_norm(x, w, 1e-6f, out), Error);
  LinearWeight lw;
  lw.weight = gpu().alloc(DType::F8_E4M3, {16, 64});
  lw.scale_inv = gpu().alloc(DType::F32, {2, 2});  // wrong: should be [1, 1] for 128 blocks
  lw.block_out = lw.block_in = 128;
  Tensor y = gpu().alloc(DType::BF16, {2, 16});
  EXPECT_THROW(gpu().linear(x, lw, y), Error);
}

}  // namespace
}  // namespace moeserve::test
