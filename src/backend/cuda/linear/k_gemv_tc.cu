// Tensor-core decode path for FP8 weights with 128x128 block scales ("swap AB" GEMV):
// y[r, n] = sum_k x[r, k] W[n, k] for tiles of <= 8 activation rows.
//
// The weights are the M side of mma.sync m16n8k16 (f16 in, f32 accumulate) and the <= 8
// activation rows of a tile are the N side, so one FP8 -> f16x2 conversion per two weights
// is all the CUDA-core work per weight (the f32 FMA GEMV spent ~4 ops per weight and ran out
// of issue slots before HBM bandwidth). FP8 e4m3 converts to f16 exactly; activations are
// rounded bf16 -> f16 (11-bit mantissa, so exact) after clamping to the f16 range.
//
// Layout: a warp owns 16 rows of each of two matrices (kSwiglu: W1 and W3 rows of the same
// intermediate index; otherwise rows n_base..+15 and n_base+16..+31) and every 4th 128-column
// block (split-K over the block's 4 or 8 warps, reduced through shared memory). A lane (g = lane / 4,
// q = lane % 4) loads 16 contiguous FP8 bytes of rows g and g + 8 at column q * 16 of each
// 64-column step, and the matching 16 activations of token g. Because a dot product is
// invariant under a permutation of k applied to both operands, mma i of the step uses
// physical columns q*16 + 4i + {0,1} as logical k {2q, 2q+1} and q*16 + 4i + {2,3} as
// {2q+8, 2q+9}: the fragments come straight from the 16-byte loads, no shuffles.
// Each 128-column chunk is accumulated separately and added with its block scale.
#include <cstdlib>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/linear/gemv_frag.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kChunk = 128;  // columns per block scale (bi)
constexpr int kNormTok = 4, kNormK = 3072;  // fused add + RMSNorm (p.norm): rows, width

