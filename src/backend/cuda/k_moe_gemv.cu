// Streaming expert GEMVs for MoE decode at very few tokens (direct pairs, see k_moe_gemv.h).
//
// Why: k_gemv_tc.cu's direct-pair grid (one grid row per (token, k) pair, 96 blocks of 4
// warps each) runs 768 short blocks per GEMV at batch 1: ~1.45 waves for gate/up, and each
// warp keeps only 2 chunks in flight before its math (no overlap across iterations), so block
// time is mostly latency, ramp, split-K reduction and tail (~2.8 TB/s up, ~1.9 TB/s down).
//
// Here the grid is one block per SM. The work is a list of units, unit u = (pair u / G, row
// group u % G): kSwiglu 16 rows of W1 and the same 16 rows of W3 (G = I / 16), kDown 32 rows
// of W2 (G = H / 32); block b owns units [b U / grid, (b + 1) U / grid) (equal within one
// unit). A unit's K is cut into W slices of ks = K / W columns; stage i of the block is
// (unit i / W, slice i % W): 32 weight rows x ks FP8 bytes, one cp.async.bulk per row (rows
// of a matrix are contiguous in memory) into a ring of `ns` shared-memory stages guarded by
// full / empty mbarriers. One producer warp issues the copies; consumer warp c computes slice
// c of every unit, so the SM streams its whole range at a steady depth of ~ns stages.
//
// Math as k_gemv_tc.cu: FP8 -> f16 (exact) A fragments, activations rounded bf16 -> f16 once
// per block into shared memory (clamped to the f16 range), mma.sync m16n8k16 with f32
// accumulation, one partial sum per 128-column block scale. In direct-pair mode every B
// column is the unit's single x row, so column 0 (lanes q == 0) holds the dot products. The
// W slice partials meet in shared memory after each unit (named barrier); a rotating warp
// finishes the unit: silu(gate) * up -> bf16 act rows (kSwiglu), or acc * routing weight ->
// f32 pair rows plus the fused ordered combine (kDown: same counters and k-order sum as the
// old kernel, so either kernel may run any layer).
//
// PDL: gate/up waits before reading the pair ids (the router is its predecessor). The down
// kernel's ids are two launches back (LinParams::ids_ready): its producer fills the whole
// ring before the dependency wait, and its blocks fit next to the gate/up blocks (~100 KB
// shared memory each), so down's first ~13 MB of weights stream while gate/up finishes.
// Shared memory rows are ks + 64 bytes apart: the 8 lanes of a 16-byte shared load phase
// (rows g, g + 1, 4 column quads) then hit 32 distinct banks.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/k_moe_gemv.h"
#include "backend/cuda/pdl.cuh"

namespace moeserve::cuda {

int g_moe_gemv_v = [] {
  const char* e = std::getenv("MOESERVE_MOE_GEMV_V");
  return e && *e ? std::atoi(e) : 2;
}();
uint64_t g_moe_gemv_stream_launches = 0;

namespace {

constexpr int kRows = 32;  // weight rows per stage (kSwiglu: 16 of W1 then 16 of W3)
constexpr int kPad = 64;   // shared row stride = ks + kPad (ks % 128 == 0: stride % 128 == 64)

struct StreamArgs {
  LinParams p;
  int G;   // units (row groups) per pair
  int ks;  // columns per slice (stage) = K / W
  int rs;  // shared-memory row stride, bytes
  int ns;  // ring stages
  int xr;  // x rows held in shared memory (the most any block's units span)
  int xs_off, red_off, bar_off;  // dynamic shared memory layout: ring, x rows, partials, mbarriers
  int cpasync;  // 1: the producer loads with 16-byte cp.async (LDGSTS) instead of cp.async.bulk
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MOESERVE_STREAM_DEVICE 1
#endif

__device__ __forceinline__ uint32_t saddr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, uint32_t n) {
#ifdef MOESERVE_STREAM_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(b)), "r"(n) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
#ifdef MOESERVE_STREAM_DEVICE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(b)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t* b, uint32_t bytes) {
#ifdef MOESERVE_STREAM_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(b)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
#ifdef MOESERVE_STREAM_DEVICE
  uint32_t ok = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(saddr(b)), "r"(parity)
        : "memory");
  } while (!ok);
#endif
}
// bytes (% 16 == 0) from global src to shared dst (both 16-byte aligned); completes on bar.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#ifdef MOESERVE_STREAM_DEVICE
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   saddr(dst)),
               "l"(src), "r"(bytes), "r"(saddr(bar))
               : "memory");
