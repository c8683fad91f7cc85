// Fused decode attention, version 2 (sm_90+): the same work as k_attn_decode.cu (QK-norm +
// partial NeoX RoPE of this step's q and k, the paged KV write, split-KV GQA attention, the
// split merge through distributed shared memory), organised for latency at small batches:
//
// * Grid (splits, kv heads, sequences); the `splits` (1..16) blocks of a (sequence, kv head)
//   form a cluster (16: non-portable size, used only when the device can co-schedule the
//   clusters). Block: W = 8 warps (or 4, see Smem2). The block's key range is cut into 16-key
//   chunks; warp w owns chunks w, w + W, ... and streams them through its OWN 2-stage cp.async
//   ring (8 KB per stage: 16 K rows + 16 V rows of 128 bf16, 16-byte chunks XOR-swizzled by
//   row), so the key loop has no block-wide barrier. Both stages are issued before griddepcontrol.wait (block
//   tables and K/V of positions < ctx - 1 are not written by the step's earlier kernels, as in
//   k_attn_decode.cu); the newest key (ctx - 1, made here) is never copied: the owning warp
//   writes it into its staged chunk after the prologue.
// * Prologue after the wait: ONE round of global loads per thread (the whole q row for the
//   QK-norm sum of squares in fixed-trip 16-byte loads, one 16-byte chunk of the k row, this
//   kv head's v, position and slot). One block reduction, then this kv head's q rows are
//   normalised and rotated in the registers that loaded them (the RoPE partner chunk comes by
//   shuffle) into a bf16 tile; norm weights and RoPE frequencies were loaded before the wait.
// * QK and PV on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate): the G <= 8 q rows are
//   the A operand's rows 0..7 (rows 8..15 are zero registers), K fragments come from ldmatrix,
//   V fragments from ldmatrix.trans, P is reused from the S accumulators as bf16. Softmax in
//   base 2 with fp32 running max / sum (FlashAttention-2 style, row sums per lane, reduced once).
//   Numerics against version 1: q and k rounded to bf16 after norm + RoPE as before, the
//   softmax scale applied to the fp32 scores; P rounded to bf16 for the PV product (version 1
//   kept P in fp32).
// * Merge: the W warps' partial (m, l, o) per row are merged in shared memory into one block
//   partial (per-row, per-warp factors), then each block of the cluster merges a slice of the
//   G x 128 outputs from all blocks' partials: pushed into the slice owner's shared memory by
//   remote stores (default), or pulled with every remote load issued at once (see the kernel).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kD = 128, kRows = 8, kChunk = 16, kStages = 2, kMaxSplits = 16;
constexpr int kMaxQWidth = 64 * kD;  // Hq <= 64: the q row in fixed-trip 16-byte loads

