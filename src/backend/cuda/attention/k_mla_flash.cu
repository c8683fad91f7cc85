// MLA attention over the latent cache in the absorbed form (kernels_mla.h: MlaFlashParams),
// FlashMLA-style: a CTA = (KV split, tile of 64 rows of one sequence, sequence), rows =
// (query token, head) with heads fastest, so decode's 64 heads (or 1 + k verify rows x H, or a
// prefill chunk) share every latent page the CTA streams: the cache is read once per row tile
// instead of once per head. Tensor cores (mma.sync m16n8k16 bf16 -> f32) for both products:
//   S [64 rows, 32 keys] = Q [64, LP] . K^T   (LP = 512 + 64 padded latent dims, scale folded into Q)
//   O [64 rows, 512]    += P [64, 32] . Kc    (the first 512 dims of the same tile are the values)
// 8 warps: warp w owns rows 16 (w & 3) .. +16; its half h = w >> 2 computes S for keys
// 16h .. 16h+16 and O for latent columns 256h .. 256h+256 (128 f32 accumulators per thread),
// so the S work is not duplicated; the two halves exchange row maxima and P through shared
// memory. K tiles of 32 keys are triple-buffered by cp.async (16-byte copies of bf16 rows, or
// 8-byte copies of e4m3 rows into a byte stage converted exactly to bf16 in shared memory; the
// per-tensor k_scale is applied to S and O in f32). Shapes below 512 / 64 are zero-padded.
// Split-KV: split k takes keys [k span, (k+1) span) of its tile's range and writes O / l and
// (max, sum) for k_mla_combine. No allocation, no host sync: graph-capturable.
#include <cuda_bf16.h>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/attention/kernels_mla.h"
#include "backend/cuda/linear/mma_bf16.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kCP = kMlaMaxC, kRP = kMlaMaxR, kLP = kCP + kRP;  // padded latent row: [c | rope]
constexpr int kBM = kMlaRowTile, kBN = 32, kWarps = 8, kThreads = kWarps * 32;
constexpr int kLd = kLP + 8;     // bf16 per shared row: 1,168 B, an odd multiple of 16 (no ldmatrix conflicts)
constexpr int kPLd = kBN + 8;    // P rows
constexpr int kChunks = kLP / 8; // 8-element chunks per padded row
constexpr int kOTiles = kCP / 2 / 8;  // n-tiles of 8 columns per warp (256 columns)
constexpr size_t kQElems = size_t(kBM) * kLd, kKElems = size_t(kBN) * kLd;
constexpr int kStages = 3;  // K tiles in flight: two ahead of the one being used
constexpr size_t kSmemBytes = (kQElems + kStages * kKElems + size_t(kBM) * kPLd) * 2 + (4 * kBM + 4) * sizeof(float);
static_assert(kStages * kBN * kLP <= int((kStages - 1) * kKElems * 2), "the e4m3 stages fit in K buffers 1..");


// Element offset in a latent row (C + R values) of padded dim d, or -1 for a padding dim.
__device__ __forceinline__ int src_dim(int d, int C, int R) {
  if (d < kCP) return d < C ? d : -1;
  return d - kCP < R ? C + (d - kCP) : -1;
}

// Copies chunk q (8 dims) of a latent row into a padded shared row (bf16 elements, or bytes
// for e4m3). vec: C and R are multiples of 8, so a chunk is all real or all padding and
// aligned (16 bytes bf16, 8 bytes e4m3); otherwise element by element (tiny test shapes).
template <bool kFp8>
__device__ __forceinline__ void copy_chunk(void* dst_row, const void* src_row, bool row_ok, int q, int C, int R,
                                           bool vec) {
  const int d = q * 8;
  if (vec) {
    const int sd = src_dim(d, C, R);
    const bool ok = row_ok && sd >= 0;
    if (kFp8)
      cp_async8(static_cast<uint8_t*>(dst_row) + d, static_cast<const uint8_t*>(src_row) + (ok ? sd : 0), ok);
    else
      cp_async16(static_cast<bf16*>(dst_row) + d, static_cast<const bf16*>(src_row) + (ok ? sd : 0), ok);
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int sd = src_dim(d + e, C, R);
    const bool ok = row_ok && sd >= 0;
    if (kFp8) static_cast<uint8_t*>(dst_row)[d + e] = ok ? static_cast<const uint8_t*>(src_row)[sd] : uint8_t(0);
    else static_cast<bf16*>(dst_row)[d + e] = ok ? static_cast<const bf16*>(src_row)[sd] : f2bf(0.f);
  }
}