#endif
}
// 16 bytes global -> shared (L2 only); cp_async_arrive: `bar` gets one arrival once all of
// this thread's earlier cp.async copies have landed (.noinc: counted in the barrier's init).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#ifdef MOESERVE_STREAM_DEVICE
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(dst)), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
#ifdef MOESERVE_STREAM_DEVICE
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(saddr(bar)) : "memory");
#endif
}
// Barrier 1 over the consumer warps only (the producer warp never joins it).
__device__ __forceinline__ void consumers_sync(int threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}

__device__ __forceinline__ void mma_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t fp8x2_h2(uint32_t v16) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v16 & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}
// The same two e4m3 bytes as f16x2 scaled by 2^-8, with integer ops only (exact for every
// finite e4m3 value, subnormals included: f16 bits = sign << 15 | (byte & 0x7f) << 7). Lets
// the conversion run on the integer pipes instead of the conversion unit (A/B variant).
__device__ __forceinline__ uint32_t fp8x2_h2_alu(uint32_t w, bool high) {
  const uint32_t v = __byte_perm(w, 0, high ? 0x4342 : 0x4140);  // byte b0 | b1 << 16
  const uint32_t t = v << 7;
  return t + (t & 0x40004000u);  // the sign (bit 14 / 30) moves up one bit
}
__device__ __forceinline__ uint32_t bf2_h2(uint32_t w) {
  float2 f = bf16x2_to_f2(w);
  f.x = fminf(fmaxf(f.x, -65504.f), 65504.f);
  f.y = fminf(fmaxf(f.y, -65504.f), 65504.f);
  __half2 h = __floats2half2_rn(f.x, f.y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Unit u of the work list: local expert (-1: not local, direct pairs only), first problem
// row, rows (<= 8) and row group.
struct Unit {
  int e, begin, nrows, grp;
};
__device__ __forceinline__ Unit unit_at(const StreamArgs& a, int u) {
  const LinParams& p = a.p;
  const int t = u / a.G;
  Unit r;
  r.grp = u - t * a.G;
  if (p.pair_ids) {
    const int e = p.pair_ids[t] - p.first_local;
    r.e = e >= 0 && e < p.num_local ? e : -1;
    r.begin = t, r.nrows = 1;
  } else {
    r.e = p.tile_expert[t], r.begin = p.tile_begin[t], r.nrows = p.tile_end[t] - r.begin;
  }
  return r;
}

// Block: W consumer warps + 1 producer warp (the last). MODE: kSwiglu or kDown.
template <int MODE, int W, bool ALU>
__global__ void __launch_bounds__((W + 1) * 32, 1) moe_gemv_stream_kernel(const __grid_constant__ StreamArgs a) {
#ifdef MOESERVE_STREAM_DEVICE
  constexpr bool kSw = MODE == int(LinMode::kSwiglu);
  extern __shared__ __align__(128) uint8_t smem[];
  const LinParams& p = a.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = p.K, ks = a.ks, stage_bytes = kRows * a.rs;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + a.bar_off);
  uint64_t* empty = full + a.ns;
  if (threadIdx.x == 0) {
    for (int i = 0; i < a.ns; ++i) {
      mbar_init(full + i, a.cpasync ? 32 : 1);
      mbar_init(empty + i, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // Down with ids_ready: the ids / tile table are two launches back, so weights may stream
  // before the dependency wait (see the file comment).
  const bool early = !kSw && p.ids_ready;
  if (!early) pdl_enter();
  const int U = (p.pair_ids ? p.M : *p.num_tiles) * a.G;
  const int u0 = int(int64_t(blockIdx.x) * U / gridDim.x), u1 = int(int64_t(blockIdx.x + 1) * U / gridDim.x);
  const int nunits = u1 - u0;

  if (warp == W) {  // producer: stage i = (unit u0 + i / W, slice i % W) into slot i % ns
    const int nst = nunits * W;
    for (int i = 0; i < nst; ++i) {
      const int slot = i % a.ns;
      if (i == a.ns && early) pdl_enter();
      if (i >= a.ns) mbar_wait(empty + slot, uint32_t((i / a.ns) - 1) & 1u);
      const int sl = i % W;
      const Unit un = unit_at(a, u0 + i / W);
      if (a.cpasync) {  // lanes copy 16-byte pieces of each of the 32 rows; one arrival per lane
        if (un.e >= 0) {
          const ExpertPtrs& ep = p.experts[un.e];
          uint8_t* dst = smem + slot * stage_bytes;
          for (int r = 0; r < kRows; ++r) {
            const uint8_t* src =
                (kSw ? static_cast<const uint8_t*>(r < 16 ? ep.w1 : ep.w3) + int64_t(un.grp * 16 + (r & 15)) * K
                     : static_cast<const uint8_t*>(ep.w2) + int64_t(un.grp * 32 + r) * K) +
                sl * ks;
            for (int off = lane * 16; off < ks; off += 32 * 16) cp_async16(dst + r * a.rs + off, src + off);
          }
          cp_async_arrive(full + slot);
        } else {
          mbar_arrive(full + slot);
        }
        continue;
      }
      if (lane == 0) {
        if (un.e >= 0)
          mbar_arrive_tx(full + slot, uint32_t(kRows * ks));
        else
          mbar_arrive(full + slot);  // non-local expert: nothing to load
      }
      __syncwarp();
      if (un.e >= 0) {
        const ExpertPtrs& ep = p.experts[un.e];
        const uint8_t* src =
            kSw ? static_cast<const uint8_t*>(lane < 16 ? ep.w1 : ep.w3) + int64_t(un.grp * 16 + (lane & 15)) * K
                : static_cast<const uint8_t*>(ep.w2) + int64_t(un.grp * 32 + lane) * K;
        bulk_load(smem + slot * stage_bytes + lane * a.rs, src + sl * ks, uint32_t(ks), full + slot);
      }
    }
    if (early && nst <= a.ns) pdl_enter();
    return;
  }

  // Consumers (the early producer above waits on its own; x and the outputs need the wait).
  if (early) pdl_enter();
  // x rows -> f16 in shared memory: x row of problem row r is x_rows[r] (tile table: all
  // a.xr token rows) or r / div (the rows this block's units cover).
  constexpr int kThreads = W * 32;
  const int div = kSw ? p.x_row_div : 1;
  int r0 = 0, nx = 0;
  if (p.x_rows) {
    nx = a.xr;
  } else if (nunits > 0) {
    const Unit lo = unit_at(a, u0), hi = unit_at(a, u1 - 1);
    r0 = lo.begin / div;
    nx = (hi.begin + hi.nrows - 1) / div - r0 + 1;  // <= a.xr (host)
  }
  __half* xs = reinterpret_cast<__half*>(smem + a.xs_off);
  {
    const int per_row = K / 8;
    for (int t = threadIdx.x; t < nx * per_row; t += kThreads) {
      const int r = t / per_row, c8 = t % per_row;
      const uint4 v =
          __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.x) + int64_t(r0 + r) * p.ldx) + c8);
      const uint4 h = {bf2_h2(v.x), bf2_h2(v.y), bf2_h2(v.z), bf2_h2(v.w)};
      *reinterpret_cast<uint4*>(xs + int64_t(r) * K + c8 * 8) = h;
    }
    consumers_sync(kThreads);
  }
  float* red = reinterpret_cast<float*>(smem + a.red_off);  // [2][W][8][32]
  const int g = lane >> 2, q = lane & 3, nch = ks / 128;
  for (int ul = 0; ul < nunits; ++ul) {
    const Unit un = unit_at(a, u0 + ul);
    const int grp = un.grp;
    const int i = ul * W + warp, slot = i % a.ns;
    float acc[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[m][j] = 0.f;
    mbar_wait(full + slot, uint32_t(i / a.ns) & 1u);
    if (un.e >= 0) {
      const ExpertPtrs& ep = p.experts[un.e];
      const uint8_t* st = smem + slot * stage_bytes;
      // B column g = the unit's row min(g, nrows - 1).
      const int rg = un.begin + min(g, un.nrows - 1);
      const __half* xr = xs + int64_t((p.x_rows ? p.x_rows[rg] : rg / div) - r0) * K + warp * ks;
      const int srow = ((grp * (kSw ? 16 : 32)) / 128) * p.s_cols + warp * (ks / 128);
      const float* sc0 = (kSw ? ep.s1 : ep.s2) + srow;
      const float* sc1 = (kSw ? ep.s3 : ep.s2) + srow;
      for (int ch = 0; ch < nch; ++ch) {
        float part[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int j = 0; j < 4; ++j) part[m][j] = 0.f;
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int col = ch * 128 + s * 64 + q * 16;
          const uint4 xa = *reinterpret_cast<const uint4*>(xr + col);
          const uint4 xb = *reinterpret_cast<const uint4*>(xr + col + 8);
          const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          uint4 lo[2], hi[2];
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            lo[m] = *reinterpret_cast<const uint4*>(st + (16 * m + g) * a.rs + col);
            hi[m] = *reinterpret_cast<const uint4*>(st + (16 * m + g + 8) * a.rs + col);
          }
#pragma unroll
          for (int k4 = 0; k4 < 4; ++k4) {
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              const uint32_t wl = k4 == 0 ? lo[m].x : k4 == 1 ? lo[m].y : k4 == 2 ? lo[m].z : lo[m].w;
              const uint32_t wh = k4 == 0 ? hi[m].x : k4 == 1 ? hi[m].y : k4 == 2 ? hi[m].z : hi[m].w;
              uint32_t af[4];
              if constexpr (ALU) {
                af[0] = fp8x2_h2_alu(wl, false), af[1] = fp8x2_h2_alu(wh, false);
                af[2] = fp8x2_h2_alu(wl, true), af[3] = fp8x2_h2_alu(wh, true);
              } else {
                af[0] = fp8x2_h2(wl), af[1] = fp8x2_h2(wh), af[2] = fp8x2_h2(wl >> 16), af[3] = fp8x2_h2(wh >> 16);
              }
              mma_f16(part[m], af, xw[2 * k4], xw[2 * k4 + 1]);
            }
          }
        }
        const float s0 = __ldg(sc0 + ch) * (ALU ? 256.f : 1.f), s1 = __ldg(sc1 + ch) * (ALU ? 256.f : 1.f);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[0][j] = fmaf(part[0][j], s0, acc[0][j]);
          acc[1][j] = fmaf(part[1][j], s1, acc[1][j]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + slot);
    // The W slice partials of the unit. Tile table: red[ul & 1][warp][m * 4 + j][lane]. Direct
    // pairs (one row: only column 0, lanes q == 0, acc[m][0] and acc[m][2]):
    // red[ul & 1][warp][g * 4 + {m0 row g, m0 row g + 8, m1 row g, m1 row g + 8}].
    const bool compact = p.pair_ids != nullptr;
    float* rb = red + (ul & 1) * W * (compact ? 32 : 256);
    if (compact) {
      if (q == 0) {
        rb[warp * 32 + g * 4 + 0] = acc[0][0];
        rb[warp * 32 + g * 4 + 1] = acc[0][2];
        rb[warp * 32 + g * 4 + 2] = acc[1][0];
        rb[warp * 32 + g * 4 + 3] = acc[1][2];
      }
    } else {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 4; ++j) rb[warp * 256 + (m * 4 + j) * 32 + lane] = acc[m][j];
    }
    consumers_sync(kThreads);
    if (warp != ul % W) continue;  // the unit's finishing warp rotates
    if (compact) {
      if (q == 0) {
        float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int w = 0; w < W; ++w)
#pragma unroll
          for (int j = 0; j < 4; ++j) v[j] += rb[w * 32 + g * 4 + j];
        acc[0][0] = v[0], acc[0][2] = v[1], acc[1][0] = v[2], acc[1][2] = v[3];
      }
    } else {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float v = 0.f;
#pragma unroll
          for (int w = 0; w < W; ++w) v += rb[w * 256 + (m * 4 + j) * 32 + lane];
          acc[m][j] = v;
        }
    }
    // C fragment: acc[m][0..1] = row g, tokens (B columns) 2q, 2q + 1; acc[m][2..3] = row g + 8.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int tok = 2 * q + j;
      if (tok >= un.nrows) continue;
      const int r = un.begin + tok;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (kSw) {
          if (un.e >= 0)
            static_cast<bf16*>(p.out)[int64_t(r) * p.ldo + grp * 16 + g + 8 * h] =
                f2bf(silu(acc[0][2 * h + j]) * acc[1][2 * h + j]);
        } else {
          const float sc = p.row_scale[r];
#pragma unroll
          for (int m = 0; m < 2; ++m)
            static_cast<float*>(p.out)[int64_t(r) * p.ldo + grp * 32 + 16 * m + g + 8 * h] = acc[m][2 * h + j] * sc;
        }
      }
    }
    if (kSw || !p.combine_out || !p.pair_ids) continue;
    // Direct pairs: fused combine (threadfence-reduction pattern, as k_gemv_tc.cu): the
    // token's last pair to finish this row group sums its top_k rows in k order.
    const int token = un.begin / p.top_k;
    int* ctr = p.counters + int64_t(token) * a.G + grp;
    __threadfence();
    __syncwarp();
    int last = 0;
    if (lane == 0) last = atomicAdd(ctr, 1) == p.top_k - 1;
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) continue;
    if (lane == 0) *ctr = 0;  // ready for the next layer / replay
    __threadfence();
    const int orow = grp * 32 + lane;
    const float* yp = static_cast<const float*>(p.out) + int64_t(token) * p.top_k * p.ldo + orow;
    float sum = 0.f;
    for (int k = 0; k < p.top_k; ++k) sum += __ldcg(yp + int64_t(k) * p.ldo);
    const int64_t o = int64_t(token) * p.N + orow;
    if (p.combine_bf16)
      static_cast<bf16*>(p.combine_out)[o] = f2bf(sum);
    else
      static_cast<float*>(p.combine_out)[o] = sum;
  }