// W warps per block (8, or 4: ~84 KB and 128 threads, small enough to become resident next
// to the q/k/v GEMV's blocks, so the pre-wait part overlaps it).
template <int W>
struct Smem2 {
  static constexpr int kW = W;
  // Per warp and stage: K rows [16][128] then V rows [16][128] (bf16, swizzled 16-byte chunks).
  // After the key loop a warp's region holds its partial output [8][128] fp32 (4 KB of 16 KB).
  __align__(128) bf16 ring[kW][kStages][2][kChunk][kD];
  float pml[kW][kRows][2];  // per warp: (max, sum) per row, base 2
  __align__(16) float pb[kRows][kD];  // block partial output (unnormalised), read by the cluster
  float fac[kRows][kW];     // per row and warp: 2^(m_warp - m_block)
  float pmlb[kRows][2];     // block partial (max, sum)
  // Push merge: block b's partial for this block's output slice lands at recv_o[b * slice + i]
  // and its (max, sum) per row at recv_ml[b] (written by the peers through DSMEM).
  __align__(16) float recv_o[kRows * kD + kMaxSplits];
  float recv_ml[kMaxSplits][kRows][2];
  __align__(16) bf16 qb[kRows][kD + 8];  // normed, rotated, bf16 q rows (+8: conflict-free)
  __align__(16) bf16 kraw[kD], vraw[kD];
  __align__(16) bf16 knew[kD], vnew[kD];  // the newest key / value (normed, rotated) as cached
  float qw[kRows * kD], kw[kD];           // norm weights of this kv head's rows
  float inv_freq[kD / 2], cs[kD / 2], sn[kD / 2];
  float red[2][kW];
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
// D = A B + D for one m16n8k16 bf16 tile; a1 = a3 = 0 (rows 8..15 of A are padding), so only
// the accumulators of rows 0..7 (d0, d1) matter; d2, d3 are scratch.
__device__ __forceinline__ void mma_rows8(float& d0, float& d1, uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  float d2 = 0.f, d3 = 0.f;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// Offset (in bf16) of element (row, col) of a swizzled [16][128] chunk tile.
__device__ __forceinline__ int swz(int row, int col) { return row * kD + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7); }

// Phase timer (diagnostics; attn_decode2_timing): thread 0 of block b < kTimerBlocks stores
// clock64() at the phase ends 1..8 and globaltimer at entry (slot 0) and exit (slot 9).
constexpr int kTimerBlocks = 512, kTimerSlots = 10;
__device__ unsigned long long g_timer[kTimerBlocks][kTimerSlots];
__device__ int g_timing;
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long v;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(v));
  return v;
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// PUSH (default): every block merges its 8 warps' partials and stores each output slice's
// share straight into the owning peer's shared memory (remote stores, no round trip), one
// cluster barrier, then each block merges its slice from local memory; the only other
// barrier phase is an arrive at entry (DSMEM may be written only once every peer runs) whose
// wait comes before the first remote store. !PUSH: block partials stay local, cluster.sync,
// every block loads its slice's partials from all peers (all loads issued at once), and a
// second cluster.sync keeps each block alive while peers read it.
template <bool PUSH, int W>
__global__ void __launch_bounds__(W * 32, 1) attn_decode2_kernel(AttnParams a, QkNormRopeParams n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kW = W, kT = W * 32, kMaxQ16 = kMaxQWidth / 8 / kT;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem2<W>& S = *reinterpret_cast<Smem2<W>*>(smem_raw);
  const int splits = gridDim.x, split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int G = a.Hq / a.Hkv, row_stride = a.Hkv * kD;
  if (PUSH && splits > 1) cluster_arrive_relaxed();  // "this block runs" (waited before the pushes)
  const int tb = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const bool timing = g_timing && tid == 0 && tb < kTimerBlocks;
  const unsigned long long c0 = clock64();
  if (timing) g_timer[tb][0] = gtime();
#define TSTAMP(i) \
  if (timing) g_timer[tb][i] = clock64() - c0;

  // ---- graph inputs and constants (safe before the wait, see the header) ----
  const int t = a.query_start[seq];
  const int ctx = a.context_lens[seq];
  const int newest = ctx - 1;
  const int span = ((ctx + splits - 1) / splits + kChunk - 1) / kChunk * kChunk;
  const int kbeg = split * span, kend = min(ctx, kbeg + span);
  const int nchunks = kend > kbeg ? (kend - kbeg + kChunk - 1) / kChunk : 0;
  const int my_chunks = nchunks > warp ? (nchunks - warp + kW - 1) / kW : 0;  // chunks warp + 8 i
  const int32_t* btab = a.block_tables + int64_t(seq) * a.max_blocks_per_seq;
  const bf16* kcache = static_cast<const bf16*>(a.k_cache);
  const bf16* vcache = static_cast<const bf16*>(a.v_cache);

  // Issues the copies of the warp's i-th chunk into stage i % 2 (always commits a group, so
  // the wait counts stay uniform). Lane l < 16 resolves the cache row of key l of the chunk;
  // lane l copies 16-byte column chunk l % 16 of rows l / 16 + 2 r (r = 0..7) of K and V.
  // Keys >= kend are zero-filled (their P is 0, and 0 x garbage could be NaN); the newest key
  // is left for the patch.
  auto issue = [&](int i) {
    if (i < my_chunks) {
      const int k0 = kbeg + (warp + i * kW) * kChunk;
      int prow = -1;
      if (lane < kChunk) {
        const int j = k0 + lane;
        if (j < kend && j != newest) prow = btab[j / a.block_size] * a.block_size + j % a.block_size;
      }
      bf16* kb = &S.ring[warp][i % kStages][0][0][0];
      bf16* vb = &S.ring[warp][i % kStages][1][0][0];
      const int c = lane & 15;
#pragma unroll
      for (int r = 0; r < kChunk / 2; ++r) {
        const int row = (lane >> 4) + 2 * r;
        const int pr = __shfl_sync(0xffffffffu, prow, row);
        const int64_t off = int64_t(max(pr, 0)) * row_stride + kvh * kD + c * 8;
        cp_async16(smem_u32(kb + swz(row, c * 8)), kcache + off, pr >= 0);
        cp_async16(smem_u32(vb + swz(row, c * 8)), vcache + off, pr >= 0);
      }
    }
    cp_commit();
  };
  // L2 prefetch of the next ops' weights (a hint, as in k_attn_decode.cu).
  if (warp == 0) {
    const int nblk = gridDim.x * gridDim.y * gridDim.z;
    const int b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
#pragma unroll
    for (int i = 0; i < AttnParams::kMaxPf; ++i) {
      if (!a.pf_ptr[i]) continue;
      const uint64_t total = a.pf_bytes[i] / 16 * 16, slice = (total / nblk + 15) / 16 * 16;
      const uint64_t beg = min(total, uint64_t(b) * slice), end = min(total, beg + slice);
      for (uint64_t off = beg + uint64_t(lane) * 65536; off < end; off += 32ull * 65536) {
        const uint32_t nb = uint32_t(min(uint64_t(65536), end - off));
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(a.pf_ptr[i]) + off),
                     "r"(nb)
                     : "memory");
      }
    }
  }
  // Norm weights of this kv head's q rows / k row (loads issued ahead of the K/V copies,
  // whose addresses wait for the block table), then the RoPE frequencies (fp32 like the
  // reference implementations; double pow here, before the wait).
  {
    const bf16* qw = static_cast<const bf16*>(n.q_w) + int64_t(kvh) * G * kD;
    const bf16* kw = static_cast<const bf16*>(n.k_w) + int64_t(kvh) * kD;
    float wv[kRows * kD / kT];  // fixed trip count: every load issued before the first store
#pragma unroll
    for (int i = 0; i < kRows * kD / kT; ++i) wv[i] = tid + i * kT < G * kD ? bf2f(qw[tid + i * kT]) : 0.f;
#pragma unroll
    for (int i = 0; i < kRows * kD / kT; ++i) S.qw[tid + i * kT] = wv[i];
    if (tid < kD) S.kw[tid] = bf2f(kw[tid]);
  }
