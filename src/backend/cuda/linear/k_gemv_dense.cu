// Dense decode GEMV for the attention projections at a few tokens (q/k/v as linear_multi
// segments, o_proj; optionally with the input's add + RMSNorm fused): FP8 weights with
// 128 x 128 block scales, M <= 8 activation rows, sm_90+ (bulk copies).
//
// Why a second kernel next to k_gemv_tc.cu: at batch 1 that kernel's blocks keep two 128-
// column chunks per warp in flight, compute, then load again, so a block pays one memory round
// trip per two chunks, and its 32-row blocks leave SMs idle (o_proj: 96 blocks on 132 SMs).
// Here a block owns R = 8 or 16 weight rows over the whole K and copies its entire weight slice
// (R x K bytes: 48 KB for o_proj at R = 8, q/k/v at R = 16) into shared memory with
// cp.async.bulk BEFORE the PDL wait: weights are never written during a step, so the whole
// stream is in flight at once and overlaps the predecessor's tail as far as residency allows.
// The slice arrives in up to kPieces K-pieces, each on its own mbarrier, so the math on piece
// 0 starts while later pieces land. After the wait only the activations (or the fused add +
// RMSNorm of residual + addend) are read, converted once to f16 into shared memory.
//
// Math: mma.sync m16n8k16 f16 -> f32 with the weights as the 16-row A side and the <= 8
// tokens as the N side ("swap AB", as k_gemv_tc.cu, same k permutation: lane (g, q) reads 16
// contiguous weight bytes of row g (and g + 8) at column q * 16 of each 64-column step and the
// 16 matching activations of token g; physical columns q*16 + 4i + {0,1} are logical k {2q,
// 2q+1} of mma i, + {2,3} are {2q+8, 2q+9}). R = 8 leaves the A rows g + 8 zero (half the
// tensor work is wasted, which is cheap; it halves the block's slice so that the grid
// spreads evenly over the SMs). The 4 warps split the 128-column chunks of each piece; their
// partial sums meet in shared memory. Shared rows are padded by 16 bytes (no bank conflicts
// between the 8 rows a warp reads at the same column).
//
// Fused norm (NORM): x is the addend; every block computes x_j = bf16(rmsnorm(bf16(res_j +
// add_j)) * w) for its rows (the reference rounding), and the grid's last block (threadfence
// + counter) stores res += add and the normed rows, after every block has read the old res.
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/linear/gemv_frag.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/norm_rope/row_vec.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kDW = 4;            // warps per block
constexpr int kDTok = 8;          // max activation rows
constexpr int kPieces = 4;        // max K-pieces (mbarriers) per block
constexpr int kDMaxK = 8192;      // max K (scales in shared memory: K / 128 floats)
constexpr int kDNormK = 4096;     // max K of the fused norm
constexpr int kDNormV = kDNormK / (8 * kDW * 32);  // 16-byte vectors per thread and row
constexpr int kDSmemMax = 112 * 1024;  // dynamic shared memory cap (2 blocks per SM at least)

// Two floats -> f16x2 word, clamped to the finite f16 range (as gemv_frag.cuh's bf2_to_h2).
__device__ __forceinline__ uint32_t f2_to_h2(float a, float b) {
  a = fminf(fmaxf(a, -65504.f), 65504.f);
  b = fminf(fmaxf(b, -65504.f), 65504.f);
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(n) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred P1;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT_%=;\n}\n" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
#endif
}
// Global -> shared bulk copy (bytes % 16 == 0, both addresses 16-byte aligned) completing on b.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(b))
      : "memory");
#else
  __trap();  // the launcher refuses devices below sm_90
#endif
}

struct DenseGeo {
  int cpp, npieces;  // chunks per piece (a multiple of kDW), pieces
  int late;          // 1: weight copies after the PDL wait
};

