// Streaming expert GEMVs for MoE decode at few tokens (see k_moe_gemv.h).
//
// Why: k_gemv_tc.cu's direct-pair grid (one grid row per (token, k) pair, 96 blocks of 4
// warps each) runs 768 short blocks per GEMV at batch 1: ~1.45 waves for gate/up, and each
// warp keeps only 2 chunks in flight before its math (no overlap across iterations), so block
// time is mostly latency, ramp, split-K reduction and tail (~2.8 TB/s up, ~1.9 TB/s down).
//
// Here the grid is one block per SM. The work is a list of units, unit u = (pair or tile
// u / G, row group u % G) of 16 weight rows: kSwiglu rows 8 r .. 8 r + 7 of W1 then the same
// rows of W3 (G = I / 8; the m16 tile's rows g and g + 8 are gate and up of one output row,
// so SiLU * up needs no exchange), kDown rows 16 r .. 16 r + 15 of W2 (G = H / 16). Block b
// owns units [b U / grid, (b + 1) U / grid). A unit's rows are contiguous in memory (two
// 8-row blocks of K bytes), so one unit is one ring stage loaded by two cp.async.bulk copies
// (12-24 KB each): on the H200 a bulk copy costs ~100 cycles of the SM's copy engine whatever
// its size (a first version with one 384-512-byte copy per row and K slice streamed only
// 7-11 KB/us per SM). One producer warp fills a ring of `ns` stages (full / empty mbarriers);
// the W consumer warps split every stage's K (ks = K / W columns each), meet in shared memory
// (named barrier) and a rotating warp finishes the unit.
//
// Math as k_gemv_tc.cu: FP8 -> f16 (exact) A fragments, activations rounded bf16 -> f16 once
// per block into shared memory (clamped to the f16 range), mma.sync m16n8k16 with f32
// accumulation, one partial sum per 128-column block scale. Direct pairs: every B column is
// the unit's single x row, so column 0 (lanes q == 0) holds the dot products. Tile table:
// B column n is the tile's row min(n, rows - 1). Outputs: silu(gate) * up -> bf16 act rows
// (kSwiglu); acc * routing weight -> f32 pair rows (kDown), for direct pairs plus the fused
// ordered combine (the token's last pair of a row group sums its top_k rows in k order).
// Shared-memory rows are K bytes apart (one copy per 8 rows, no padding): the 16-byte weight
// loads are 2-way bank conflicted, well inside the shared-memory bandwidth.
//
// PDL: gate/up waits before reading the ids (the router or align is its predecessor). Down's
// ids / tile table are two launches back (LinParams::ids_ready): its producer fills the ring
// before the dependency wait; where a down block fits next to a gate/up block (default
// budgets ~104 KB each) down's first stages stream while gate/up finishes.
//
// Status (H200, ncu, kernel alone): gate/up 27.6 us (2.7 TB/s, the old kernel 27.6-29.6 us),
// down 22.7 us (1.7 TB/s, old 20.2 us); in the decode graph the step is slower than with the
// old kernels, so the path is opt-in (MOESERVE_MOE_GEMV_V). Each unit costs ~2 us whatever
// its bytes; a deeper ring did not help (docs/benchmarks.md).
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_frag.cuh"
#include "backend/cuda/k_moe_gemv.h"
#include "backend/cuda/pdl.cuh"

