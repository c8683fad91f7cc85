// Device-side building blocks of the persistent decode layer (k_decode_layer.cu, its only
// includer): shared-memory layout, the GEMV item machinery (FP8 16-row items, mma.sync), the
// grid barrier, staging helpers, the workspace layout and the layer table. Kept apart from the
// kernel body so each file stays readable; everything here is internal to that translation unit.
#pragma once
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/decode_layer.h"
#include "backend/cuda/linear/gemv_frag.cuh"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32, kD = 128, kMaxG = 8, kMaxSplits = 16;
constexpr int kCpi = 4;             // 128-column chunks per item (at most)
constexpr int kSlots = 32;          // 16-row accumulators per block and phase
constexpr int kMaxX = 6144;         // f16 GEMV input entries in shared memory
constexpr int kMaxH = 3072, kMaxE = 256, kMaxK = 8;
constexpr int kGateV = kMaxH / 128;  // float4 per lane of a gate row
constexpr int kMaxBtab = 1024;       // staged block-table entries per attention unit
constexpr int kTileK = kD + 8;       // K tile row (bf16): 272 bytes, conflict-free 16-byte reads

struct Smem {
  __align__(16) __half xh[kMaxX];
  float gacc[kSlots * 16];
  float inv_freq[kD / 2];
  float scratch[32];
  union {
    struct {
      float qraw[kMaxG][kD];  // this kv head's q rows, k and v rows (f32 sums) staged from L2
      float kraw[kD], vraw[kD];
      float mls[kMaxSplits * kMaxG * 2];  // merge: the kv head's (max, sum) per split and row
      __align__(16) bf16 qnw[kMaxG * kD];  // the kv head's q/k norm weights
      __align__(16) bf16 knw[kD];
      int btab[kMaxBtab];  // block table entries of the unit's key range
      __align__(16) bf16 kt[kWarps][32][kTileK];  // per warp: K rows of its tile (padded rows)
      __align__(16) bf16 vt[kWarps][32][kD];      // and V rows
      float qs[kMaxG][kD];
      float knew[kD], vnew[kD];
      float po[kWarps][kMaxG][kD];
      float pml[kWarps][kMaxG][2];
    } at;
    float xf[kMaxH];
  } u;
  __align__(16) float score[kMaxE];
  __align__(16) float choice[kMaxE];
  int sel[32];
  int ids[kMaxK];
  float rw[kMaxK];
  int flag;
  ExpertPtrs ep[kMaxK];  // the chosen experts' pointers
  unsigned long long ts[16];
  __align__(8) DecodeLayerParams prm;  // the current layer's
};

__device__ __forceinline__ float bfr(float v) { return bf2f(f2bf(v)); }

__device__ __forceinline__ __half to_h(float v) { return __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f)); }
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
// Phase timestamps of block 0 (DecodeLayerParams::timing; diagnostics only).
#define STAMP(i) \
  if (p.timing && blockIdx.x == 0 && threadIdx.x == 0) S.ts[i] = globaltimer()

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Generation-counting grid barrier: bar[0] arrivals (back to 0 when the last block arrives),
// bar[1] generation. Both return to a consistent state after every barrier, so a later launch
// (a graph replay) starts from whatever generation the last one left.
// Release/acquire atomics (no full fences), as CUTLASS's grid barrier: the block's writes are
// ordered before thread 0's release by bar.sync; the release/acquire pair publishes them.
// strong (DecodeLayerParams::fence_barrier): full fences around plain atomics instead.
__device__ __forceinline__ void grid_barrier(unsigned* bar, bool strong) {
  __syncthreads();
  if (threadIdx.x == 0 && strong) {
    const unsigned gen = ld_acquire(bar + 1);
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (ld_acquire(bar + 1) == gen) {
      }
    }
    __threadfence();
  } else if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire(bar + 1);
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");
    if (old == gridDim.x - 1) {
      asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar) : "memory");
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar + 1) : "memory");
    } else {
      while (ld_acquire(bar + 1) == gen) {
      }
    }
  }
  __syncthreads();
}

