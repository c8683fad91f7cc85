// W4A16 routed experts on CUDA (k_moe_int4.cu) against the CPU backend's moe_experts on the
// same INT4 weights dequantised to F32 (as model/int4.cpp loads them for the CPU reference):
// decode tiles (T = 1, 8, 64), the prefill grouped GEMM (T = 300, 2048), group 32 (and 64),
// odd expert counts, expert parallelism, widths that are not multiples of the kernels' tiles
// (H % 128 != 0: a partial last chunk; I % 64 != 0: partial row blocks), and a CUDA-graph replay.
//
// Bound: rel L2 error <= 1e-2. The GPU rounds the SiLU * up intermediate and the output to bf16
// (2^-9 relative each, as the FP8 path and the reference engines), the CPU keeps f32; weights
// (q * scale in f16) and activations (bf16 -> f16) are exact for these magnitudes, so the rest
// is f32 summation order. Measured on one H200: 0.0022-0.0024 at every case (docs/bench/log.md,
// "INT4 (W4A16) routed experts on CUDA").
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/moe/kernels_int4.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

// One INT4 weight [N, K]: q uniform in [-8, 7], bf16 scales around 1 / (2.3 sqrt(K)) per
// (row, group); host F32 dequantised copy for the CPU, packed I32 + BF16 scales on the GPU.
struct Int4Weight {
  LinearWeight host, dev;
};
Int4Weight make_int4(int N, int K, int group, std::mt19937& rng) {
  std::uniform_int_distribution<int> uq(-8, 7);
  std::uniform_real_distribution<float> us(0.5f, 1.5f);
  Tensor packed = Tensor::host(DType::I32, {N, K / 8});
  Tensor scale = Tensor::host(DType::BF16, {N, K / group});
  Tensor deq = Tensor::host(DType::F32, {N, K});
  const float s0 = 1.f / (2.3f * std::sqrt(float(K)));
  for (int n = 0; n < N; ++n) {
    for (int gi = 0; gi < K / group; ++gi) scale.ptr<uint16_t>()[size_t(n) * (K / group) + gi] = f32_to_bf16(s0 * us(rng));
    for (int j = 0; j < K / 8; ++j) {
      uint32_t w = 0;
      for (int i = 0; i < 8; ++i) {
        const int q = uq(rng), k = 8 * j + i;
        w |= uint32_t(q + 8) << (4 * i);
        deq.ptr<float>()[size_t(n) * K + k] =
            float(q) * bf16_to_f32(scale.ptr<uint16_t>()[size_t(n) * (K / group) + k / group]);
      }
      packed.ptr<int32_t>()[size_t(n) * (K / 8) + j] = int32_t(w);
    }
  }
  Int4Weight w;
  w.host.weight = deq;
  w.dev.weight = gpu().upload(packed);
  w.dev.scale_inv = gpu().upload(scale);
  w.dev.block_out = 1, w.dev.block_in = group;
  return w;
}

struct Int4Case {
  int T, H, I, E_local, E, K, first_local, group;
  int pool = 0;  // > 0: local expert e uses weight set e % pool (real widths, quick to build)
};
class CudaMoeInt4 : public ::testing::TestWithParam<Int4Case> {};