#endif
}

int env_int(const char* name, int def) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : def;
}

int num_sms_cached() {
  static int cache[64] = {};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 0;
  if (!cache[dev]) CUDA_CHECK(cudaDeviceGetAttribute(&cache[dev], cudaDevAttrMultiProcessorCount, dev));
  return cache[dev];
}

struct Plan {
  StreamArgs a;
  int W = 0, grid = 0;
  size_t smem = 0;
};

constexpr size_t kMaxSmem = 227 * 1024;

// Consumer warps: the most of {6, 4, 2, 1} (kSwiglu) / {4, 6, 2, 1} (kDown) that cuts K into
// slices of whole 128-column blocks. MOESERVE_MOE_GEMV_WARPS_UP / _DOWN override (A/B).
// MOESERVE_MOE_GEMV_SMEM (KB; default 140 gate/up, 84 down, so that a gate/up and a down block
// fit on one SM together): shared-memory budget per block; MOESERVE_MOE_GEMV_BPS: blocks per SM
// (default 1); MOESERVE_MOE_GEMV_LOAD=1: 16-byte cp.async loads instead of cp.async.bulk.
bool plan(const LinParams& p, int x_rows_total, Plan& pl) {
  const bool sw = p.mode == LinMode::kSwiglu, direct = p.pair_ids != nullptr;
  static const int env_w_up = env_int("MOESERVE_MOE_GEMV_WARPS_UP", 0);
  static const int env_w_dn = env_int("MOESERVE_MOE_GEMV_WARPS_DOWN", 0);
  static const int env_kb = env_int("MOESERVE_MOE_GEMV_SMEM", 0);
  static const int env_bps = env_int("MOESERVE_MOE_GEMV_BPS", 1);
  static const int env_load = env_int("MOESERVE_MOE_GEMV_LOAD", 0);
  const int env_w = sw ? env_w_up : env_w_dn;
  const int prefs[4] = {sw ? 6 : 4, sw ? 4 : 6, 2, 1};
  int W = 0;
  if (env_w == 1 || env_w == 2 || env_w == 4 || env_w == 6) {
    if (p.K % (128 * env_w) == 0) W = env_w;
  }
  for (int i = 0; i < 4 && !W; ++i)
    if (p.K % (128 * prefs[i]) == 0) W = prefs[i];
  if (!W) return false;
  StreamArgs& a = pl.a;
  a.p = p;
  a.G = p.N / (sw ? 16 : 32);
  a.ks = p.K / W;
  a.rs = a.ks + kPad;
  // Units: direct pairs M * G; tile table at most max_tiles * G (the kernel reads *num_tiles).
  const int64_t U = int64_t(direct ? p.M : p.max_tiles) * a.G;
  if (U <= 0 || U >= (int64_t(1) << 31) / 2) return false;
  pl.grid = int(std::min<int64_t>(U, int64_t(num_sms_cached()) * std::max(1, env_bps)));
  const int64_t upb = (U + pl.grid - 1) / pl.grid;
  const int64_t spanned = (upb - 1) / a.G + 2;  // most pairs / tiles one block's units touch
  if (p.x_rows) {
    a.xr = x_rows_total;  // every x row (tokens), indexed by x_rows
  } else if (direct) {
    const int div = sw ? std::max(1, p.x_row_div) : 1;
    a.xr = int(std::min<int64_t>((p.M + div - 1) / div, spanned));
  } else {
    a.xr = int(std::min<int64_t>(p.M, spanned * p.tile_rows));
  }
  if (a.xr <= 0) return false;
  const size_t stage = size_t(kRows) * a.rs, xs = size_t(a.xr) * p.K * 2;
  const size_t red = size_t(2) * W * (direct ? 32 : 256) * 4;
  // Ring: at least W + 1 stages (a consumer warp must never wait on a slot whose previous
  // round belongs to the same unit: the mbarrier parity would alias), more up to the budget.
  // Default budgets (batch 1, M2.5): gate/up 7 x 18 KB + down 5 x 14 KB fit one SM together.
  const size_t budget = size_t(env_kb > 0 ? env_kb : sw ? 140 : 84) * 1024;
  const size_t fixed = xs + red + 2 * 16 * 8;
  int ns = fixed < budget ? int((budget - fixed) / stage) : 0;
  ns = std::min(16, std::max(W + 1, ns));
  if (ns * stage + fixed > kMaxSmem) return false;
  a.ns = ns;
  a.cpasync = env_load == 1;
  a.xs_off = int(ns * stage);
  a.red_off = int(a.xs_off + xs);
  a.bar_off = int(a.red_off + red);
  pl.W = W;
  pl.smem = size_t(a.bar_off) + size_t(2) * ns * 8;
  return true;
}

