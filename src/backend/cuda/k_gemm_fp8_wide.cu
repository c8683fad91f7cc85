// Wide-tile variant of the FP8 grouped GEMM (k_gemm_fp8.cu): tile 128 x 128, 4 warps of
// 64 x 64, fragments by ldmatrix.x4. Why: with 32 x 32 warp tiles every m16n8k32 MMA needs
// 256 bytes of shared-memory reads, which caps mma.sync at about half its rate (128 B/clk
// per SM); 64 x 64 tiles halve that. The register budget for 128 accumulators per thread
// comes from dropping the per-K-block partial tile: the accumulator is kept in units of the
// current block's scale s_kb = s_act[row, kb] * s_w[n-block, kb] and rescaled before each
// block, acc = acc * s_{kb-1} / s_kb + A_kb B_kb, then multiplied by the last scale (exact in
// real arithmetic; one rounding per block, like the partial-tile form; scales are clamped
// to >= 1e-30 so a zero scale cannot divide by zero). MoE tiles hold up to 128 rows (the
// align kernel builds them with tile_rows = 128 for this kernel).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels_fp8.h"
#include "backend/cuda/mma_fp8.cuh"

namespace moeserve::cuda {

// Off by default: measured slower than k_gemm_fp8.cu on the H200 (experts at 8k: 12.07 vs 9.09 ms;
// q_proj 1.68 vs 1.40 ms), most likely its 255 registers with spills at 4 warps per SM.
bool g_fp8_gemm_wide = false;

namespace {

constexpr int BM = kFp8WideTileM, BN = 128, BK = 128, LDS = BK + 16;
constexpr int kStages = 3, kThreads = 128;
constexpr int kABytes = BM * LDS, kBBytes = BN * LDS, kStageBytes = kABytes + kBBytes;
constexpr int kSmemBytes = kStages * kStageBytes;  // 110,592
constexpr float kMinScale = 1e-30f;

template <int MODE>
__global__ void __launch_bounds__(kThreads, 1) gemm_fp8_wide_kernel(LinParams p, Fp8Act act) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr bool kSwiglu = MODE == int(LinMode::kSwiglu);
  int expert = -1, row_begin, row_end;
  if (p.tile_expert) {
    if (int(blockIdx.y) >= *p.num_tiles) return;
    expert = p.tile_expert[blockIdx.y];
    row_begin = p.tile_begin[blockIdx.y];
    row_end = p.tile_end[blockIdx.y];
  } else {
    row_begin = blockIdx.y * BM;
    row_end = min(p.M, row_begin + BM);
  }
  const ExpertPtrs* ep = expert >= 0 ? p.experts + expert : nullptr;
  const int n0 = blockIdx.x * (kSwiglu ? BN / 2 : BN);
  const int K = p.K, KT = K / BK, kcols = K / BK;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, tig = lane & 3;

  // cp.async: chunk tid + 128 i (i = 0..7) is row tid / 8 + 16 i, 16-byte column tid % 8.
  // For kSwiglu rows < 64 (i < 4) are W1 rows, the rest W3 rows.
  const int chunk = (tid & 7) * 16;
  uint32_t a_off[8], b_off[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = row_begin + (tid >> 3) + 16 * i;
    a_off[i] = r < row_end ? uint32_t(p.x_rows ? p.x_rows[r] : r) * uint32_t(K) + chunk : ~0u;
    const int row = (tid >> 3) + 16 * i;
    const int n = kSwiglu ? n0 + (row & (BN / 2 - 1)) : n0 + row;
    b_off[i] = n < p.N ? uint32_t(n) * uint32_t(K) + chunk : ~0u;
  }
  const uint8_t* b_lo = static_cast<const uint8_t*>(kSwiglu ? ep->w1 : (ep ? ep->w2 : p.w));
  const uint8_t* b_hi = kSwiglu ? static_cast<const uint8_t*>(ep->w3) : b_lo;
  auto load_stage = [&](int slot, int kt) {
    uint8_t* as = smem + slot * kStageBytes + (tid >> 3) * LDS + chunk;
    uint8_t* bs = as + kABytes;
    const uint32_t kb = uint32_t(kt) * BK;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      cp_async16(as + i * 16 * LDS, act.xq + (a_off[i] == ~0u ? 0u : a_off[i] + kb), a_off[i] != ~0u);
      cp_async16(bs + i * 16 * LDS, (i < 4 ? b_lo : b_hi) + (b_off[i] == ~0u ? 0u : b_off[i] + kb), b_off[i] != ~0u);
    }
  };