// K tile `it` (keys kb .. kb + 32 of the sequence) into dst: bf16 rows of kLd, or e4m3 rows of kLP bytes.
template <bool kFp8>
__device__ __forceinline__ void load_k_tile(const MlaFlashParams& p, const int32_t* table, int kb, int kend,
                                            void* dst, bool vec) {
  const int L = p.C + p.R;
  for (int i = threadIdx.x; i < kBN * kChunks; i += kThreads) {
    const int key = i / kChunks, q = i % kChunks, j = kb + key;
    const bool ok = j < kend;
    const int64_t slot = ok ? int64_t(table[j / p.block_size]) * p.block_size + j % p.block_size : 0;
    if (kFp8)
      copy_chunk<true>(static_cast<uint8_t*>(dst) + key * kLP, static_cast<const uint8_t*>(p.cache) + slot * L, ok, q,
                       p.C, p.R, vec);
    else
      copy_chunk<false>(static_cast<bf16*>(dst) + key * kLd, static_cast<const bf16*>(p.cache) + slot * L, ok, q, p.C,
                        p.R, vec);
  }
}

// e4m3 stage [kBN][kLP] bytes -> bf16 rows (exact: every e4m3 value is a bf16 value).
__device__ __forceinline__ void convert_stage(const uint8_t* st, bf16* dst) {
  for (int i = threadIdx.x; i < kBN * kChunks; i += kThreads) {
    const int key = i / kChunks, q = i % kChunks;
    const uint2 w = *reinterpret_cast<const uint2*>(st + key * kLP + q * 8);
    uint4 o;
    float2 f;
    f = fp8x2_to_f2(uint16_t(w.x)), o.x = pack2(f.x, f.y);
    f = fp8x2_to_f2(uint16_t(w.x >> 16)), o.y = pack2(f.x, f.y);
    f = fp8x2_to_f2(uint16_t(w.y)), o.z = pack2(f.x, f.y);
    f = fp8x2_to_f2(uint16_t(w.y >> 16)), o.w = pack2(f.x, f.y);
    *reinterpret_cast<uint4*>(dst + key * kLd + q * 8) = o;
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) k_mla_flash(MlaFlashParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) Ks[i] = Qs + kQElems + i * kKElems;
  bf16* Ps = Ks[kStages - 1] + kKElems;
  float* red = reinterpret_cast<float*>(Ps + kBM * kPLd);  // [2 halves][kBM]: row maxima
  float* lsum = red + 2 * kBM;                            // [2 halves][kBM]: row sums
  int* kmax_s = reinterpret_cast<int*>(lsum + 2 * kBM);
  const int split = blockIdx.x, tile = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, rg = warp & 3, hf = warp >> 2;
  const int g = lane >> 2, c = lane & 3;
  const int H = p.H, C = p.C, R = p.R, L = C + R;
  const int ta = max(p.query_start[s], p.t_lo), tb = min(p.query_start[s + 1], p.t_hi);
  const int rows = (tb - ta) * H, r0 = tile * kBM;
  if (rows <= r0) return;  // the whole CTA: no barrier is skipped by part of it
  const int nrows = min(kBM, rows - r0);
  const int64_t brow0 = int64_t(ta - p.t_lo) * H + r0;  // the tile's first row in q_abs / o_lat
  if (tid == 0) {  // keys 0 .. the latest position among the tile's tokens
    int mx = 0;
    for (int t = ta + r0 / H; t <= ta + (r0 + nrows - 1) / H; ++t) mx = max(mx, p.positions[t]);
    *kmax_s = mx + 1;
  }
  const bool vec = C % 8 == 0 && R % 8 == 0;
  // Q tile (its own cp.async group, waited for with the first K tile).
  for (int i = tid; i < kBM * kChunks; i += kThreads) {
    const int r = i / kChunks, q = i % kChunks;
    const bf16* src = static_cast<const bf16*>(p.q_abs) + (r < nrows ? (brow0 + r) * L : 0);
    copy_chunk<false>(Qs + r * kLd, src, r < nrows, q, C, R, vec);
  }
  cp_async_commit();
  __syncthreads();
  const int kmax = *kmax_s;
  const int span = ((kmax + p.splits - 1) / p.splits + kBN - 1) / kBN * kBN;
  const int kbeg = split * span, kend = min(kmax, kbeg + span);
  const int ntiles = kend > kbeg ? (kend - kbeg + kBN - 1) / kBN : 0;
  const int32_t* table = p.block_tables + int64_t(s) * p.max_blocks_per_seq;
  // This thread's two rows (C-fragment rows g and g + 8 of the warp's 16) and their positions.
  const int rA = rg * 16 + g, rB = rA + 8;
  const int posA = rA < nrows ? p.positions[ta + (r0 + rA) / H] : -1;
  const int posB = rB < nrows ? p.positions[ta + (r0 + rB) / H] : -1;
  uint8_t* stage = reinterpret_cast<uint8_t*>(Ks[1]);  // e4m3: kStages byte stages from the second buffer on
  auto load = [&](int it) {
    const int kb = kbeg + it * kBN;
    if (kFp8) load_k_tile<true>(p, table, kb, kend, stage + (it % kStages) * kBN * kLP, vec);
    else load_k_tile<false>(p, table, kb, kend, Ks[it % kStages], vec);
    cp_async_commit();
  };
  if (ntiles > 0) load(0);
  if (ntiles > 1) load(1);

  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
  const float sl2 = 1.4426950408889634f * (kFp8 ? p.k_scale : 1.f);  // S to base 2 (and the e4m3 scale)
  for (int it = 0; it < ntiles; ++it) {
    // Tile it + 2 goes to the buffer (stage) tile it - 1 used, free since barrier (D).
    if (it + 2 < ntiles) {
      load(it + 2);
      cp_async_wait<2>();
    } else if (it + 1 < ntiles) {
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    if (kFp8) {
      __syncthreads();
      convert_stage(stage + (it % kStages) * kBN * kLP, Ks[0]);
    }
    __syncthreads();  // (A) tile it (and Q) visible
    const bf16* Kt = kFp8 ? Ks[0] : Ks[it % kStages];
    float sacc[2][4] = {};
#pragma unroll 4
    for (int ks = 0; ks < kLP; ks += 16) {
      uint32_t a[4], b[4];
      ldsm_x4(a, Qs + (rg * 16 + (lane & 15)) * kLd + ks + (lane >> 4) * 8);
      ldsm_x4(b, Kt + (hf * 16 + (lane & 7) + (lane >> 4) * 8) * kLd + ks + ((lane >> 3) & 1) * 8);
      mma16816(sacc[0], a, b[0], b[1]);
      mma16816(sacc[1], a, b[2], b[3]);
    }
    const int kb = kbeg + it * kBN;
    float mxA = -INFINITY, mxB = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = kb + hf * 16 + j * 8 + 2 * c + e;
        const bool in = key < kend;
        sacc[j][e] = in && key <= posA ? sacc[j][e] * sl2 : -INFINITY;
        sacc[j][2 + e] = in && key <= posB ? sacc[j][2 + e] * sl2 : -INFINITY;
        mxA = fmaxf(mxA, sacc[j][e]);
        mxB = fmaxf(mxB, sacc[j][2 + e]);
      }
#pragma unroll
    for (int sh = 1; sh <= 2; sh <<= 1) {
      mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, sh));
      mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, sh));
    }
    if (c == 0) red[hf * kBM + rA] = mxA, red[hf * kBM + rB] = mxB;
    __syncthreads();  // (B) both halves' maxima
    mxA = fmaxf(mxA, red[(1 - hf) * kBM + rA]);
    mxB = fmaxf(mxB, red[(1 - hf) * kBM + rB]);
    const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
    const float bA = nA == -INFINITY ? 0.f : nA, bB = nB == -INFINITY ? 0.f : nB;  // rows with no key yet
    const float corrA = exp2f(mA - bA), corrB = exp2f(mB - bB);
    mA = nA, mB = nB;
    float sA = 0.f, sB = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float p0 = exp2f(sacc[j][0] - bA), p1 = exp2f(sacc[j][1] - bA);
      const float p2 = exp2f(sacc[j][2] - bB), p3 = exp2f(sacc[j][3] - bB);
      sA += p0 + p1, sB += p2 + p3;
      const int col = hf * 16 + j * 8 + 2 * c;
      *reinterpret_cast<uint32_t*>(Ps + rA * kPLd + col) = pack2(p0, p1);
      *reinterpret_cast<uint32_t*>(Ps + rB * kPLd + col) = pack2(p2, p3);
    }
    lA = lA * corrA + sA, lB = lB * corrB + sB;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) o[n][0] *= corrA, o[n][1] *= corrA, o[n][2] *= corrB, o[n][3] *= corrB;
    __syncthreads();  // (C) P of both halves