template <int MODE, int W, bool ALU>
void launch_w(const Plan& pl, cudaStream_t s) {
  auto* k = moe_gemv_stream_kernel<MODE, W, ALU>;
  static int configured = -1;  // device the attributes were set for
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (configured != dev) {
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    configured = dev;
  }
  launch_pdl(k, dim3(pl.grid), dim3((W + 1) * 32), pl.smem, s, pl.a);
  CUDA_CHECK_LAUNCH();
}

template <int MODE>
void launch_mode(const Plan& pl, cudaStream_t s) {
  // MOESERVE_MOE_GEMV_CVT=1: e4m3 -> f16 on the integer pipes (fp8x2_h2_alu; A/B).
  static const bool alu = env_int("MOESERVE_MOE_GEMV_CVT", 0) == 1;
  if (alu) {
    switch (pl.W) {
      case 6: launch_w<MODE, 6, true>(pl, s); break;
      case 4: launch_w<MODE, 4, true>(pl, s); break;
      case 2: launch_w<MODE, 2, true>(pl, s); break;
      default: launch_w<MODE, 1, true>(pl, s); break;
    }
    return;
  }
  switch (pl.W) {
    case 6: launch_w<MODE, 6, false>(pl, s); break;
    case 4: launch_w<MODE, 4, false>(pl, s); break;
    case 2: launch_w<MODE, 2, false>(pl, s); break;
    default: launch_w<MODE, 1, false>(pl, s); break;
  }
}

}  // namespace