namespace moeserve::cuda {

// Default 1: on the H200 the streaming kernels are not faster in the decode graph yet
// (docs/benchmarks.md, "Streaming expert GEMVs").
int g_moe_gemv_v = [] {
  const char* e = std::getenv("MOESERVE_MOE_GEMV_V");
  return e && *e ? std::atoi(e) : 1;
}();
uint64_t g_moe_gemv_stream_launches = 0;
int g_moe_gemv_cvt = [] {
  const char* e = std::getenv("MOESERVE_MOE_GEMV_CVT");
  return e && *e ? std::atoi(e) : 0;
}();

namespace {

constexpr int kRows = 16;  // weight rows per unit / stage

struct StreamArgs {
  LinParams p;
  int G;   // units (row groups) per pair / tile
  int ks;  // columns per consumer warp = K / W
  int ns;  // ring stages
  int xr;  // x rows held in shared memory (the most any block's units span)
  int xs_off, red_off, bar_off;  // dynamic shared memory layout: ring, x rows, partials, mbarriers
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
// e4m3 pair -> f16x2 scaled by 2^-8 on the integer pipes (exact for every finite e4m3 value,
// subnormals included: f16 bits = sign << 15 | (byte & 0x7f) << 7); `high`: bytes 2 and 3.
__device__ __forceinline__ uint32_t fp8x2_h2_alu(uint32_t w, bool high) {
  const uint32_t v = __byte_perm(w, 0, high ? 0x4342 : 0x4140);  // b0 | b1 << 16
  const uint32_t t = v << 7;
  return t + (t & 0x40004000u);  // the sign (bit 14 / 30) moves up one bit
}
// Barrier 1 over the consumer warps only (the producer warp never joins it).
__device__ __forceinline__ void consumers_sync(int threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
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
// CVT (MOESERVE_MOE_GEMV_CVT, A/B): how the consumers turn e4m3 into f16: 0 the conversion
// instruction (cvt.rn.f16x2.e4m3x2), 1 integer ops only (fp8x2_h2_alu), 2 half of the mmas of
// each step each way (two pipes in parallel; the integer half is rescaled by 2^8).
template <int MODE, int W, int CVT>
__global__ void __launch_bounds__((W + 1) * 32, 1) moe_gemv_stream_kernel(const __grid_constant__ StreamArgs a) {
#ifdef MOESERVE_STREAM_DEVICE
  constexpr bool kSw = MODE == int(LinMode::kSwiglu);
  extern __shared__ __align__(128) uint8_t smem[];
  const LinParams& p = a.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = p.K, ks = a.ks, stage_bytes = kRows * K;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + a.bar_off);
  uint64_t* empty = full + a.ns;
  if (threadIdx.x == 0) {
    for (int i = 0; i < a.ns; ++i) {
      mbar_init(full + i, 1);
      mbar_init(empty + i, W);  // every consumer warp releases every stage
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

  if (warp == W) {  // producer: unit u0 + i into slot i % ns
    for (int i = 0; i < nunits; ++i) {
      const int slot = i % a.ns;
      if (i == a.ns && early) pdl_enter();
      if (i >= a.ns) mbar_wait(empty + slot, uint32_t((i / a.ns) - 1) & 1u);
      const Unit un = unit_at(a, u0 + i);
      if (lane == 0) {
        if (un.e >= 0)
          mbar_arrive_tx(full + slot, uint32_t(stage_bytes));
        else
          mbar_arrive(full + slot);  // non-local expert: nothing to load
      }
      __syncwarp();
      if (un.e >= 0 && lane < 2) {  // lane h: smem rows 8 h .. 8 h + 7
        const ExpertPtrs& ep = p.experts[un.e];
        const uint8_t* src = kSw ? static_cast<const uint8_t*>(lane == 0 ? ep.w1 : ep.w3) + int64_t(un.grp) * 8 * K
                                 : static_cast<const uint8_t*>(ep.w2) + (int64_t(un.grp) * 16 + 8 * lane) * K;
        bulk_load(smem + slot * stage_bytes + lane * 8 * K, src, uint32_t(8 * K), full + slot);
      }
    }
    if (early && nunits <= a.ns) pdl_enter();
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
      const uint4 h = {bf2_to_h2(v.x), bf2_to_h2(v.y), bf2_to_h2(v.z), bf2_to_h2(v.w)};
      *reinterpret_cast<uint4*>(xs + int64_t(r) * K + c8 * 8) = h;
    }
    consumers_sync(kThreads);
  }
  const bool compact = p.pair_ids != nullptr;
  float* red = reinterpret_cast<float*>(smem + a.red_off);  // [2][W][compact ? 16 : 128]
  const int g = lane >> 2, q = lane & 3, nch = ks / 128;
  for (int ul = 0; ul < nunits; ++ul) {
    const Unit un = unit_at(a, u0 + ul);
    const int grp = un.grp, slot = ul % a.ns;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    mbar_wait(full + slot, uint32_t(ul / a.ns) & 1u);
    if (un.e >= 0) {
      const ExpertPtrs& ep = p.experts[un.e];
      const uint8_t* st = smem + slot * stage_bytes + warp * ks;
      // B column g = the unit's row min(g, nrows - 1).
      const int rg = un.begin + min(g, un.nrows - 1);
      const __half* xr = xs + int64_t((p.x_rows ? p.x_rows[rg] : rg / div) - r0) * K + warp * ks;
      // Block scales: kSwiglu rows g (W1) and g + 8 (W3) of output row 8 grp + g; kDown all
      // 16 rows in one 128-row block.
      const int srow = ((grp * (kSw ? 8 : 16)) / 128) * p.s_cols + warp * (ks / 128);
      const float* sc0 = (kSw ? ep.s1 : ep.s2) + srow;
      const float* sc1 = (kSw ? ep.s3 : ep.s2) + srow;
      for (int ch = 0; ch < nch; ++ch) {
        // One accumulator per 64-column step (two independent mma chains); CVT 2: [1] holds
        // the integer-converted half (x 2^-8).
        float part[2][4] = {};
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int col = ch * 128 + s * 64 + q * 16;
          const uint4 xa = *reinterpret_cast<const uint4*>(xr + col);
          const uint4 xb = *reinterpret_cast<const uint4*>(xr + col + 8);
          const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          const uint4 lo = *reinterpret_cast<const uint4*>(st + g * K + col);
          const uint4 hi = *reinterpret_cast<const uint4*>(st + (g + 8) * K + col);
#pragma unroll
          for (int k4 = 0; k4 < 4; ++k4) {
            const uint32_t wl = k4 == 0 ? lo.x : k4 == 1 ? lo.y : k4 == 2 ? lo.z : lo.w;
            const uint32_t wh = k4 == 0 ? hi.x : k4 == 1 ? hi.y : k4 == 2 ? hi.z : hi.w;
            const bool alu = CVT == 1 || (CVT == 2 && (k4 & 1));
            uint32_t af[4];
            if (alu) {
              af[0] = fp8x2_h2_alu(wl, false), af[1] = fp8x2_h2_alu(wh, false);
              af[2] = fp8x2_h2_alu(wl, true), af[3] = fp8x2_h2_alu(wh, true);
            } else {
              af[0] = fp8x2_to_h2(wl), af[1] = fp8x2_to_h2(wh);
              af[2] = fp8x2_to_h2(wl >> 16), af[3] = fp8x2_to_h2(wh >> 16);
            }
            mma_f16(part[CVT == 2 ? (k4 & 1) : s], af, xw[2 * k4], xw[2 * k4 + 1]);
          }
        }
        // CVT 1: both parts x 2^-8; CVT 2: part[1] x 2^-8.
        const float f0 = CVT == 1 ? 256.f : 1.f, f1 = CVT == 0 ? 1.f : 256.f;
        const float s0 = __ldg(sc0 + ch), s1 = __ldg(sc1 + ch);
        acc[0] = fmaf(fmaf(part[1][0], f1, part[0][0] * f0), s0, acc[0]);
        acc[1] = fmaf(fmaf(part[1][1], f1, part[0][1] * f0), s0, acc[1]);
        acc[2] = fmaf(fmaf(part[1][2], f1, part[0][2] * f0), s1, acc[2]);
        acc[3] = fmaf(fmaf(part[1][3], f1, part[0][3] * f0), s1, acc[3]);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + slot);
    // The W slice partials. Tile table: red[ul & 1][warp][j][lane]. Direct pairs (column 0
    // only: lanes q == 0, acc[0] = row g, acc[2] = row g + 8): red[ul & 1][warp][g * 2 + h].
    float* rb = red + (ul & 1) * W * (compact ? 16 : 128);
    if (compact) {
      if (q == 0) {
        rb[warp * 16 + g * 2] = acc[0];
        rb[warp * 16 + g * 2 + 1] = acc[2];
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) rb[warp * 128 + j * 32 + lane] = acc[j];
    }
    consumers_sync(kThreads);
    if (warp != ul % W) continue;  // the unit's finishing warp rotates
    if (compact) {
      if (q == 0) {
        float v0 = 0.f, v1 = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) v0 += rb[w * 16 + g * 2], v1 += rb[w * 16 + g * 2 + 1];
        acc[0] = v0, acc[2] = v1;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) v += rb[w * 128 + j * 32 + lane];
        acc[j] = v;
      }
    }
    // C fragment: acc[0..1] = row g, B columns 2q, 2q + 1; acc[2..3] = row g + 8.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int tok = 2 * q + j;
      if (tok >= un.nrows) continue;
      const int r = un.begin + tok;
      if (kSw) {
        if (un.e >= 0)
          static_cast<bf16*>(p.out)[int64_t(r) * p.ldo + grp * 8 + g] = f2bf(silu(acc[j]) * acc[2 + j]);
      } else {
        const float sc = p.row_scale[r];
        float* o = static_cast<float*>(p.out) + int64_t(r) * p.ldo + grp * 16 + g;
        o[0] = acc[j] * sc;
        o[8] = acc[2 + j] * sc;
      }
    }
  }
  if (kSw || !p.combine_out || !p.pair_ids) return;
  // Direct pairs: fused combine (threadfence-reduction pattern), once per block after all its
  // units (a fence + counter round trip per unit on the finishing warp's path measured ~3.7
  // us per 24 KB unit): each unit bumps counters[token][row group]; the token's top_k-th
  // arrival sums the top_k pair rows of the group in k order.
  __threadfence();
  consumers_sync(kThreads);  // every pair row of the block is written and fenced
  int* flag = reinterpret_cast<int*>(red);  // W * 32 entries (the partials are done)
  for (int c0 = 0; c0 < nunits; c0 += kThreads) {
    const int ul = c0 + int(threadIdx.x);
    int last = 0;
    if (ul < nunits) {
      const int u = u0 + ul, pair = u / a.G, grp = u - pair * a.G;
      int* ctr = p.counters + int64_t(pair / p.top_k) * a.G + grp;
      last = atomicAdd(ctr, 1) == p.top_k - 1;
      if (last) *ctr = 0;  // ready for the next layer / replay
    }
    flag[threadIdx.x] = last;
    __threadfence();
    consumers_sync(kThreads);
    const int n = min(kThreads, nunits - c0);
    for (int j = warp; j < n; j += W) {
      if (!flag[j] || lane >= 16) continue;
      const int u = u0 + c0 + j, pair = u / a.G, grp = u - pair * a.G, token = pair / p.top_k;
      const int orow = grp * 16 + lane;
      const float* yp = static_cast<const float*>(p.out) + int64_t(token) * p.top_k * p.ldo + orow;
      float sum = 0.f;
      for (int k = 0; k < p.top_k; ++k) sum += __ldcg(yp + int64_t(k) * p.ldo);
      const int64_t o = int64_t(token) * p.N + orow;
      if (p.combine_bf16)
        static_cast<bf16*>(p.combine_out)[o] = f2bf(sum);
      else
        static_cast<float*>(p.combine_out)[o] = sum;
    }
    consumers_sync(kThreads);  // flags are rewritten by the next chunk
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

// Consumer warps: the first of {8, 6, 4, 2, 1} (kSwiglu) / {4, 8, 6, 2, 1} (kDown) that cuts K
// into slices of whole 128-column blocks. MOESERVE_MOE_GEMV_WARPS_UP / _DOWN override (A/B).
// MOESERVE_MOE_GEMV_SMEM (KB; default 110, so that a gate/up block (2 x 48 KB stages at
// M2.5 widths) and a down block (4 x 24 KB) fit on one SM together): shared-memory budget per
// block; at least 2 stages.
bool plan(const LinParams& p, int x_rows_total, Plan& pl) {
  const bool sw = p.mode == LinMode::kSwiglu, direct = p.pair_ids != nullptr;
  static const int env_w_up = env_int("MOESERVE_MOE_GEMV_WARPS_UP", 0);
  static const int env_w_dn = env_int("MOESERVE_MOE_GEMV_WARPS_DOWN", 0);
  static const int env_kb = env_int("MOESERVE_MOE_GEMV_SMEM", 0);
  const int env_w = sw ? env_w_up : env_w_dn;
  const int prefs[5] = {sw ? 8 : 4, sw ? 6 : 8, sw ? 4 : 6, 2, 1};
  int W = 0;
  if (env_w == 1 || env_w == 2 || env_w == 4 || env_w == 6 || env_w == 8) {
    if (p.K % (128 * env_w) == 0) W = env_w;
  }
  for (int i = 0; i < 5 && !W; ++i)
    if (p.K % (128 * prefs[i]) == 0) W = prefs[i];
  if (!W) return false;
  StreamArgs& a = pl.a;
  a.p = p;
  a.G = p.N / (sw ? 8 : 16);
  a.ks = p.K / W;
  // Units: direct pairs M * G; tile table at most max_tiles * G (the kernel reads *num_tiles).
  const int64_t U = int64_t(direct ? p.M : p.max_tiles) * a.G;
  if (U <= 0 || U >= (int64_t(1) << 31) / 2) return false;
  pl.grid = int(std::min<int64_t>(U, int64_t(num_sms_cached())));
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
  const size_t stage = size_t(kRows) * p.K, xs = size_t(a.xr) * p.K * 2;
  const size_t red = size_t(2) * W * (direct ? 16 : 128) * 4;
  const size_t budget = size_t(env_kb > 0 ? env_kb : 110) * 1024;
  const size_t fixed = xs + red + 2 * 16 * 8;
  int ns = fixed < budget ? int((budget - fixed) / stage) : 0;
  ns = std::min(8, std::max(2, ns));
  if (ns * stage + fixed > kMaxSmem) return false;
  a.ns = ns;
  a.xs_off = int(ns * stage);
  a.red_off = int(a.xs_off + xs);
  a.bar_off = int(a.red_off + red);
  pl.W = W;
  pl.smem = size_t(a.bar_off) + size_t(2) * ns * 8;
  return true;
}

template <int MODE, int W, int CVT>
void launch_w(const Plan& pl, cudaStream_t s) {
  auto* k = moe_gemv_stream_kernel<MODE, W, CVT>;
  static int configured = -1;  // device the attribute was set for
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (configured != dev) {
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
    configured = dev;
  }
  launch_pdl(k, dim3(pl.grid), dim3((W + 1) * 32), pl.smem, s, pl.a);
  CUDA_CHECK_LAUNCH();
}

template <int MODE, int CVT>
void launch_mode(const Plan& pl, cudaStream_t s) {
  switch (pl.W) {
    case 8: launch_w<MODE, 8, CVT>(pl, s); break;
    case 6: launch_w<MODE, 6, CVT>(pl, s); break;
    case 4: launch_w<MODE, 4, CVT>(pl, s); break;
    case 2: launch_w<MODE, 2, CVT>(pl, s); break;
    default: launch_w<MODE, 1, CVT>(pl, s); break;
  }
}
template <int MODE>
void launch_cvt(const Plan& pl, cudaStream_t s) {
  if (g_moe_gemv_cvt == 1)
    launch_mode<MODE, 1>(pl, s);
  else if (g_moe_gemv_cvt == 2)
    launch_mode<MODE, 2>(pl, s);
  else
    launch_mode<MODE, 0>(pl, s);
}

}  // namespace

bool moe_gemv_stream_supported(const LinParams& p, int x_rows_total) {
  if (p.mode != LinMode::kSwiglu && p.mode != LinMode::kDown) return false;
  if (!p.experts || !p.fp8 || p.bo != 128 || p.bi != 128 || p.K <= 0 || p.K % 128 != 0) return false;
  if (p.N % (p.mode == LinMode::kSwiglu ? 8 : 16) != 0 || p.ldx % 8 != 0 || p.M <= 0) return false;
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
    launch_cvt<int(LinMode::kSwiglu)>(pl, s);
  else
    launch_cvt<int(LinMode::kDown)>(pl, s);
}

}  // namespace moeserve::cuda