#pragma unroll
  for (int i = 0; i < kStages; ++i) issue(i);
  if (tid < n.rotary_dim / 2)
    S.inv_freq[tid] = float(1.0 / pow(double(n.theta), double(2 * tid) / double(n.rotary_dim)));
  TSTAMP(1);  // before the wait: copies issued, constants loaded
  for (int i = tid; i < (kRows - G) * (kD + 8) / 2; i += kT) reinterpret_cast<uint32_t*>(&S.qb[G][0])[i] = 0u;
  pdl_enter();
  TSTAMP(2);

  // ---- prologue: one round of loads (q row, k row chunk, this head's v, position) ----
  const bf16* qrow = static_cast<const bf16*>(n.q) + int64_t(t) * n.q_width;
  const bf16* krow = static_cast<const bf16*>(n.k) + int64_t(t) * n.k_width;
  const bf16* vrow = static_cast<const bf16*>(n.v) + int64_t(t) * n.k_width;
  const int nq16 = n.q_width / 8, nk16 = n.k_width / 8;
  uint4 qv[kMaxQ16], kv4 = make_uint4(0, 0, 0, 0), vv4 = kv4;
  const bool need_qss = !n.q_sumsq, need_kss = !n.k_sumsq;
#pragma unroll
  for (int i = 0; i < kMaxQ16; ++i) {
    const int idx = tid + i * kT;
    const bool own = idx >= kvh * G * (kD / 8) && idx < (kvh + 1) * G * (kD / 8);
    qv[i] = idx < nq16 && (need_qss || own) ? *reinterpret_cast<const uint4*>(qrow + idx * 8) : make_uint4(0, 0, 0, 0);
  }
  if (tid < nk16) kv4 = *reinterpret_cast<const uint4*>(krow + tid * 8);
  if (tid < kD / 8) vv4 = *reinterpret_cast<const uint4*>(vrow + kvh * kD + tid * 8);
  const float pos = float(n.positions[t]);
  const int64_t slot = n.slots[t];
  const float qss_in = need_qss ? 0.f : n.q_sumsq[t], kss_in = need_kss ? 0.f : n.k_sumsq[t];
  float qss = 0.f, kss = 0.f;
  auto sumsq = [](const uint4& v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = bf16x2_to_f2(w[e]);
      s = fmaf(f.x, f.x, fmaf(f.y, f.y, s));
    }
    return s;
  };
