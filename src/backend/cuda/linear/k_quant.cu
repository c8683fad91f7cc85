// Dynamic FP8 quantisation of bf16 activations, one f32 scale per (row, 128 columns): the
// activation half of the DeepSeek-style block-FP8 GEMM (weights carry 128x128 block scales).
// One warp per group: each lane loads 4 bf16 (8 bytes), the warp max gives the scale, each
// lane writes 4 e4m3 bytes. Error: e4m3 keeps 3 mantissa bits, so each quantised element is
// within 2^-4 of its value relatively (round to nearest), subnormals (|x| < 2^-6 s) within
// 2^-10 s absolutely; see src/backend/cuda/README.md ("Prefill numerics") for the GEMM bound.
#include <cstdlib>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/linear/kernels_fp8.h"

namespace moeserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// KG groups per warp, all KG loads issued before the first reduction (meant for more loads
// in flight; KG = 4 measured no faster than KG = 1, the default). Each group's arithmetic
// is unchanged.
template <int KG>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) quant_fp8_kernel(QuantParams p) {
  const int groups = p.K / kQuantGroup;
  const int64_t total = int64_t(p.R) * groups;
  const int64_t gid0 = (int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * KG;
  if (gid0 >= total) return;
  const int lane = threadIdx.x & 31;
  uint2 raw[KG];
#pragma unroll
  for (int u = 0; u < KG; ++u) {
    const int64_t gid = gid0 + u;
    if (gid < total) {
      const int r = int(gid / groups), g = int(gid % groups);
      raw[u] = *reinterpret_cast<const uint2*>(static_cast<const bf16*>(p.x) + int64_t(r) * p.ldx + g * kQuantGroup +
                                               lane * 4);
    }
  }
#pragma unroll
  for (int u = 0; u < KG; ++u) {
    const int64_t gid = gid0 + u;
    if (gid >= total) break;  // uniform across the warp
    const int r = int(gid / groups), g = int(gid % groups);
    const float2 a = bf16x2_to_f2(raw[u].x), b = bf16x2_to_f2(raw[u].y);
    float amax = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y)));
    amax = warp_max(amax);
    // Same arithmetic as the host emulation in the tests: s = amax / 448, q = rn(x / s).
    const float sc = amax > 0.f ? amax / kFp8Max : 1.f;
    const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a.x / sc, a.y / sc), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(b.x / sc, b.y / sc), __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint32_t*>(p.q + int64_t(r) * p.K + g * kQuantGroup + lane * 4) = uint32_t(lo) | (uint32_t(hi) << 16);
    if (lane == 0) p.s[int64_t(r) * p.s_row + int64_t(g) * p.s_grp] = sc;
  }
}

__global__ void bf16_to_f32_kernel(const bf16* in, float* out, int64_t n) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i + 4 <= n) {
    const uint2 raw = *reinterpret_cast<const uint2*>(in + i);
    const float2 a = bf16x2_to_f2(raw.x), b = bf16x2_to_f2(raw.y);
    *reinterpret_cast<float4*>(out + i) = make_float4(a.x, a.y, b.x, b.y);
  } else {
    for (int64_t j = i; j < n; ++j) out[j] = bf2f(in[j]);
  }
}

}  // namespace


void launch_quant_fp8(const QuantParams& p, cudaStream_t s) {
  CU_REQUIRE(p.K % kQuantGroup == 0 && p.ldx % 4 == 0, "quant_fp8: K must be a multiple of 128");
  if (p.R == 0) return;
  const int64_t groups = int64_t(p.R) * (p.K / kQuantGroup);
  // One group per warp (4 groups per warp, the former QUANT_BATCH switch, measured no
  // faster: 0.173 vs 0.166 ms on the experts' intermediate).
  quant_fp8_kernel<1><<<unsigned((groups + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, 0, s>>>(p);
  CUDA_CHECK_LAUNCH();
}

void launch_bf16_to_f32(const void* in, float* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  CU_REQUIRE(reinterpret_cast<uintptr_t>(in) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
             "bf16_to_f32: misaligned buffers");
  const int64_t threads = (n + 3) / 4;
  bf16_to_f32_kernel<<<unsigned((threads + 255) / 256), 256, 0, s>>>(static_cast<const bf16*>(in), out, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