// Dynamic shared memory: weights [R][K + 16] fp8, activations [M][K + 8] f16, block scales
// [K / 128] f32 (dense_smem; q/k/v at M = 1: 4 blocks of 16 rows fit an SM, o_proj 3 of 8).
template <int R, bool NORM>
__global__ void __launch_bounds__(kDW * 32) gemv_dense_kernel(LinParams p, DenseGeo geo) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kPieces];
  __shared__ float scratch[32];
  __shared__ float rnorm[kDTok];
  __shared__ int is_last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;

  // The segment that owns this block (blocks of R rows; seg_block in those units).
  int bx = blockIdx.x;
  const GemvMatrix mat = gemv_matrix(p, bx);
  const void* W = mat.w;
  const float* S = mat.s;
  void* OUT = mat.out;
  const int N = mat.N, s_cols = mat.s_cols, ldo = mat.ldo;
  const int K = p.K, M = p.M, nchunks = K / 128, n0 = bx * R;
  const int ldw = K + 16, ldxs = K + 8;  // shared row strides (bytes, f16 elements)
  uint8_t* ws = smem;
  __half* xs = reinterpret_cast<__half*>(smem + R * ldw);
  float* scl = reinterpret_cast<float*>(xs + M * ldxs);  // [nchunks] block scales of the rows
  // The split-K partials [kDW - 1][4][32] reuse the weight rows once every warp is done.
  float(*red)[4][32] = reinterpret_cast<float(*)[4][32]>(smem);
  const int rows = min(R, N - n0);

  // Weights (never written during a step) before the dependency wait: the block's whole slice.
  if (tid == 0) {
    for (int i = 0; i < geo.npieces; ++i) mbar_init(&bars[i], 1);
  }
  __syncthreads();
  // geo.late: the copies start only after the wait (they would otherwise compete with a
  // latency-bound predecessor, the decode attention, for HBM).
  auto issue = [&]() {
    if (warp != 0) return;
    if (lane == 0)
      for (int pc = 0; pc < geo.npieces; ++pc) {
        const int cb = pc * geo.cpp, ce = min(nchunks, cb + geo.cpp);
        mbar_expect_tx(&bars[pc], uint32_t(rows) * uint32_t(ce - cb) * 128u);
      }
    __syncwarp();
    const uint8_t* wg = static_cast<const uint8_t*>(W) + int64_t(n0) * K;
    for (int i = lane; i < rows * geo.npieces; i += 32) {  // piece-major: piece 0 of every row first
      const int pc = i / rows, r = i - pc * rows;
      const int cb = pc * geo.cpp, ce = min(nchunks, cb + geo.cpp);
      bulk_g2s(ws + r * ldw + cb * 128, wg + int64_t(r) * K + cb * 128, uint32_t(ce - cb) * 128u, &bars[pc]);
    }
  };
  if (!geo.late) issue();
  const int srow = (n0 / p.bo) * s_cols;  // the block's rows share one 128-row scale block
  for (int i = tid; i < nchunks; i += kDW * 32) scl[i] = __ldg(S + srow + i);
  pdl_enter();
  if (geo.late) issue();

  // Activations -> f16 rows in shared memory.
  const int kv = K / 8;  // 16-byte vectors per row
  if (NORM) {
    const bf16* res = static_cast<const bf16*>(p.norm_res);
    const bf16* add = static_cast<const bf16*>(p.x);
    const bf16* nw = static_cast<const bf16*>(p.norm_w);
    for (int j = 0; j < M; ++j) {
      float val[kDNormV][8];
      const float r =
          norm_row_stats<kDNormV, kDW * 32, false>(add + int64_t(j) * K, res + int64_t(j) * K, K, p.eps, val, scratch);
      if (tid == 0) rnorm[j] = r;
#pragma unroll
      for (int i = 0; i < kDNormV; ++i) {
        const int v = i * kDW * 32 + tid;
        if (v < kv) {
          const uint4 wv = *reinterpret_cast<const uint4*>(nw + 8 * v);
          const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w};
          uint32_t o[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 wf = bf16x2_to_f2(ww[e]);
            o[e] = f2_to_h2(bf2f(f2bf(val[i][2 * e] * r * wf.x)), bf2f(f2bf(val[i][2 * e + 1] * r * wf.y)));
          }
          *reinterpret_cast<uint4*>(xs + j * ldxs + 8 * v) = make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
    }
  } else {
    const bf16* x = static_cast<const bf16*>(p.x);
    constexpr int kU = 8;  // loads in flight per thread before the stores (M = 1, K <= 8192: one round trip)
    for (int i0 = tid; i0 < M * kv; i0 += kU * kDW * 32) {
      uint4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = i0 + u * kDW * 32;
        if (i < M * kv) {
          const int j = i / kv, c = i - j * kv;
          v[u] = __ldg(reinterpret_cast<const uint4*>(x + int64_t(j) * p.ldx + 8 * c));
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = i0 + u * kDW * 32;
        if (i < M * kv) {
          const int j = i / kv, c = i - j * kv;
          const float2 a = bf16x2_to_f2(v[u].x), b = bf16x2_to_f2(v[u].y), c2 = bf16x2_to_f2(v[u].z),
                       d = bf16x2_to_f2(v[u].w);
          *reinterpret_cast<uint4*>(xs + j * ldxs + 8 * c) =
              make_uint4(f2_to_h2(a.x, a.y), f2_to_h2(b.x, b.y), f2_to_h2(c2.x, c2.y), f2_to_h2(d.x, d.y));
        }
      }
    }
  }
  __syncthreads();

  // Math: warp w takes chunks w, w + 4, ... of each piece as it lands.
  const __half* xrow = xs + min(g, M - 1) * ldxs;
  const uint8_t* w0 = ws + g * ldw;
  const uint8_t* w1 = ws + (R == 16 ? g + 8 : g) * ldw;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int pc = 0; pc < geo.npieces; ++pc) {
    mbar_wait(&bars[pc], 0);
    const int ce = min(nchunks, (pc + 1) * geo.cpp);
    for (int c = pc * geo.cpp + warp; c < ce; c += kDW) {
      float part[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // one mma chain per step
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int col = c * 128 + s * 64 + q * 16;
        const uint4 lo = *reinterpret_cast<const uint4*>(w0 + col);
        const uint4 hi = R == 16 ? *reinterpret_cast<const uint4*>(w1 + col) : make_uint4(0, 0, 0, 0);
        const uint4 xa = *reinterpret_cast<const uint4*>(xrow + col);
        const uint4 xb = *reinterpret_cast<const uint4*>(xrow + col + 8);
        const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        const uint32_t wl4[4] = {lo.x, lo.y, lo.z, lo.w}, wh4[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t a[4] = {fp8x2_to_h2(wl4[i]), R == 16 ? fp8x2_to_h2(wh4[i]) : 0u, fp8x2_to_h2(wl4[i] >> 16),
                                 R == 16 ? fp8x2_to_h2(wh4[i] >> 16) : 0u};
          mma_f16(part[s], a, xw[2 * i], xw[2 * i + 1]);
        }
      }
      const float sc = scl[c];
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = fmaf(part[0][e] + part[1][e], sc, acc[e]);
    }
  }
  __syncthreads();  // every warp is done with the weight rows that red overwrites
  if (warp > 0) {
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp - 1][e][lane] = acc[e];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int w = 0; w < kDW - 1; ++w)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] += red[w][e][lane];
    // C fragment: acc[0..1] = row g, tokens 2q, 2q + 1; acc[2..3] = row g + 8.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int tok = 2 * q + j;
      if (tok >= M) continue;