#pragma unroll
  for (int i = 0; i < kMaxQ16; ++i) qss += sumsq(qv[i]);
  kss = sumsq(kv4);
  if (tid >= kvh * (kD / 8) && tid < (kvh + 1) * (kD / 8)) reinterpret_cast<uint4*>(S.kraw)[tid - kvh * (kD / 8)] = kv4;
  if (tid < kD / 8) reinterpret_cast<uint4*>(S.vraw)[tid] = vv4;
  if (tid < n.rotary_dim / 2) sincosf(pos * S.inv_freq[tid], &S.sn[tid], &S.cs[tid]);
  qss = warp_sum(qss), kss = warp_sum(kss);
  if (lane == 0) S.red[0][warp] = qss, S.red[1][warp] = kss;
  __syncthreads();  // raw rows, sums, sin/cos, weights
  TSTAMP(3);
  qss = qss_in, kss = kss_in;
  if (need_qss || need_kss) {
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int w = 0; w < kW; ++w) sq += S.red[0][w], sk += S.red[1][w];
    if (need_qss) qss = sq;
    if (need_kss) kss = sk;
  }
  const float rq = rsqrtf(qss / float(n.q_full) + n.eps), rk = rsqrtf(kss / float(n.k_full) + n.eps);
  const int half = n.rotary_dim / 2;
  // Element d of a head (raw row x, weights w, factor r) after norm + RoPE, as bf16 (the new k).
  auto normed = [&](const bf16* x, const float* w, float r, int d) {
    if (d >= n.rotary_dim) return f2bf(bf2f(x[d]) * r * w[d]);
    const int d0 = d < half ? d : d - half;
    const float cs = S.cs[d0], sn = S.sn[d0];
    const float u = bf2f(x[d0]) * r * w[d0], v = bf2f(x[d0 + half]) * r * w[d0 + half];
    return f2bf(d < half ? u * cs - v * sn : v * cs + u * sn);
  };
  // This kv head's q rows straight from the registers that loaded them: the thread holding
  // 16-byte chunk c (dims 8c..8c+7) of a head row gets the RoPE partner chunk (c +- half / 8,
  // in the same 16-lane group) by shuffle. Same arithmetic as `normed`.
  {
    const int pc = half / 8, c = lane & 15;  // rotary_dim % 16 == 0 (attn_decode2_supported)
    const int src = c < pc ? lane + pc : (c < 2 * pc ? lane - pc : lane);
#pragma unroll
    for (int i = 0; i < kMaxQ16; ++i) {
      const uint32_t xw[4] = {qv[i].x, qv[i].y, qv[i].z, qv[i].w};
      uint32_t pw[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) pw[e] = __shfl_sync(0xffffffffu, xw[e], src);
      const int rel = tid + i * kT - kvh * G * (kD / 8);
      if (rel < 0 || rel >= G * (kD / 8)) continue;
      const int r = rel / (kD / 8);
      const float* w = S.qw + r * kD;
      uint32_t ow[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 xf = bf16x2_to_f2(xw[e]), pf = bf16x2_to_f2(pw[e]);
        float res[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int d = 8 * c + 2 * e + h;
          const float xv = h ? xf.y : xf.x, pv = h ? pf.y : pf.x;
          if (d >= n.rotary_dim) {
            res[h] = xv * rq * w[d];
          } else if (d < half) {
            const float u = xv * rq * w[d], v = pv * rq * w[d + half];
            res[h] = u * S.cs[d] - v * S.sn[d];
          } else {
            const float u = pv * rq * w[d - half], v = xv * rq * w[d];
            res[h] = v * S.cs[d - half] + u * S.sn[d - half];
          }
        }
        ow[e] = pack_bf16(res[0], res[1]);
      }
      *reinterpret_cast<uint4*>(&S.qb[r][8 * c]) = make_uint4(ow[0], ow[1], ow[2], ow[3]);
    }
  }
  const bool has_new = newest >= kbeg && newest < kend;  // this block owns the newest key
  if (has_new && tid < kD) {
    const bf16 kn = normed(S.kraw, S.kw, rk, tid), vn = S.vraw[tid];
    S.knew[tid] = kn, S.vnew[tid] = vn;
    if (slot >= 0 && slot < n.num_slots) {
      static_cast<bf16*>(n.kc)[slot * n.k_width + kvh * kD + tid] = kn;
      static_cast<bf16*>(n.vc)[slot * n.k_width + kvh * kD + tid] = vn;
    }
  }
  __syncthreads();  // qb, knew
  TSTAMP(4);

  // ---- key loop: the warp's chunks through its own 2-stage ring ----
  uint32_t qa[kD / 16][2];  // A fragments of q (rows g; rows g + 8 are zero)
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    qa[ks][0] = *reinterpret_cast<const uint32_t*>(&S.qb[g][16 * ks + 2 * t4]);
    qa[ks][1] = *reinterpret_cast<const uint32_t*>(&S.qb[g][16 * ks + 8 + 2 * t4]);
  }
  const float qscale = a.scale * 1.4426950408889634f;  // log2(e): softmax in base 2
  float o[kD / 8][2];  // row g, columns 8 j + 2 t4, + 1
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) o[j][0] = o[j][1] = 0.f;
  float m = -INFINITY, l = 0.f;  // l: this lane's share of the row sum
  for (int i = 0; i < my_chunks; ++i) {
    cp_wait<kStages - 1>();
    __syncwarp();
    const int k0 = kbeg + (warp + i * kW) * kChunk;
    const bf16* kb = &S.ring[warp][i % kStages][0][0][0];
    const bf16* vb = &S.ring[warp][i % kStages][1][0][0];
    if (newest >= k0 && newest < k0 + kChunk) {  // patch the newest key into the staged chunk
      const int row = newest - k0;
#pragma unroll
      for (int e = lane; e < kD; e += 32) {
        const_cast<bf16*>(kb)[swz(row, e)] = S.knew[e];
        const_cast<bf16*>(vb)[swz(row, e)] = S.vnew[e];
      }
      __syncwarp();
    }
    // S = q K^T for the chunk's 16 keys: two n-tiles of 8 keys, 8 k-steps of 16 dims.
    float s[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int kp = 0; kp < kD / 32; ++kp) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(smem_u32(kb + swz(8 * j + (lane & 7), 32 * kp + 8 * (lane >> 3))), b0, b1, b2, b3);
        mma_rows8(s[j][0], s[j][1], qa[2 * kp][0], qa[2 * kp][1], b0, b1);
        mma_rows8(s[j][0], s[j][1], qa[2 * kp + 1][0], qa[2 * kp + 1][1], b2, b3);
      }
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = k0 + 8 * j + 2 * t4 + e;
        s[j][e] = key < kend ? s[j][e] * qscale : -INFINITY;
        mx = fmaxf(mx, s[j][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);  // finite: the chunk's first key is < kend
    const float corr = exp2f(m - mn);
    m = mn;
    float p[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) p[j][e] = exp2f(s[j][e] - mn);
    l = l * corr + (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
    const uint32_t pa0 = pack_bf16(p[0][0], p[0][1]), pa2 = pack_bf16(p[1][0], p[1][1]);
    // O += P V: 16 n-tiles of 8 dims, one k-step of the chunk's 16 keys.
#pragma unroll
    for (int jp = 0; jp < kD / 16; ++jp) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_t(smem_u32(vb + swz((lane & 7) + 8 * ((lane >> 3) & 1), 16 * jp + 8 * (lane >> 4))), b0, b1, b2, b3);
      o[2 * jp][0] *= corr, o[2 * jp][1] *= corr, o[2 * jp + 1][0] *= corr, o[2 * jp + 1][1] *= corr;
      mma_rows8(o[2 * jp][0], o[2 * jp][1], pa0, pa2, b0, b1);
      mma_rows8(o[2 * jp + 1][0], o[2 * jp + 1][1], pa0, pa2, b2, b3);
    }
    __syncwarp();  // every lane done with the stage before it is refilled
    issue(i + kStages);
  }
  cp_wait<0>();
  __syncwarp();
  TSTAMP(5);  // warp 0's key loop done
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // ---- warp partials -> block partial (shared memory) ----
  float* po = reinterpret_cast<float*>(&S.ring[warp][0][0][0][0]);  // [8][128] in the warp's own ring
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
    *reinterpret_cast<float2*>(&po[g * kD + 8 * j + 2 * t4]) = make_float2(o[j][0], o[j][1]);
  if (t4 == 0) S.pml[warp][g][0] = m, S.pml[warp][g][1] = l;
  __syncthreads();
  cg::cluster_group cluster = cg::this_cluster();
  const int total = G * kD, slice = (total + splits - 1) / splits;
  TSTAMP(6);  // all warps' partials written
  // Per (row, warp) rescale factors and the block's (max, sum) per row: threads 0..63, one
  // 8-lane group per row.
  float rowM = -INFINITY, rowL = 0.f;
  if (tid < kRows * kW) {
    const int r = tid / kW, w = tid % kW;
    const float mw = S.pml[w][r][0];
    rowM = mw;
#pragma unroll
    for (int o = 1; o < kW; o <<= 1) rowM = fmaxf(rowM, __shfl_xor_sync(0xffffffffu, rowM, o));
    const float sc = mw == -INFINITY ? 0.f : exp2f(mw - rowM);
    rowL = S.pml[w][r][1] * sc;
#pragma unroll
    for (int o = 1; o < kW; o <<= 1) rowL += __shfl_xor_sync(0xffffffffu, rowL, o);
    S.fac[r][w] = sc;
    if (!PUSH && w == 0) S.pmlb[r][0] = rowM, S.pmlb[r][1] = rowL;
  }
  if constexpr (PUSH) {
    if (splits > 1) cluster_wait();  // every peer has started (the entry arrive): DSMEM writable
    if (tid < kRows * kW && tid % kW == 0) {
      // Row r's (max, sum) to every block whose slice holds part of row r.
      const int r = tid / kW;
      for (int b = r * kD / slice; b <= min(splits - 1, (r * kD + kD - 1) / slice); ++b) {
        float* rml = splits > 1 ? cluster.map_shared_rank(&S.recv_ml[0][0][0], b) : &S.recv_ml[0][0][0];
        rml[(split * kRows + r) * 2] = rowM, rml[(split * kRows + r) * 2 + 1] = rowL;
      }
    }
  }
  __syncthreads();  // fac
  for (int e = 4 * tid; e < total; e += 4 * kT) {  // 4 consecutive outputs of one row
    const int r = e / kD;
    float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      const float sc = S.fac[r][w];
      const float4 v = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(&S.ring[w][0][0][0][0]) + e);
      O.x = fmaf(v.x, sc, O.x), O.y = fmaf(v.y, sc, O.y), O.z = fmaf(v.z, sc, O.z), O.w = fmaf(v.w, sc, O.w);
    }
    if constexpr (PUSH) {
      const int dst = e / slice;  // slice % 4 == 0: the 4 outputs go to one block
      float* ro = splits > 1 ? cluster.map_shared_rank(S.recv_o, dst) : S.recv_o;
      *reinterpret_cast<float4*>(ro + split * slice + (e - dst * slice)) = O;
    } else {
      *reinterpret_cast<float4*>(&S.pb[r][e % kD]) = O;
    }
  }

  bf16* out = static_cast<bf16*>(a.out) + (int64_t(t) * a.Hq + int64_t(kvh) * G) * kD;
  TSTAMP(7);  // block merge (and pushes) done
  if constexpr (PUSH) {
    // ---- every block's share of this block's slice has arrived: merge it locally ----
    if (splits > 1) {
      cluster_arrive();
      cluster_wait();
    } else {
      __syncthreads();
    }
    TSTAMP(8);
    for (int i = tid; i < slice; i += kT) {
      const int e = split * slice + i;
      if (e >= total) break;
      const int r = e / kD;
      float M = -INFINITY;
#pragma unroll
      for (int b = 0; b < kMaxSplits; ++b)
        if (b < splits) M = fmaxf(M, S.recv_ml[b][r][0]);
      float L = 0.f, O = 0.f;
      if (M != -INFINITY) {
#pragma unroll
        for (int b = 0; b < kMaxSplits; ++b) {
          if (b >= splits) continue;
          const float mb = S.recv_ml[b][r][0];
          const float sc = mb == -INFINITY ? 0.f : exp2f(mb - M);
          L = fmaf(S.recv_ml[b][r][1], sc, L);
          O = fmaf(S.recv_o[b * slice + i], sc, O);
        }
      }
      out[e] = f2bf(L > 0.f ? O / L : 0.f);
    }
  } else {
    // ---- pull: block `split` merges outputs split * kT + tid, + splits * kT, ... ----
    if (splits > 1) cluster.sync();
    else __syncthreads();
    TSTAMP(8);
    for (int e = split * kT + tid; e < total; e += splits * kT) {
      const int r = e / kD, d = e % kD;
      float mb[kMaxSplits], lb[kMaxSplits], ob[kMaxSplits];
#pragma unroll
      for (int b = 0; b < kMaxSplits; ++b) {
        if (b < splits) {
          const Smem2<W>* ps = splits > 1 ? cluster.map_shared_rank(&S, b) : &S;
          mb[b] = ps->pmlb[r][0], lb[b] = ps->pmlb[r][1], ob[b] = ps->pb[r][d];
        } else {
          mb[b] = -INFINITY, lb[b] = 0.f, ob[b] = 0.f;
        }
      }
      float M = -INFINITY;
#pragma unroll
      for (int b = 0; b < kMaxSplits; ++b) M = fmaxf(M, mb[b]);
      float L = 0.f, O = 0.f;
      if (M != -INFINITY) {
#pragma unroll
        for (int b = 0; b < kMaxSplits; ++b) {
          const float sc = mb[b] == -INFINITY ? 0.f : exp2f(mb[b] - M);
          L = fmaf(lb[b], sc, L);
          O = fmaf(ob[b], sc, O);
        }
      }
      out[e] = f2bf(L > 0.f ? O / L : 0.f);
    }
    if (splits > 1) cluster.sync();  // no block leaves while a peer still reads its partial
  }
  if (timing) g_timer[tb][9] = gtime();