  int sa_off[4][2];
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_begin + wm * 64 + mi * 16 + g + h * 8;
      sa_off[mi][h] = r < row_end ? (p.x_rows ? p.x_rows[r] : r) * kcols : -1;
    }
  const int sblk = n0 / 128;
  const float* sw0 = (kSwiglu ? ep->s1 : (ep ? ep->s2 : p.s)) + int64_t(sblk) * p.s_cols;
  const float* sw1 = kSwiglu ? ep->s3 + int64_t(sblk) * p.s_cols : sw0;

  float acc[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
  float sa_prev[4][2], sb_prev0 = 1.f, sb_prev1 = 1.f;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) sa_prev[mi][0] = sa_prev[mi][1] = 1.f;

  // Shared-memory row of this lane for ldmatrix: A matrices (rows +0/+8, bytes +0/+16),
  // B matrices (bytes +0/+16, rows +0/+8).
  const int lm = lane >> 3, lr = lane & 7;
  const int a_lrow = (lm & 1) * 8 + lr, a_lcol = (lm >> 1) * 16;
  const int b_lrow = (lm >> 1) * 8 + lr, b_lcol = (lm & 1) * 16;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < KT) load_stage(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < KT) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();

    // Rescale the accumulators to this block's scale.
    {
      const float sb0 = fmaxf(__ldg(sw0 + kt), kMinScale), sb1 = kSwiglu ? fmaxf(__ldg(sw1 + kt), kMinScale) : sb0;
      const float rb0 = sb_prev0 / sb0, rb1 = sb_prev1 / sb1;
      sb_prev0 = sb0, sb_prev1 = sb1;
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float sa = sa_off[mi][h] >= 0 ? fmaxf(__ldg(act.xs + sa_off[mi][h] + kt), kMinScale) : 1.f;
          const float ra = sa_prev[mi][h] / sa;
          sa_prev[mi][h] = sa;
          const float r0 = ra * rb0, r1 = ra * rb1;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float r = (kSwiglu && j >= 4) ? r1 : r0;
            acc[mi][j][2 * h] *= r;
            acc[mi][j][2 * h + 1] *= r;
          }
        }
    }

    const uint8_t* as = smem + (kt % kStages) * kStageBytes;
    const uint8_t* bs = as + kABytes;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 32) {
      uint32_t a[4][4];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) ldsm_x4(a[mi], as + (wm * 64 + mi * 16 + a_lrow) * LDS + kk + a_lcol);
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        // n-tiles 2 jp and 2 jp + 1 (rows nb .. nb + 15 of the staged weights).
        const int nb = kSwiglu ? (jp < 2 ? wn * 32 + jp * 16 : BN / 2 + wn * 32 + (jp - 2) * 16) : wn * 64 + jp * 16;
        uint32_t b[4];
        ldsm_x4(b, bs + (nb + b_lrow) * LDS + kk + b_lcol);
#pragma unroll
        for (int mi = 0; mi < 4; ++mi) {
          mma_e4m3(acc[mi][2 * jp], a[mi], b);
          mma_e4m3(acc[mi][2 * jp + 1], a[mi], b + 2);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_begin + wm * 64 + mi * 16 + g + h * 8;
      if (r >= row_end) continue;
      const float s0 = sa_prev[mi][h] * sb_prev0, s1 = sa_prev[mi][h] * sb_prev1;
      if (kSwiglu) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int i = n0 + wn * 32 + j * 8 + tig * 2;
          const float g0 = acc[mi][j][h * 2] * s0, g1 = acc[mi][j][h * 2 + 1] * s0;
          const float u0 = acc[mi][j + 4][h * 2] * s1, u1 = acc[mi][j + 4][h * 2 + 1] * s1;
          bf16* o = static_cast<bf16*>(p.out) + int64_t(r) * p.ldo + i;
          if (i + 1 < p.N)
            *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(silu(g0) * u0, silu(g1) * u1);
          else if (i < p.N)
            o[0] = f2bf(silu(g0) * u0);
        }
      } else {
        const float scale = s0 * (MODE == int(LinMode::kDown) ? p.row_scale[r] : 1.f);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int n = n0 + wn * 64 + j * 8 + tig * 2 + q;
            if (n < p.N) {
              const float v = acc[mi][j][h * 2 + q] * scale;
              const int64_t o = int64_t(r) * p.ldo + n;
              if (p.out_f32)
                static_cast<float*>(p.out)[o] = v;
              else
                static_cast<bf16*>(p.out)[o] = f2bf(v);
            }
          }
      }
    }
  }
}

template <int MODE>
void launch_mode(const LinParams& p, const Fp8Act& a, cudaStream_t s) {
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(gemm_fp8_wide_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    attr_set = true;
  }
  const int cols = MODE == int(LinMode::kSwiglu) ? BN / 2 : BN;
  dim3 grid(ceil_div(p.N, cols), p.tile_expert ? p.max_tiles : ceil_div(p.M, BM));
  if (grid.y == 0 || grid.x == 0) return;
  gemm_fp8_wide_kernel<MODE><<<grid, kThreads, kSmemBytes, s>>>(p, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_gemm_fp8_wide(const LinParams& p, const Fp8Act& a, cudaStream_t s) {
  CU_REQUIRE(gemm_fp8_supported(p), "gemm_fp8_wide: unsupported shape or device");
  switch (p.mode) {
    case LinMode::kStore: launch_mode<int(LinMode::kStore)>(p, a, s); break;
    case LinMode::kSwiglu: launch_mode<int(LinMode::kSwiglu)>(p, a, s); break;
    case LinMode::kDown: launch_mode<int(LinMode::kDown)>(p, a, s); break;
  }
}

}  // namespace moeserve::cuda