// kWarps: split-K ways (4, or 8 for grids too small to fill the GPU, e.g. k/v projections).
// NORM: the fused add + RMSNorm variant (kStore only; the shared row buffer is only in it).
// kSwiglu keeps <= 128 registers (4 blocks of 4 warps per SM, as before the PDL / direct-pair
// additions pushed it to 138 and 3 blocks).
template <int MODE, int kWarps, bool NORM, int LD>
__global__ void __launch_bounds__(kWarps * 32, MODE == int(LinMode::kSwiglu) ? 16 / kWarps : 1)
    gemv_tc_kernel(LinParams p) {
  __shared__ float red[kWarps - 1][2][4][32];
  // p.norm: the block's activation rows, residual + addend normalised here (bf16).
  __shared__ __align__(16) bf16 xs[NORM ? kNormTok : 1][NORM ? kNormK : 8];
  __shared__ float scratch[32];
  // MoE tiles come from the predecessor (align / router): wait before reading them. Plain
  // linears know their weight rows up front and issue the first weight loads before the
  // wait (PDL: the weight stream overlaps the previous kernel's tail).
  const bool direct = p.pair_ids != nullptr;
  const bool moe = direct || p.tile_expert != nullptr;
  const bool early = !moe || (direct && p.ids_ready);  // weights known before the wait
  if (!early) pdl_enter();
  int tile = blockIdx.y, nblk = blockIdx.x;
  // The matrix of this block (linear_multi: the segment that owns blockIdx.x).
  const void* W = p.w;
  const float* S = p.s;
  void* OUT = p.out;
  int N = p.N, s_cols = p.s_cols, ldo = p.ldo;
  if (!moe) {
    int bx = blockIdx.x;
    const GemvMatrix mat = gemv_matrix(p, bx);
    W = mat.w, S = mat.s, OUT = mat.out, N = mat.N, s_cols = mat.s_cols, ldo = mat.ldo;
    const int ntiles = ceil_div(p.M, kGemvTile);
    tile = bx % ntiles;
    nblk = bx / ntiles;
  }
  int expert = -1, begin, end;
  bool skip = false;  // direct pairs: non-local expert (kDown writes zeros)
  if (direct) {
    expert = p.pair_ids[tile] - p.first_local;
    begin = tile, end = tile + 1;
    if (expert < 0 || expert >= p.num_local) {
      if (MODE != int(LinMode::kDown)) {
        if (early) pdl_enter();
        return;
      }
      skip = true, expert = 0;
    }
  } else if (p.tile_expert) {
    if (tile >= *p.num_tiles) return;
    expert = p.tile_expert[tile], begin = p.tile_begin[tile], end = p.tile_end[tile];
  } else {
    begin = tile * kGemvTile;
    end = min(p.M, begin + kGemvTile);
  }
  const int nrows = end - begin;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  constexpr bool kSw = MODE == int(LinMode::kSwiglu);
  const int n_base = nblk * (kSw ? 16 : 32);
  // p.norm: the last block of the grid stores residual + addend and the normed rows, after
  // every block has read the old residual (threadfence + counter).
  auto norm_arrive = [&]() {
    __threadfence();
    __syncwarp();
    int last = 0;
    if ((threadIdx.x & 31) == 0) last = atomicAdd(p.norm_counter, 1) == int(gridDim.x * gridDim.y) - 1;
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    if ((threadIdx.x & 31) == 0) *p.norm_counter = 0;
    __threadfence();
    const bf16* res = static_cast<const bf16*>(p.norm_res);
    for (int64_t i = threadIdx.x & 31; i < int64_t(p.M) * p.K; i += 32) {
      const float v = bf2f(res[i]) + bf2f(static_cast<const bf16*>(p.x)[i]);
      static_cast<bf16*>(p.norm_res)[i] = f2bf(v);
      static_cast<bf16*>(p.norm_out)[i] = xs[i / p.K][i % p.K];
    }
  };
  if (n_base >= N) {
    if (early) pdl_enter();
    if (NORM && warp == 0) {  // xs is not needed: only the last block stores it, and not this one
      if (lane == 0) atomicAdd(p.norm_counter, 1);
    }
    return;
  }

  const ExpertPtrs* ep = expert >= 0 ? p.experts + expert : nullptr;
  const uint8_t* wm[2];
  const float* sm[2];
  int rb[2];  // first row of each 16-row group
  bool gvalid[2];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    if (kSw) {
      wm[m] = static_cast<const uint8_t*>(m == 0 ? ep->w1 : ep->w3);
      sm[m] = m == 0 ? ep->s1 : ep->s3;
      rb[m] = n_base;
    } else {
      wm[m] = static_cast<const uint8_t*>(ep ? ep->w2 : W);
      sm[m] = ep ? ep->s2 : S;
      rb[m] = n_base + 16 * m;
    }
    gvalid[m] = rb[m] < N;
    if (!gvalid[m]) rb[m] = rb[0];  // re-read group 0, discard
  }
  const int K = p.K, nchunks = skip ? 0 : K / kChunk;
  const int64_t row_off[2][2] = {{int64_t(rb[0] + g) * K, int64_t(rb[0] + g + 8) * K},
                                 {int64_t(rb[1] + g) * K, int64_t(rb[1] + g + 8) * K}};
  const int srow[2] = {(rb[0] / p.bo) * s_cols, (rb[1] / p.bo) * s_cols};

  float acc[2][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[m][e] = 0.f;

  auto load_w = [&](int c, Chunk& ch) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int col = c * kChunk + s * 64 + q * 16;
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) ch.a[m][s][h] = ld_w<LD>(wm[m] + row_off[m][h] + col);
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) ch.sc[m] = __ldg(sm[m] + srow[m] + c);
  };
  // First iteration's weights (two chunks per warp) before the dependency wait.
  Chunk c0, c1;
  if (warp < nchunks) load_w(warp, c0);
  if (warp + kWarps < nchunks) load_w(warp + kWarps, c1);
  if (early) pdl_enter();

  if (NORM) {  // rows begin..end-1 = 0..M-1 (one tile): x_j = rmsnorm(residual_j + addend_j) * w
    for (int j = 0; j < nrows; ++j)
      add_norm_row_to_smem<(kNormK + 8 * kWarps * 32 - 1) / (8 * kWarps * 32)>(
          static_cast<const bf16*>(p.norm_res) + int64_t(j) * K, static_cast<const bf16*>(p.x) + int64_t(j) * K,
          static_cast<const bf16*>(p.norm_w), K, p.eps, &xs[j][0], scratch);
    __syncthreads();
  }
  // kDown: the routing weights of this lane's output tokens (2q, 2q + 1), requested now so
  // the epilogue does not wait for them after the reduction.
  float row_scale[2] = {1.f, 1.f};
  if (MODE == int(LinMode::kDown)) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (2 * q + j < nrows) row_scale[j] = p.row_scale[begin + 2 * q + j];
  }
  const int xr_local = begin + min(g, nrows - 1);
  const bf16* xrow = NORM ? &xs[xr_local][0]
                            : static_cast<const bf16*>(p.x) +
                                  int64_t(p.x_rows ? p.x_rows[xr_local] : xr_local / p.x_row_div) * p.ldx;
  auto load_x = [&](int c, Chunk& ch) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int col = c * kChunk + s * 64 + q * 16;
      const uint4* xp = reinterpret_cast<const uint4*>(xrow + col);
      if (NORM) {  // shared memory
        ch.x[s][0] = xp[0];
        ch.x[s][1] = xp[1];
      } else {
        ch.x[s][0] = __ldg(xp);
        ch.x[s][1] = __ldg(xp + 1);
      }
    }
  };
  auto compute = [&](int c, const Chunk& ch) {
    float part[2][4];
    chunk_mma(ch, part);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][e] = fmaf(part[m][e], ch.sc[m], acc[m][e]);
    }
  };
  // Two chunks in flight per warp (16 x 16-byte weight loads per lane) before any math.
  for (int c = warp; c < nchunks; c += 2 * kWarps) {
    const int c2 = c + kWarps;
    if (c != warp) {
      load_w(c, c0);
      if (c2 < nchunks) load_w(c2, c1);
    }
    load_x(c, c0);
    if (c2 < nchunks) load_x(c2, c1);
    compute(c, c0);
    if (c2 < nchunks) compute(c2, c1);
  }

  // Split-K reduction: warps 1..3 hand their partials to warp 0.
  if (warp > 0) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp - 1][m][e][lane] = acc[m][e];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w)
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][e] += red[w][m][e][lane];

  // C fragment: acc[m][0..1] = rows rb[m] + g, tokens 2q, 2q + 1; acc[m][2..3] = row + 8.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int tok = 2 * q + j;
    if (tok >= nrows) continue;
    const int r = begin + tok;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (kSw) {
        const float gt = acc[0][2 * h + j], up = acc[1][2 * h + j];
        static_cast<bf16*>(OUT)[int64_t(r) * ldo + n_base + g + 8 * h] = f2bf(silu(gt) * up);
      } else {
        const float scale = row_scale[j];  // 1 unless kDown
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          if (!gvalid[m]) continue;
          const int64_t o = int64_t(r) * ldo + rb[m] + g + 8 * h;
          const float v = acc[m][2 * h + j] * scale;
          if (p.out_f32)
            static_cast<float*>(OUT)[o] = v;
          else
            static_cast<bf16*>(OUT)[o] = f2bf(v);
        }
      }
    }
  }
  if (NORM) {
    norm_arrive();
    return;
  }
  if (MODE == int(LinMode::kDown) && direct && p.combine_out) {
    // Fused combine (threadfence-reduction pattern): publish this pair's rows, count the
    // arrival; the token's last pair block sums its top_k rows in k order.
    const int token = begin / p.top_k;
    int* ctr = p.counters + int64_t(token) * gridDim.x + nblk;
    __threadfence();
    __syncwarp();
    int last = 0;
    if (lane == 0) last = atomicAdd(ctr, 1) == p.top_k - 1;
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    if (lane == 0) *ctr = 0;  // ready for the next layer / replay
    __threadfence();
    const int row = n_base + lane;
    if (row < N) {
      const float* yp = static_cast<const float*>(OUT) + int64_t(token) * p.top_k * ldo + row;
      float sum = 0.f;
      for (int j = 0; j < p.top_k; ++j) sum += __ldcg(yp + int64_t(j) * ldo);
      const int64_t o = int64_t(token) * N + row;
      if (p.combine_bf16)
        static_cast<bf16*>(p.combine_out)[o] = f2bf(sum);
      else
        static_cast<float*>(p.combine_out)[o] = sum;
    }
  }
}

