// Device building blocks of the vectorised row kernels (one block of kThreads threads per
// bf16 row, 8 columns = one 16-byte vector per thread and step, kV steps): the (add +)
// RMSNorm row statistic (rms_norm_vec_kernel in k_elementwise.cu, norm_quant_kernel in
// k_norm_quant.cu) and the per-(row, 128 columns) FP8 e4m3 quantisation of 8 values
// (k_norm_quant.cu, the prefill attention epilogue). Columns: vector i of thread t covers
// [(i * kThreads + t) * 8, + 8).
#pragma once
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {

// Loads the norm weight's vectors (call before the PDL wait: it is a weight).
template <int kV, int kThreads>
__device__ __forceinline__ void norm_row_load_w(const bf16* w, int C, uint4 (&wv)[kV]) {
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    const int c = (i * kThreads + threadIdx.x) * 8;
    if (c < C) wv[i] = __ldg(reinterpret_cast<const uint4*>(w + c));
  }
}

// v = x (+ res, rounded to bf16 as stored; res != nullptr also gets v written back), every
// 16-byte load issued before the first use (one L2 round trip per row); returns r =
// rsqrt(mean(v^2) + eps) over the row's C columns (C % 8 == 0, C <= 8 * kThreads * kV).
// Columns past C read as 0. All threads must call it (block_sum). kWriteRes = false: the sum is
// only computed, not written back (kernels where every block normalises the same row and one
// block stores it).
template <int kV, int kThreads, bool kWriteRes = true>
__device__ __forceinline__ float norm_row_stats(const bf16* x, const bf16* res, int C, float eps, float (&v)[kV][8],
                                                float* scratch) {
  uint4 xv[kV], rv[kV] = {};
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    const int c = (i * kThreads + threadIdx.x) * 8;
    if (c < C) {
      xv[i] = *reinterpret_cast<const uint4*>(x + c);
      if (res) rv[i] = *reinterpret_cast<const uint4*>(res + c);
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    const int c = (i * kThreads + threadIdx.x) * 8;
    const uint32_t xw[4] = {xv[i].x, xv[i].y, xv[i].z, xv[i].w};
    const uint32_t rw[4] = {rv[i].x, rv[i].y, rv[i].z, rv[i].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float2 a = bf16x2_to_f2(xw[e]);
      if (res) {
        const float2 b = bf16x2_to_f2(rw[e]);
        a.x = bf2f(f2bf(a.x + b.x)), a.y = bf2f(f2bf(a.y + b.y));  // the stored (bf16) sum
      }
      v[i][2 * e] = c < C ? a.x : 0.f;
      v[i][2 * e + 1] = c < C ? a.y : 0.f;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[i][e] * v[i][e];
    if (kWriteRes && res && c < C) {
      uint32_t o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        __nv_bfloat162 h = __floats2bfloat162_rn(v[i][2 * e], v[i][2 * e + 1]);
        o[e] = *reinterpret_cast<uint32_t*>(&h);
      }
      // (kWriteRes callers pass their writable residual row)
      *reinterpret_cast<uint4*>(const_cast<bf16*>(res) + c) = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
  ss = block_sum(ss, scratch);
  return rsqrtf(ss / C + eps);
}

// The whole (add +) RMSNorm row prologue of a kernel with one block per row: the weight's
// vectors (before the PDL wait), then row `row`'s statistic (norm_row_stats; residual may be
// null). Returns r.
template <int kV, int kThreads>
__device__ __forceinline__ float norm_row_begin(const void* w, const void* x, void* residual, int64_t row, int C,
                                                float eps, uint4 (&wv)[kV], float (&v)[kV][8], float* scratch) {
  norm_row_load_w<kV, kThreads>(static_cast<const bf16*>(w), C, wv);
  pdl_enter();
  return norm_row_stats<kV, kThreads>(static_cast<const bf16*>(x) + row * C,
                                      residual ? static_cast<bf16*>(residual) + row * C : nullptr, C, eps, v, scratch);
}

// bf16(a + b) of 8 bf16 pairs (the residual update as the unfused add_rms_norm stores it).
__device__ __forceinline__ uint4 add_bf16x8(uint4 a, uint4 b) {
  const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
  uint32_t o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 x = bf16x2_to_f2(aw[e]), y = bf16x2_to_f2(bw[e]);
    __nv_bfloat162 v = __floats2bfloat162_rn(x.x + y.x, x.y + y.y);
    o[e] = *reinterpret_cast<uint32_t*>(&v);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// The normalised vector as stored: bf16(v * r * w), packed in pairs (low column first).
__device__ __forceinline__ void norm_row_pack8(const float (&v)[8], float r, uint4 wv, uint32_t (&o)[4]) {
  const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 wf = bf16x2_to_f2(ww[e]);
    __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * e] * r * wf.x, v[2 * e + 1] * r * wf.y);
    o[e] = *reinterpret_cast<uint32_t*>(&h);
  }
}

// Four values / sc -> four e4m3 codes (saturating, round to nearest), first value lowest byte.
__device__ __forceinline__ uint32_t fp8x4_scaled(float a, float b, float c, float d, float sc) {
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a / sc, b / sc), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c / sc, d / sc), __NV_SATFINITE, __NV_E4M3);
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// The group scale of quant_fp8_kernel: amax / 448 (1 for an all-zero group).
__device__ __forceinline__ float fp8_group_scale(float amax) { return amax > 0.f ? amax / kFp8Max : 1.f; }

// 8 consecutive columns of a 128-column group held by 16 consecutive lanes (half a warp):
// group amax (all 32 lanes call it; `amax` is this thread's partial), then, when `ok`, the
// 8 codes at q (8-byte aligned) and, by the group's first thread, the scale at *s.
__device__ __forceinline__ void quant_group16_store(const float (&o)[8], float amax, bool ok, uint8_t* q, float* s) {
#pragma unroll
  for (int m = 8; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  if (ok) {
    const float sc = fp8_group_scale(amax);
    *reinterpret_cast<uint2*>(q) =
        make_uint2(fp8x4_scaled(o[0], o[1], o[2], o[3], sc), fp8x4_scaled(o[4], o[5], o[6], o[7], sc));
    if ((threadIdx.x & 15) == 0) *s = sc;
  }
}

}  // namespace moeserve::cuda
