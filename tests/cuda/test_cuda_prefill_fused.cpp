// Prefill fusion into the FP8 activation format (cuda_prefill.cpp, cuda_backend.h
// prefill_moe_norm_quant) against the unfused CUDA path and the CPU op (the attention's FP8
// epilogue, prefill_attn_q8, and its tests CudaPrefillFusedAttn.* and
// CudaPrefillFused.AttentionOprojSameAsUnfused left the tree with that opt-in path:
// docs/bench/cuda_switch_inventory.md):
// - add_rms_norm_route + moe_experts, fused vs unfused: residual, x, routing and the expert
//   output bit-identical; the output within 2 x (2^-4 + 1e-2) of the CPU op (two FP8
//   quantisations, test_cuda_prefill.cpp's bound).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/common/kernels_prefill.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

constexpr double kQuantBound = 0.0625 + 1e-2;

std::vector<uint16_t> download_u16(const Tensor& t) {
  std::vector<uint16_t> h(t.numel());
  gpu().synchronize();
  cudaMemcpy(h.data(), t.data, h.size() * 2, cudaMemcpyDeviceToHost);
  return h;
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
    be.tuning.prefill_moe_norm_quant = fused == 1;
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
  be.tuning.prefill_moe_norm_quant = true;
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
  ASSERT_GT(T, be.tuning.moe_gemv_max_tokens);
  EXPECT_LT(e, 2 * kQuantBound);
}


// Timings at M2.5 shapes and 8,192 tokens, fused vs unfused (run with MOESERVE_BENCH=1;
// otherwise skipped): the post-attention norm + router + experts with the experts' quantisations as before / on the
// 16-byte-load kernel / fused into the norm / both. Four rounds, the configurations in turn,
// in reverse order on odd rounds (the clock drifts within a round).
TEST(CudaPrefillFusedBench, M25Ops8k) {
  SKIP_WITHOUT_GPU();
  if (!std::getenv("MOESERVE_BENCH")) GTEST_SKIP() << "set MOESERVE_BENCH=1";
  CudaBackend& b = gpu();
  const int T = 8192, H = 3072, E = 256, K = 8, I = 1536;
  auto pr = [](const char* what, const std::vector<std::pair<const char*, double>>& v) {
    std::printf("[fused bench] %s:", what);
    for (auto& [n, ms] : v) std::printf(" %s %.4f ms |", n, ms);
    std::printf("\n");
  };
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
    const bool saved_nq = b.tuning.prefill_moe_norm_quant, saved_vec = b.tuning.prefill_moe_quant_vec;
    for (int round = 0; round < 4; ++round) {
      std::vector<std::pair<const char*, double>> v;
      for (int k = 0; k < 4; ++k) {  // before, quantisations on the vec kernel, x's fused into the norm, both
        const int mode = round % 2 ? 3 - k : k;
        b.tuning.prefill_moe_quant_vec = mode & 1;
        b.tuning.prefill_moe_norm_quant = mode & 2;
        const char* n[4] = {"before", "quant_vec", "norm fused", "both"};
        v.push_back({n[mode], event_median_ms([&] {
                       b.add_rms_norm_route(res, add, nw, 1e-6f, x, moe, r);
                       b.moe_experts(x, moe, r, y);
                     })});
      }
      pr("norm + route + experts", v);
    }
    b.tuning.prefill_moe_norm_quant = saved_nq, b.tuning.prefill_moe_quant_vec = saved_vec;
  }
}

}  // namespace
}  // namespace moeserve::test