// One GEMV item: 16 weight rows (w = row 0 of the group, row stride K bytes) x kCpi chunks from
// chunk c0; s = the group's row of block scales; x read from xh + xoff; slot = shared
// accumulator; wf = factor on the result (routing weight).
struct Item {
  const uint8_t* w;
  const float* s;
  int K, c0, nch, xoff, slot;
  float wf;
};
// Chunks per item for a row of K columns (K % 128 == 0): 4 where K / 128 allows, else 3, 2, 1.
__host__ __device__ inline int item_chunks(int K) {
  const int c = K / 128;
  return c % 4 == 0 ? 4 : c % 3 == 0 ? 3 : c % 2 == 0 ? 2 : 1;
}
// Items per 16-row group.
__host__ __device__ inline int items_per_row(int K) { return K / 128 / item_chunks(K); }
struct WBuf {
  uint4 v[kCpi][2][2];  // [chunk][64-column step][row g / g + 8]
  float sc[kCpi];       // block scale of each chunk (loaded with the weights: no dependent load later)
};

__device__ __forceinline__ void load_item(const Item& it, WBuf& b) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int c = 0; c < kCpi; ++c)
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (c < it.nch) b.v[c][s][h] = ld_w<1>(it.w + int64_t(g + 8 * h) * it.K + (it.c0 + c) * 128 + s * 64 + q * 16);
#pragma unroll
  for (int c = 0; c < kCpi; ++c)
    if (c < it.nch) b.sc[c] = __ldg(it.s + it.c0 + c);
}

__device__ __forceinline__ void compute_item(const Item& it, const WBuf& b, const __half* xh, float* gacc) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int c = 0; c < kCpi; ++c) {
    if (c >= it.nch) break;
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint4* xp = reinterpret_cast<const uint4*>(xh + it.xoff + (it.c0 + c) * 128 + s * 64 + q * 16);
      const uint4 x0 = xp[0], x1 = xp[1];
      const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const uint4 lo = b.v[c][s][0], hi = b.v[c][s][1];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t wl = i == 0 ? lo.x : i == 1 ? lo.y : i == 2 ? lo.z : lo.w;
        const uint32_t wh = i == 0 ? hi.x : i == 1 ? hi.y : i == 2 ? hi.z : hi.w;
        const uint32_t a[4] = {fp8x2_to_h2(wl), fp8x2_to_h2(wh), fp8x2_to_h2(wl >> 16), fp8x2_to_h2(wh >> 16)};
        mma_f16(part, a, xw[2 * i], xw[2 * i + 1]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = fmaf(part[e], b.sc[c], acc[e]);
  }
  // Every column of the mma is the same token: lanes with q == 0 hold rows g (acc[0]) and g + 8 (acc[2]).
  if (q == 0) {
    atomicAdd(&gacc[it.slot * 16 + g], acc[0] * it.wf);
    atomicAdd(&gacc[it.slot * 16 + g + 8], acc[2] * it.wf);
  }
}