bool moe_gemv_stream_supported(const LinParams& p, int x_rows_total) {
  if (p.mode != LinMode::kSwiglu && p.mode != LinMode::kDown) return false;
  if (!p.experts || !p.fp8 || p.bo != 128 || p.bi != 128 || p.K <= 0 || p.K % 128 != 0) return false;
  if (p.N % (p.mode == LinMode::kSwiglu ? 16 : 32) != 0 || p.ldx % 8 != 0 || p.M <= 0) return false;
  if (p.pair_ids) {
    if (p.x_rows) return false;
  } else {  // tile table of <= 8 rows per tile
    if (!p.tile_expert || !p.tile_begin || !p.tile_end || !p.num_tiles || p.max_tiles <= 0 || p.tile_rows > 8 ||
        p.tile_rows <= 0)
      return false;
    if (p.x_rows && x_rows_total <= 0) return false;
  }
  if (p.mode == LinMode::kDown &&
      (p.x_rows || !p.out_f32 || !p.row_scale || (p.pair_ids && p.combine_out && (!p.counters || p.top_k <= 0))))
    return false;
  if (code_arch() < 900) return false;
  Plan pl;
  return plan(p, x_rows_total, pl);
}

void launch_moe_gemv_stream(const LinParams& p, cudaStream_t s, int x_rows_total) {
  Plan pl;
  ++g_moe_gemv_stream_launches;
  CU_REQUIRE(plan(p, x_rows_total, pl), "moe_gemv_stream: unsupported shapes (check moe_gemv_stream_supported first)");
  if (p.mode == LinMode::kSwiglu)
    launch_mode<int(LinMode::kSwiglu)>(pl, s);
  else
    launch_mode<int(LinMode::kDown)>(pl, s);
}

}  // namespace moeserve::cuda
