// Shared device helpers for the CUDA backend: error checks, bf16/fp8 conversions,
// warp reductions. Included by every .cu file of backend/cuda.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/cuda_check.h"


namespace moeserve::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float bf2f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 f2bf(float x) { return __float2bfloat16_rn(x); }

// Two fp8 e4m3 bytes -> two floats (exact). Hardware cvt on sm_89+, emulated before.
__device__ __forceinline__ float2 fp8x2_to_f2(uint16_t v) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  __half2 hh = *reinterpret_cast<__half2*>(&h);
  return __half22float2(hh);
}

// Unpacks a 32-bit word of 2 bf16 into floats (low half first = lower address).
__device__ __forceinline__ float2 bf16x2_to_f2(uint32_t v) {
  float2 r;
  r.x = __uint_as_float(v << 16);
  r.y = __uint_as_float(v & 0xffff0000u);
  return r;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (<= 1024). `scratch` holds 32 floats.
// Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(r);
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// Fused add + RMSNorm of one bf16 row of K (K % 8 == 0, K <= 8 * kMaxV * blockDim.x) by the
// whole block into shared memory: v = bf16(res + add) (the stored residual), out = bf16(v * r
// * w), r = rsqrt(mean(v^2) + eps). Every 16-byte load is issued before the first use (one
// L2 round trip, not one per element). All threads must call it.
template <int kMaxV>
__device__ __forceinline__ void add_norm_row_to_smem(const __nv_bfloat16* res, const __nv_bfloat16* add,
                                                     const __nv_bfloat16* w, int K, float eps,
                                                     __nv_bfloat16* out_smem, float* scratch) {
  uint4 ra[kMaxV], xa[kMaxV];
#pragma unroll
  for (int i = 0; i < kMaxV; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * 8;
    if (c < K) {
      ra[i] = *reinterpret_cast<const uint4*>(res + c);
      xa[i] = *reinterpret_cast<const uint4*>(add + c);
    }
  }
  float v[kMaxV][8];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxV; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * 8;
    const uint32_t rw[4] = {ra[i].x, ra[i].y, ra[i].z, ra[i].w}, xw[4] = {xa[i].x, xa[i].y, xa[i].z, xa[i].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = bf16x2_to_f2(rw[e]), b = bf16x2_to_f2(xw[e]);
      v[i][2 * e] = c < K ? __bfloat162float(__float2bfloat16_rn(a.x + b.x)) : 0.f;
      v[i][2 * e + 1] = c < K ? __bfloat162float(__float2bfloat16_rn(a.y + b.y)) : 0.f;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[i][e] * v[i][e];
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / K + eps);
#pragma unroll
  for (int i = 0; i < kMaxV; ++i) {
    const int c = (i * blockDim.x + threadIdx.x) * 8;
    if (c < K) {
      const uint4 wv = *reinterpret_cast<const uint4*>(w + c);
      const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w};
      uint32_t o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 wf = bf16x2_to_f2(ww[e]);
        __nv_bfloat162 h = __floats2bfloat162_rn(v[i][2 * e] * r * wf.x, v[i][2 * e + 1] * r * wf.y);
        o[e] = *reinterpret_cast<uint32_t*>(&h);
      }
      *reinterpret_cast<uint4*>(out_smem + c) = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}


}  // namespace moeserve::cuda