// Fused add + RMSNorm of one row by the block: v = bf16(a + b) (b bf16, or f32 rounded to bf16
// first), x = bf16(v * rsqrt(mean(v^2) + eps) * w), written as f16 to out_h or as f32 to
// out_f. Every load (a, b and the norm weight w) is issued before the first use.
// tmp: n floats of shared memory for v (may be out_f).
template <int kMaxJ>
__device__ __forceinline__ void add_norm_rows(const bf16* a, const void* b, bool b_f32, const bf16* w, int n, float eps,
                                              float* scratch, float* tmp, __half* out_h, float* out_f) {
  uint4 ra[kMaxJ], rb[kMaxJ], rw[kMaxJ];
  float4 fb[kMaxJ][2];
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    const int g = threadIdx.x + j * kThreads;
    if (g * 8 < n) {
      ra[j] = __ldcg(reinterpret_cast<const uint4*>(a) + g);
      rw[j] = __ldg(reinterpret_cast<const uint4*>(w) + g);
      if (b_f32) {
        fb[j][0] = __ldcg(reinterpret_cast<const float4*>(b) + 2 * g);
        fb[j][1] = __ldcg(reinterpret_cast<const float4*>(b) + 2 * g + 1);
      } else {
        rb[j] = __ldcg(reinterpret_cast<const uint4*>(b) + g);
      }
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    const int g = threadIdx.x + j * kThreads;
    if (g * 8 >= n) continue;
    const uint32_t aw[4] = {ra[j].x, ra[j].y, ra[j].z, ra[j].w};
    float bv[8];
    if (b_f32) {
      const float t[8] = {fb[j][0].x, fb[j][0].y, fb[j][0].z, fb[j][0].w, fb[j][1].x, fb[j][1].y, fb[j][1].z, fb[j][1].w};
#pragma unroll
      for (int e = 0; e < 8; ++e) bv[e] = bfr(t[e]);
    } else {
      const uint32_t bw[4] = {rb[j].x, rb[j].y, rb[j].z, rb[j].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = bf16x2_to_f2(bw[e]);
        bv[2 * e] = f.x, bv[2 * e + 1] = f.y;
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = bf16x2_to_f2(aw[e]);
      const float v0 = bfr(f.x + bv[2 * e]), v1 = bfr(f.y + bv[2 * e + 1]);
      tmp[g * 8 + 2 * e] = v0, tmp[g * 8 + 2 * e + 1] = v1;
      ss += v0 * v0 + v1 * v1;
    }
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / n + eps);
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    const int g = threadIdx.x + j * kThreads;
    if (g * 8 >= n) continue;
    const uint32_t ww[4] = {rw[j].x, rw[j].y, rw[j].z, rw[j].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = bf16x2_to_f2(ww[e]);
      const float x0 = bfr(tmp[g * 8 + 2 * e] * r * f.x), x1 = bfr(tmp[g * 8 + 2 * e + 1] * r * f.y);
      if (out_h) {
        out_h[g * 8 + 2 * e] = to_h(x0), out_h[g * 8 + 2 * e + 1] = to_h(x1);
      } else {
        out_f[g * 8 + 2 * e] = x0, out_f[g * 8 + 2 * e + 1] = x1;
      }
    }
  }
}

// dst[i] = src[i] (n floats, n % 4 == 0) by the block, all loads in flight first.
template <int kMaxJ>
__device__ __forceinline__ void stage_f32(const float* src, float* dst, int n) {
  float4 v[kMaxJ];
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    const int g = threadIdx.x + j * kThreads;
    if (g * 4 < n) v[j] = __ldcg(reinterpret_cast<const float4*>(src) + g);
  }
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    const int g = threadIdx.x + j * kThreads;
    if (g * 4 < n) reinterpret_cast<float4*>(dst)[g] = v[j];
  }
}

// xh[i] = f16(src[i]) for n bf16 values (n % 8 == 0), all loads in flight first.
template <int kMaxJ>
__device__ __forceinline__ void stage_bf16_h(const bf16* src, __half* xh, int n) {
  uint4 v[kMaxJ];
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    const int g = threadIdx.x + j * kThreads;
    if (g * 8 < n) v[j] = __ldcg(reinterpret_cast<const uint4*>(src) + g);
  }
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    const int g = threadIdx.x + j * kThreads;
    if (g * 8 >= n) continue;
    const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = bf16x2_to_f2(w[e]);
      xh[g * 8 + 2 * e] = to_h(f.x), xh[g * 8 + 2 * e + 1] = to_h(f.y);
    }
  }
}

// The block's item range of a phase with n items over the grid.
__device__ __forceinline__ void item_range(int n, int& i0, int& i1) {
  i0 = int(int64_t(blockIdx.x) * n / gridDim.x);
  i1 = int(int64_t(blockIdx.x + 1) * n / gridDim.x);
}

// Runs the block's items [i0, i1) (warp w: i0 + w, + kWarps, ...; with kPre the caller has
// loaded each warp's first item into `b0` already), then adds the shared row sums into gout (row of unit u = rowmap(u) * 16).
// L2 prefetch of an item's 16 row segments (lanes 0..15 one each; a hint).
__device__ __forceinline__ void prefetch_item(const Item& it) {
  const int lane = threadIdx.x & 31;
  if (lane < 16)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(it.w + int64_t(lane) * it.K + it.c0 * 128),
                 "r"(it.nch * 128)
                 : "memory");
}