#pragma unroll
    for (int kk = 0; kk < kBN; kk += 16) {
      uint32_t a[4];
      ldsm_x4(a, Ps + (rg * 16 + (lane & 15)) * kPLd + kk + (lane >> 4) * 8);
#pragma unroll
      for (int n2 = 0; n2 < kOTiles / 2; ++n2) {
        uint32_t b[4];
        ldsm_x4_trans(b, Kt + (kk + (lane & 15)) * kLd + hf * (kCP / 2) + n2 * 16 + (lane >> 4) * 8);
        mma16816(o[2 * n2], a, b[0], b[1]);
        mma16816(o[2 * n2 + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // (D) K buffer, P and the maxima are free for the next tile
  }
  cp_async_wait<0>();  // an empty split still issued the Q copies
#pragma unroll
  for (int sh = 1; sh <= 2; sh <<= 1) {
    lA += __shfl_xor_sync(0xffffffffu, lA, sh);
    lB += __shfl_xor_sync(0xffffffffu, lB, sh);
  }
  if (c == 0) lsum[hf * kBM + rA] = lA, lsum[hf * kBM + rB] = lB;
  __syncthreads();
  lA += lsum[(1 - hf) * kBM + rA];
  lB += lsum[(1 - hf) * kBM + rB];
  const float vs = kFp8 ? p.k_scale : 1.f;
  const float iA = lA > 0.f ? vs / lA : 0.f, iB = lB > 0.f ? vs / lB : 0.f;
  const int64_t rows_all = int64_t(p.t_hi - p.t_lo) * H;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? rB : rA;
    if (r >= nrows) continue;
    const float inv = half ? iB : iA;
    const int64_t row = brow0 + r;
    if (p.splits == 1) {
      bf16* dst = static_cast<bf16*>(p.o_lat) + row * C;
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        const int col = hf * (kCP / 2) + n * 8 + 2 * c;
        if (col < C) dst[col] = f2bf(o[n][2 * half] * inv);
        if (col + 1 < C) dst[col + 1] = f2bf(o[n][2 * half + 1] * inv);
      }
    } else {
      float* dst = p.part_o + (int64_t(split) * rows_all + row) * C;
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        const int col = hf * (kCP / 2) + n * 8 + 2 * c;
        if (col < C) dst[col] = o[n][2 * half] * inv;
        if (col + 1 < C) dst[col + 1] = o[n][2 * half + 1] * inv;
      }
      if (hf == 0 && c == 0) {
        float* ml = p.part_ml + (int64_t(split) * rows_all + row) * 2;
        ml[0] = half ? mB : mA;
        ml[1] = half ? lB : lA;
      }
    }
  }
}