#pragma unroll
      for (int h = 0; h < (R == 16 ? 2 : 1); ++h) {
        const int r = g + 8 * h;
        if (r >= rows) continue;
        const int64_t o = int64_t(tok) * ldo + n0 + r;
        if (p.out_f32)
          static_cast<float*>(OUT)[o] = acc[2 * h + j];
        else
          static_cast<bf16*>(OUT)[o] = f2bf(acc[2 * h + j]);
      }
    }
  }
  if (!NORM) return;
  // Last block: residual += addend and the normed rows (every block has read the old residual).
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(p.norm_counter, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!is_last) return;
  if (tid == 0) *p.norm_counter = 0;  // ready for the next layer / graph replay
  __threadfence();
  bf16* res = static_cast<bf16*>(p.norm_res);
  const bf16* add = static_cast<const bf16*>(p.x);
  const bf16* nw = static_cast<const bf16*>(p.norm_w);
  for (int i = tid; i < M * kv; i += kDW * 32) {
    const int j = i / kv, c = i - j * kv;
    const uint4 ra = __ldcg(reinterpret_cast<const uint4*>(res + int64_t(j) * K + 8 * c));
    const uint4 xa = __ldcg(reinterpret_cast<const uint4*>(add + int64_t(j) * K + 8 * c));
    const uint4 wv = *reinterpret_cast<const uint4*>(nw + 8 * c);
    const uint32_t rw[4] = {ra.x, ra.y, ra.z, ra.w}, xw[4] = {xa.x, xa.y, xa.z, xa.w}, ww[4] = {wv.x, wv.y, wv.z, wv.w};
    uint32_t ro[4], no[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = bf16x2_to_f2(rw[e]), b = bf16x2_to_f2(xw[e]), wf = bf16x2_to_f2(ww[e]);
      __nv_bfloat162 v = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
      const float2 vf = __bfloat1622float2(v);
      __nv_bfloat162 n = __floats2bfloat162_rn(vf.x * rnorm[j] * wf.x, vf.y * rnorm[j] * wf.y);
      ro[e] = *reinterpret_cast<uint32_t*>(&v);
      no[e] = *reinterpret_cast<uint32_t*>(&n);
    }
    *reinterpret_cast<uint4*>(res + int64_t(j) * K + 8 * c) = make_uint4(ro[0], ro[1], ro[2], ro[3]);
    *reinterpret_cast<uint4*>(static_cast<bf16*>(p.norm_out) + int64_t(j) * K + 8 * c) =
        make_uint4(no[0], no[1], no[2], no[3]);
  }
}