// pf: L2 prefetch distance in rounds of kWarps items (0: off), so more of the stream is in
// flight than the two register buffers per warp hold.
template <bool kPre, class Resolve, class RowMap>
__device__ __forceinline__ void gemv_run(int i0, int i1, int J, Resolve resolve, RowMap rowmap, Smem& S, float* gout,
                                         WBuf& b0, int pf = 0) {
  const int warp = threadIdx.x >> 5;
  const int u0 = i0 / J;
  int it = i0 + warp;
  Item r0, r1;
  WBuf b1;
  if (it < i1) {
    r0 = resolve(it, it / J - u0);
    if (!kPre) load_item(r0, b0);
  }
  if (pf > 0)  // the first pf rounds after the two in registers
    for (int k = 2; k < 2 + pf; ++k)
      if (it + k * kWarps < i1) prefetch_item(resolve(it + k * kWarps, 0));
  for (; it < i1; it += 2 * kWarps) {
    const int it2 = it + kWarps, it3 = it2 + kWarps;
    if (pf > 0) {
      if (it + (2 + pf) * kWarps < i1) prefetch_item(resolve(it + (2 + pf) * kWarps, 0));
      if (it + (3 + pf) * kWarps < i1) prefetch_item(resolve(it + (3 + pf) * kWarps, 0));
    }
    if (it2 < i1) {
      r1 = resolve(it2, it2 / J - u0);
      load_item(r1, b1);
    }
    compute_item(r0, b0, S.xh, S.gacc);
    if (it3 < i1) {
      r0 = resolve(it3, it3 / J - u0);
      load_item(r0, b0);
    }
    if (it2 < i1) compute_item(r1, b1, S.xh, S.gacc);
  }
  __syncthreads();
  if (i1 > i0) {
    const int nslots = (i1 - 1) / J - u0 + 1;
    for (int i = threadIdx.x; i < nslots * 16; i += kThreads) {
      atomicAdd(gout + int64_t(rowmap(u0 + i / 16)) * 16 + i % 16, S.gacc[i]);
      S.gacc[i] = 0.f;
    }
  }
}

struct Ws {
  float *qkv, *o, *logits, *up, *down, *part_o, *part_ml;
  int* cnt;  // [Hkv] split arrivals per kv head
};
__host__ __device__ inline Ws ws_layout(const DecodeLayerParams& p) {
  Ws w;
  const int G = p.Hkv > 0 ? p.Hq / p.Hkv : 1;
  w.qkv = p.ws;
  w.o = w.qkv + (p.Hq + 2 * p.Hkv) * kD;
  w.logits = w.o + p.H;
  w.up = w.logits + (p.E + 3) / 4 * 4;
  w.down = w.up + p.top_k * 2 * p.I;
  w.part_o = w.down + p.H;
  w.part_ml = w.part_o + int64_t(p.Hkv) * kMaxSplits * G * kD;
  w.cnt = reinterpret_cast<int*>(w.part_ml + int64_t(p.Hkv) * kMaxSplits * G * 2);
  return w;
}

__device__ __forceinline__ int num_splits(int ctx, int max_splits) {
  return max(1, min(max_splits, (ctx + 255) / 256));
}

// q/k/v item `it` of a layer (rows: q, then k, then v).
__device__ __forceinline__ Item qkv_item_of(const DecodeLayerParams& p, int it, int slot) {
  const int H = p.H, QW = p.Hq * kD, KW = p.Hkv * kD;
  const int Jh = items_per_row(H), nch_h = item_chunks(H);
  const int gr = it / Jh, j = it % Jh, r0 = gr * 16;
  Item x;
  const uint8_t* w;
  const float* s;
  int r;
  if (r0 < QW) w = p.wq, s = p.sq, r = r0;
  else if (r0 < QW + KW) w = p.wk, s = p.sk, r = r0 - QW;
  else w = p.wv, s = p.sv, r = r0 - QW - KW;
  x.w = w + int64_t(r) * H, x.s = s + (r / 128) * (H / 128), x.K = H, x.c0 = j * nch_h, x.nch = nch_h, x.xoff = 0;
  x.slot = slot, x.wf = 1.f;
  return x;
}

// Layer parameters passed by value (kernel parameter space, up to 32 KB on sm_70+ with CUDA
// 12.1+): read through the constant cache, so the per-layer pointers cost no registers, and a
// captured graph node carries its own copy.
template <int kL>
struct LayerTable {
  DecodeLayerParams layer[kL];
  int n;
};
constexpr int kMaxTableLayers = 64;

}  // namespace
}  // namespace moeserve::cuda