// o_lat[row] = sum_k w_k O_k / sum_k w_k, w_k = l_k 2^(m_k - max m): one block per row.
__global__ void __launch_bounds__(128) k_mla_combine(MlaFlashParams p) {
  const int64_t row = blockIdx.x, rows_all = int64_t(p.t_hi - p.t_lo) * p.H;
  const int t = p.t_lo + int(row / p.H);
  if (t >= p.query_start[p.num_seqs]) return;  // a padding token: no split wrote it
  float mx = -INFINITY;
  for (int k = 0; k < p.splits; ++k) {
    const float* ml = p.part_ml + (k * rows_all + row) * 2;
    if (ml[1] > 0.f) mx = fmaxf(mx, ml[0]);
  }
  float wsum = 0.f;
  for (int k = 0; k < p.splits; ++k) {
    const float* ml = p.part_ml + (k * rows_all + row) * 2;
    if (ml[1] > 0.f) wsum += ml[1] * exp2f(ml[0] - mx);
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  bf16* dst = static_cast<bf16*>(p.o_lat) + row * p.C;
  for (int col = threadIdx.x; col < p.C; col += blockDim.x) {
    float acc = 0.f;
    for (int k = 0; k < p.splits; ++k) {
      const float* ml = p.part_ml + (k * rows_all + row) * 2;
      if (ml[1] > 0.f) acc += ml[1] * exp2f(ml[0] - mx) * p.part_o[(k * rows_all + row) * p.C + col];
    }
    dst[col] = f2bf(acc * inv);
  }
}

}  // namespace

void launch_mla_flash(const MlaFlashParams& p, cudaStream_t s) {
  if (p.t_hi <= p.t_lo || p.num_seqs == 0 || p.row_tiles == 0) return;
  static bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(k_mla_flash<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    CUDA_CHECK(cudaFuncSetAttribute(k_mla_flash<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    return true;
  }();
  (void)attr;
  const dim3 grid(p.splits, p.row_tiles, p.num_seqs);
  if (p.cache_fp8) k_mla_flash<true><<<grid, kThreads, kSmemBytes, s>>>(p);
  else k_mla_flash<false><<<grid, kThreads, kSmemBytes, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  if (p.splits > 1) {
    k_mla_combine<<<unsigned((p.t_hi - p.t_lo) * p.H), 128, 0, s>>>(p);
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kMlaRowTile == limits::kMlaRowTile && kMlaMaxC == limits::kMlaMaxC && kMlaMaxR == limits::kMlaMaxR);
}  // namespace moeserve::cuda