int dense_rows(const LinParams& p, int num_sms) {
  int64_t blocks16 = 0;
  if (p.nseg > 0)
    for (int i = 0; i < p.nseg; ++i) blocks16 += ceil_div(p.seg[i].N, 16);
  else
    blocks16 = ceil_div(p.N, 16);
  // 16-row blocks when they give every SM about three or more (q/k/v: 512 on 132 SMs), else
  // 8-row blocks (o_proj: 384 of 48 KB instead of 192 of 96 KB, an even spread).
  return blocks16 >= 3 * int64_t(num_sms) ? 16 : 8;
}

size_t dense_smem(int R, int M, int K) {
  return std::max(size_t(R) * (K + 16), size_t(kDW - 1) * 4 * 32 * 4) + size_t(M) * (K + 8) * 2 + size_t(K / 128) * 4;
}

template <int R, bool NORM>
void launch_dense(const LinParams& p, const DenseGeo& geo, int blocks, cudaStream_t s) {
  const size_t smem = dense_smem(R, p.M, p.K);
  // The shared-memory opt-in is per device: one bit per device for this instance.
  static std::atomic<uint64_t> attr_set{0};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attr_set.load() & bit)) {
    CUDA_CHECK(cudaFuncSetAttribute(gemv_dense_kernel<R, NORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDSmemMax)));
    CUDA_CHECK(cudaFuncSetAttribute(gemv_dense_kernel<R, NORM>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    int(cudaSharedmemCarveoutMaxShared)));
    attr_set.fetch_or(bit);
  }
  launch_pdl(gemv_dense_kernel<R, NORM>, dim3(blocks), dim3(kDW * 32), smem, s, p, geo);
  CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; }

}  // namespace

bool gemv_dense_supported(const LinParams& p) {
  if (code_arch() < 900) return false;
  if (p.mode != LinMode::kStore || p.tile_expert || p.pair_ids || p.x_rows || p.x_row_div != 1 || p.experts)
    return false;
  if (!p.fp8 || p.bo != 128 || p.bi != 128 || p.K <= 0 || p.K % 128 != 0 || p.K > kDMaxK) return false;
  if (p.M < 1 || p.M > kDTok || p.ldx % 8 != 0 || !aligned16(p.x)) return false;
  if (dense_smem(8, p.M, p.K) > size_t(kDSmemMax)) return false;
  if (p.norm && (p.K > kDNormK || !p.norm_counter || p.ldx != p.K || !aligned16(p.norm_res) ||
                 !aligned16(p.norm_w) || !aligned16(p.norm_out)))
    return false;
  if (p.nseg > 0) {
    for (int i = 0; i < p.nseg; ++i)
      if (!aligned16(p.seg[i].w) || p.seg[i].N <= 0) return false;
  } else if (!aligned16(p.w) || p.N <= 0) {
    return false;
  }
  return true;
}

void launch_gemv_dense(const LinParams& p0, int num_sms, cudaStream_t s) {
  LinParams p = p0;
  int R = dense_rows(p, num_sms);
  if (dense_smem(R, p.M, p.K) > size_t(kDSmemMax)) R = 8;  // (supported: 8 rows fit)
  int blocks = 0;
  if (p.nseg > 0) {
    for (int i = 0; i < p.nseg; ++i) {
      p.seg_block[i] = blocks;
      blocks += ceil_div(p.seg[i].N, R);
    }
    p.seg_block[p.nseg] = blocks;
  } else {
    blocks = ceil_div(p.N, R);
  }
  if (blocks == 0) return;
  const int nchunks = p.K / 128;
  const int pieces = kPieces;  // K-pieces (mbarriers) per block
  DenseGeo geo;
  geo.cpp = (ceil_div(nchunks, pieces) + kDW - 1) / kDW * kDW;
  geo.npieces = ceil_div(nchunks, geo.cpp);
  // Single linears (o_proj, after the decode attention; only by a direct launch now: the
  // backend keeps them on k_gemv_tc.cu) copy after the wait; q/k/v (after the bandwidth-bound
  // down GEMV) before it.
  geo.late = p.nseg == 0 && !p.norm ? 1 : 0;
  if (R == 16) {
    if (p.norm)
      launch_dense<16, true>(p, geo, blocks, s);
    else
      launch_dense<16, false>(p, geo, blocks, s);
  } else {
    if (p.norm)
      launch_dense<8, true>(p, geo, blocks, s);
    else
      launch_dense<8, false>(p, geo, blocks, s);
  }
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kDTok == limits::kDenseMaxTokens && kDMaxK == limits::kDenseMaxK && kDNormK == limits::kDenseNormMaxK && kDSmemMax == int(limits::kDenseSmemMax) && kDW == limits::kDenseWarps);
}  // namespace moeserve::cuda