#undef TSTAMP
#endif
}

}  // namespace

bool attn_decode2_supported(const AttnParams& a, const QkNormRopeParams& n) {
  constexpr int warps = 8;
  return attn_decode_supported(a, n) && n.rotary_dim % 16 == 0 &&
         n.q_width <= kMaxQWidth && n.k_width <= 8 * 32 * warps;
}

int attn_decode2_splits(int num_sms, int kv_groups, int max_context, int max_splits) {
  constexpr int warps = 8;
  // About one block per SM (~146 KB of shared memory at 8 warps), a power of two
  // <= max_splits, and >= 16 keys per warp (one chunk each) per block.
  const int want = std::max(1, num_sms / std::max(1, kv_groups));
  const int cap = std::min({want, max_splits, kMaxSplits});
  int s = 1;
  while (s * 2 <= cap && s * 2 * kChunk * warps <= max_context) s *= 2;
  return s;
}

namespace {
// Per-device state: the shared-memory opt-in and the largest cluster size (8 or 16) the
// device can co-schedule for `need` clusters.
std::atomic<uint64_t> g_attr_set{0};
void ensure_attrs() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (g_attr_set.load() & bit) return;
  auto* k = attn_decode2_kernel<true, 8>;
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem2<8>))));
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  g_attr_set.fetch_or(bit);
}
}  // namespace

