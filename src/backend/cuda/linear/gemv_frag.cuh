// Fragment helpers of the FP8 "swap AB" tensor-core GEMVs (k_gemv_tc.cu, k_gemv_dense.cu,
// the persistent decode layer): FP8 weights are the A side of mma.sync
// m16n8k16 in f16 (e4m3 -> f16 is exact), the <= 8 activation rows the B side.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"

namespace moeserve::cuda {

// c[16 x 8] += a[16 x 16] . b[16 x 8], f16 inputs, f32 accumulate.
__device__ __forceinline__ void mma_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The low two e4m3 bytes of v16 -> an f16x2 word (exact).
__device__ __forceinline__ uint32_t fp8x2_to_h2(uint32_t v16) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v16 & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// bf16x2 word -> f16x2 word, clamped to the finite f16 range.
__device__ __forceinline__ uint32_t bf2_to_h2(uint32_t w) {
  float2 f = bf16x2_to_f2(w);
  f.x = fminf(fmaxf(f.x, -65504.f), 65504.f);
  f.y = fminf(fmaxf(f.y, -65504.f), 65504.f);
  __half2 h = __floats2half2_rn(f.x, f.y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Weight load (16 bytes, read-only path) with a cache hint (the GEMVs build HINT 1): 0 plain,
// 1 L1::no_allocate + L2::256B prefetch, 2 L2 evict_first policy.
template <int HINT>
__device__ __forceinline__ uint4 ld_w(const void* ptr) {
  uint4 v;
  if constexpr (HINT == 1) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
  } else if constexpr (HINT == 2) {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr), "l"(pol));
  } else
    v = __ldg(reinterpret_cast<const uint4*>(ptr));
  return v;
}

// One 128-column chunk of a warp's two 16-row groups (k_gemv_tc.cu's layout: lane g = lane / 4,
// q = lane % 4 holds 16 FP8 bytes of rows g and g + 8 at column q * 16 of each 64-column step,
// and the 16 activations of token g there).
struct Chunk {
  uint4 a[2][2][2];  // [matrix group][step][row g / g + 8]
  uint4 x[2][2];     // [step][two uint4 = 16 bf16]
  float sc[2];       // block scale of each group (loaded with the weights)
};

// part[m] = the chunk's unscaled 16 x 8 products of group m (C fragment of m16n8k16).
__device__ __forceinline__ void chunk_mma(const Chunk& ch, float (&part)[2][4]) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) part[m][e] = 0.f;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const uint32_t xw[8] = {ch.x[s][0].x, ch.x[s][0].y, ch.x[s][0].z, ch.x[s][0].w,
                            ch.x[s][1].x, ch.x[s][1].y, ch.x[s][1].z, ch.x[s][1].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t b0 = bf2_to_h2(xw[2 * i]), b1 = bf2_to_h2(xw[2 * i + 1]);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const uint4 lo = ch.a[m][s][0], hi = ch.a[m][s][1];
        const uint32_t wl = i == 0 ? lo.x : i == 1 ? lo.y : i == 2 ? lo.z : lo.w;
        const uint32_t wh = i == 0 ? hi.x : i == 1 ? hi.y : i == 2 ? hi.z : hi.w;
        const uint32_t a[4] = {fp8x2_to_h2(wl), fp8x2_to_h2(wh), fp8x2_to_h2(wl >> 16), fp8x2_to_h2(wh >> 16)};
        mma_f16(part[m], a, b0, b1);
      }
    }
  }
}

// The matrix a GEMV block works on: p's own, or with linear_multi segments (p.nseg > 0) the
// segment that owns block bx (seg_block in the caller's block units); bx becomes relative to it.
struct GemvMatrix {
  const void* w;
  const float* s;
  void* out;
  int N, s_cols, ldo;
};
__device__ __forceinline__ GemvMatrix gemv_matrix(const LinParams& p, int& bx) {
  if (p.nseg <= 0) return {p.w, p.s, p.out, p.N, p.s_cols, p.ldo};
  int i = 0;
#pragma unroll
  for (int j = 1; j < LinParams::kMaxSegs; ++j)
    if (j < p.nseg && bx >= p.seg_block[j]) i = j;
  const LinParams::Seg& sg = p.seg[i];
  bx -= p.seg_block[i];
  return {sg.w, sg.s, sg.out, sg.N, sg.s_cols, sg.ldo};
}

}  // namespace moeserve::cuda