TEST_P(CudaMoeInt4, MatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Int4Case c = GetParam();
  std::mt19937 rng(7 + c.T + c.H + c.E_local * 5 + c.group);
  auto cpu = make_cpu_backend();
  MoeWeights dev, host;
  for (MoeWeights* m : {&dev, &host}) m->num_experts = c.E, m->top_k = c.K, m->first_local_expert = c.first_local;
  const int nsets = c.pool > 0 ? c.pool : c.E_local;
  std::vector<Int4Weight> w1, w3, w2;
  for (int e = 0; e < nsets; ++e) {
    w1.push_back(make_int4(c.I, c.H, c.group, rng));
    w3.push_back(make_int4(c.I, c.H, c.group, rng));
    w2.push_back(make_int4(c.H, c.I, c.group, rng));
  }
  for (int e = 0; e < c.E_local; ++e) {
    const int s = e % nsets;
    dev.experts.push_back({w1[s].dev, w3[s].dev, w2[s].dev});
    host.experts.push_back({w1[s].host, w3[s].host, w2[s].host});
  }
  EXPECT_TRUE(dev.experts[0].w1.int4() && dev.experts[0].w1.in_features() == c.H);
  auto x = randn(size_t(c.T) * c.H, rng);
  // Routing: distinct random global experts per token (skewed towards low ids, so some experts
  // serve many pairs and the prefill tiles fill), random positive weights.
  std::vector<int32_t> ids(size_t(c.T) * c.K);
  std::vector<float> wts(ids.size());
  std::uniform_real_distribution<float> uw(0.05f, 1.f);
  for (int t = 0; t < c.T; ++t) {
    std::vector<int> all(c.E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    if (t % 3 == 0) std::sort(all.begin(), all.begin() + std::min(c.E, 2 * c.K));
    for (int j = 0; j < c.K; ++j) ids[size_t(t) * c.K + j] = all[j], wts[size_t(t) * c.K + j] = uw(rng);
  }
  Tensor ref = Tensor::host(DType::F32, {c.T, c.H});
  cpu->moe_experts(host_f32(x, {c.T, c.H}), host, MoeRouting{host_i32(ids, {c.T, c.K}), host_f32(wts, {c.T, c.K})},
                   ref);
  std::vector<float> want(ref.ptr<float>(), ref.ptr<float>() + ref.numel());

  MoeRouting r{ints_to_device(ids, {c.T, c.K}), to_device(wts, DType::F32, {c.T, c.K})};
  Tensor dx = to_device(x, DType::BF16, {c.T, c.H});
  Tensor out = to_device(std::vector<float>(size_t(c.T) * c.H, NAN), DType::BF16, {c.T, c.H});
  gpu().moe_experts(dx, dev, r, out);
  const auto got = gpu().download_f32(out);
  const double err = rel_err(got, want);
  std::printf("[int4 moe] T=%d H=%d I=%d E=%d/%d top-%d group %d (%s): rel err %.3g\n", c.T, c.H, c.I, c.E_local, c.E,
              c.K, c.group, c.T <= gpu().tuning.moe_gemv_max_tokens ? "GEMV tiles" : "GEMM tiles", err);
  EXPECT_LT(err, 1e-2);
  // The other path at the same T (GEMM tiles at decode sizes, GEMV tiles at prefill sizes).
  const int saved = gpu().tuning.moe_gemv_max_tokens;
  gpu().tuning.moe_gemv_max_tokens = c.T <= saved ? 0 : 1 << 20;
  Tensor out2 = to_device(std::vector<float>(size_t(c.T) * c.H, NAN), DType::BF16, {c.T, c.H});
  gpu().moe_experts(dx, dev, r, out2);
  gpu().tuning.moe_gemv_max_tokens = saved;
  const double err2 = rel_err(gpu().download_f32(out2), want);
  std::printf("[int4 moe]   other tiles: rel err %.3g\n", err2);
  EXPECT_LT(err2, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaMoeInt4,
    ::testing::Values(Int4Case{1, 7168, 2048, 16, 16, 8, 0, 32, 2},   // Kimi-K2.5 expert widths, decode
                      Int4Case{8, 7168, 2048, 16, 16, 8, 0, 32, 2},
                      Int4Case{64, 1024, 512, 33, 33, 8, 0, 32},      // odd expert count
                      Int4Case{1, 352, 96, 7, 7, 2, 0, 32},           // H % 128 != 0, I % 64 != 0
                      Int4Case{8, 352, 160, 13, 13, 3, 0, 32},
                      Int4Case{64, 256, 128, 5, 13, 4, 6, 32},        // EP: local experts 6..10 of 13
                      Int4Case{300, 512, 160, 7, 7, 3, 0, 32},        // prefill: GEMM tiles
                      Int4Case{2048, 1024, 352, 9, 9, 4, 0, 32},
                      Int4Case{300, 384, 192, 6, 11, 2, 3, 64},       // group 64, EP
                      Int4Case{8, 128, 128, 8, 8, 2, 0, 32}),         // dsv3_tiny_int4's shapes
    [](const auto& info) {
      const Int4Case& c = info.param;
      return "T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_I" + std::to_string(c.I) + "_E" +
             std::to_string(c.E_local) + "of" + std::to_string(c.E) + "_k" + std::to_string(c.K) + "_g" +
             std::to_string(c.group);
    });

// Capture-safe: a graph of moe_experts at decode and prefill sizes replays to the eager result.
TEST(CudaMoeInt4Graph, ReplaysEager) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  const int H = 512, I = 192, E = 9, K = 4;
  MoeWeights moe;
  moe.num_experts = E, moe.top_k = K;
  for (int e = 0; e < E; ++e)
    moe.experts.push_back({make_int4(I, H, 32, rng).dev, make_int4(I, H, 32, rng).dev, make_int4(H, I, 32, rng).dev});
  for (int T : {8, 300}) {
    std::vector<int32_t> ids(size_t(T) * K);
    std::vector<float> wts(ids.size(), 0.25f);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < K; ++j) ids[size_t(t) * K + j] = (t + 2 * j) % E;
    MoeRouting r{ints_to_device(ids, {T, K}), to_device(wts, DType::F32, {T, K})};
    Tensor x = to_device(randn(size_t(T) * H, rng), DType::BF16, {T, H});
    Tensor out = to_device(std::vector<float>(size_t(T) * H, 0.f), DType::BF16, {T, H});
    gpu().moe_experts(x, moe, r, out);  // eager: sizes the workspaces, builds the expert table
    const auto eager = gpu().download_f32(out);
    gpu().begin_capture();
    gpu().moe_experts(x, moe, r, out);
    CudaGraph g = gpu().end_capture();
    gpu().fill_random(out, 5, 1.f);
    g.replay(gpu().stream());
    EXPECT_EQ(gpu().download_f32(out), eager) << "T=" << T;
  }
}