int attn_decode2_max_cluster(int want) {
  ensure_attrs();
  if (want <= 8) return want;
  static std::atomic<int> cached[64] = {};  // per device: clusters + 1 (0: not asked yet)
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (const int c = cached[dev & 63].load()) return c - 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(16, 1, 1);
  cfg.blockDim = dim3(32 * 8);
  cfg.dynamicSmemBytes = sizeof(Smem2<8>);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 16, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, attn_decode2_kernel<true, 8>, &cfg);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  cached[dev & 63].store(clusters + 1);
  return clusters;  // the caller compares it with the clusters it needs
}

// Diagnostics (declared where used, not in kernels.h): turns the phase timer on or off and
// reads it back ([kTimerBlocks][kTimerSlots]).
void attn_decode2_timing(bool on) {
  const int v = on ? 1 : 0;
  CUDA_CHECK(cudaMemcpyToSymbol(g_timing, &v, sizeof(v)));
}
std::vector<unsigned long long> attn_decode2_read_timer() {
  std::vector<unsigned long long> t(size_t(kTimerBlocks) * kTimerSlots);
  CUDA_CHECK(cudaMemcpyFromSymbol(t.data(), g_timer, t.size() * sizeof(t[0])));
  return t;
}

void launch_attn_decode2(const AttnParams& a, const QkNormRopeParams& n, int splits, cudaStream_t s) {
  CU_REQUIRE(splits >= 1 && splits <= kMaxSplits, "attn_decode2: splits " + std::to_string(splits));
  if (a.T == 0) return;
  ensure_attrs();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(splits, a.Hkv, a.num_seqs);
  cfg.blockDim = dim3(32 * 8);
  cfg.dynamicSmemBytes = sizeof(Smem2<8>);
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int na = 0;
  attr[na].id = cudaLaunchAttributeClusterDimension;
  attr[na].val.clusterDim.x = splits, attr[na].val.clusterDim.y = 1, attr[na].val.clusterDim.z = 1;
  ++na;
  if (pdl_enabled()) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  // The pushed merge with 8 warps is the one built: the pulled merge and 4 warps measured no
  // faster (docs/bench/cuda_switch_inventory.md).
  auto* k = attn_decode2_kernel<true, 8>;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, a, n));
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kRows == limits::kDecodeRows && kMaxSplits == limits::kDecode2MaxSplits && kChunk == limits::kDecode2Chunk && kMaxQWidth == limits::kDecode2MaxQWidth);
}  // namespace moeserve::cuda