template <int MODE>
void launch_tc_mode(const LinParams& p, cudaStream_t s) {
  const int rows_per_block = MODE == int(LinMode::kSwiglu) ? 16 : 32;
  const int nblocks = p.nseg > 0 ? p.seg_block[p.nseg] / ceil_div(p.M, kGemvTile) : ceil_div(p.N, rows_per_block);
  dim3 grid = p.pair_ids      ? dim3(nblocks, p.M)
              : p.tile_expert ? dim3(nblocks, p.max_tiles)
                              : dim3(nblocks * ceil_div(p.M, kGemvTile), 1);
  if (grid.x == 0 || grid.y == 0) return;
  // Fewer than ~2 blocks per SM (k/v/o projections at batch 1: 32-96 blocks): 8 warps per
  // block so each row group's K is streamed by twice as many warps.
  // linear_multi (q/k/v: 256 blocks of equal work) stays at 4 warps: one wave.
  const bool wide = int64_t(grid.x) * grid.y < (p.nseg > 0 ? 132 : 264);
  // Weight loads with the L2::256B hint (LD 1). The plain loads (0), the evict_first policy
  // for experts (2), forced warp counts and the fused add + RMSNorm variant (NORM) measured
  // no faster and are not built (docs/bench/cuda_switch_inventory.md).
  if (wide)
    launch_pdl(gemv_tc_kernel<MODE, 8, false, 1>, grid, dim3(8 * 32), 0, s, p);
  else
    launch_pdl(gemv_tc_kernel<MODE, 4, false, 1>, grid, dim3(4 * 32), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemv_tc_supported(const LinParams& p) {
  return p.tc && p.fp8 && p.bo == 128 && p.bi == kChunk && p.K % kChunk == 0 && p.N % 16 == 0 && p.ldx % 8 == 0 &&
         p.K > 0;
}

void launch_gemv_tc(const LinParams& p, cudaStream_t s) {
  CU_REQUIRE(!p.norm, "gemv_tc: the fused add + RMSNorm runs on k_gemv_dense.cu only");
  switch (p.mode) {
    case LinMode::kStore: launch_tc_mode<int(LinMode::kStore)>(p, s); break;
    case LinMode::kSwiglu: launch_tc_mode<int(LinMode::kSwiglu)>(p, s); break;
    case LinMode::kDown: launch_tc_mode<int(LinMode::kDown)>(p, s); break;
  }
}

}  // namespace moeserve::cuda