// Speed at Kimi-K2.5's shapes (384 experts of 7168 x 2048, group 32; device-random words and
// scales: the values do not matter for the time), decode batches 1 / 8 / 64 with uniform random
// routing, each op a CUDA graph replay. Four routings alternate between the timed calls, so the L2 (50 MB) holds little of a
// call's experts. Printed: the op's time and its bandwidth over the distinct experts' bytes.
TEST(CudaMoeInt4Timing, KimiDecodeBatches) {
  SKIP_WITHOUT_GPU();
  const int H = 7168, I = 2048, E = 384, K = 8, group = 32;
  MoeWeights moe;
  moe.num_experts = E, moe.top_k = K;
  uint64_t seed = 1;
  auto rnd = [&](int N, int Kd) {
    LinearWeight w;
    w.weight = gpu().alloc(DType::F32, {N, Kd / 8});
    gpu().fill_random(w.weight, seed++, 1.f);
    w.weight.dtype = DType::I32;  // random bits as packed words
    w.scale_inv = gpu().alloc(DType::BF16, {N, Kd / group});
    gpu().fill_random(w.scale_inv, seed++, 1e-3f);
    w.block_out = 1, w.block_in = group;
    return w;
  };
  for (int e = 0; e < E; ++e) moe.experts.push_back({rnd(I, H), rnd(I, H), rnd(H, I)});
  const double expert_bytes = 3.0 * I * H * (0.5 + 2.0 / group);
  std::mt19937 rng(5);
  for (int T : {1, 8, 64}) {
    std::vector<MoeRouting> rs;
    double distinct = 0;
    for (int v = 0; v < 4; ++v) {
      std::vector<int32_t> ids(size_t(T) * K);
      std::vector<char> used(E, 0);
      for (int t = 0; t < T; ++t) {
        std::vector<int> all(E);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < K; ++j) ids[size_t(t) * K + j] = all[j], used[size_t(all[j])] = 1;
      }
      distinct += std::accumulate(used.begin(), used.end(), 0) / 4.0;
      rs.push_back(MoeRouting{ints_to_device(ids, {T, K}), to_device(std::vector<float>(ids.size(), 0.125f), DType::F32, {T, K})});
    }
    Tensor x = to_device(randn(size_t(T) * H, rng), DType::BF16, {T, H});
    Tensor out = gpu().alloc(DType::BF16, {T, H});
    // Graph replays (as in decode steps: no host launch gaps inside the op).
    std::vector<CudaGraph> graphs;
    for (auto& r : rs) {
      gpu().moe_experts(x, moe, r, out);  // eager first: workspaces, expert table
      gpu().begin_capture();
      gpu().moe_experts(x, moe, r, out);
      graphs.push_back(gpu().end_capture());
    }
    int v = 0;
    const double ms = event_median_ms([&] { graphs[size_t(v++ % 4)].replay(gpu().stream()); }, 21);
    const double gb = distinct * expert_bytes / 1e9;
    std::printf("[int4 moe timing] T=%d: %.4f ms, %.1f distinct experts (%.3f GB): %.0f GB/s\n", T, ms, distinct, gb,
                gb / ms * 1e3);
  }
}

}  // namespace
}  // namespace moeserve::test
