// Grouped GEMM with FP8 activations and FP8 128x128-block weights on tensor cores
// (mma.sync m16n8k32 e4m3 -> f32, sm_89+), the prefill path of linears and MoE experts.
//
// Tile 64 rows x 128 output columns; one K step is 128 = one scale block, so each step's
// products are accumulated exactly in a register tile `part`, then folded into the f32
// accumulator as acc += part * s_act[row, kb] * s_w[n-block, kb] (DeepSeek-style scaling:
// no dequantised copy of either operand is ever formed). 8 warps in a 2 x 4 grid, each
// warp 32 x 32. Operands travel global -> shared with cp.async in a 3-stage pipeline
// (27 KB per stage: A 64 x 144 B, B 128 x 144 B; rows padded by 16 bytes so the 32-bit
// fragment loads of a warp hit 32 distinct banks). Rows of A are gathered through x_rows
// (MoE: the sorted (token, expert) pairs read their token's row), missing rows and weight
// rows past N are zero-filled by cp.async's src-size operand.
//
// Modes as in k_gemm.cu: kStore, kSwiglu (the 128 staged weight rows are 64 rows of W1 and
// the same 64 rows of W3; the epilogue writes silu(g) * u), kDown (f32 rows scaled by the
// routing weight).
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/linear/mma_fp8.cuh"

namespace moeserve::cuda {
namespace {

constexpr int BM = kGemmTileM, BN = 128, BK = 128, LDS = BK + 16;  // LDS in bytes
constexpr int kStages = 3, kThreads = 256;
constexpr int kABytes = BM * LDS, kBBytes = BN * LDS, kStageBytes = kABytes + kBBytes;
constexpr int kSmemBytes = kStages * kStageBytes;  // 82,944

template <int MODE>
__global__ void __launch_bounds__(kThreads, 2) gemm_fp8_kernel(LinParams p, Fp8Act act) {
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
  const int wm = warp / 4, wn = warp % 4, g = lane >> 2, tig = lane & 3;

  // cp.async assignment: A has 64 rows x 8 chunks of 16 B (2 per thread), B 128 x 8 (4 per
  // thread: chunks tid + i * 256 are rows tid / 8 + 32 i, so for kSwiglu i < 2 read W1 and
  // i >= 2 read W3). Offsets are 32-bit (every operand here is < 2^31 bytes) to save registers.
  const int chunk = (tid % 8) * 16;
  uint32_t a_off[2];  // byte offset of the row's chunk in xq; ~0u = zero-fill
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row_begin + (tid + i * kThreads) / 8;
    a_off[i] = r < row_end ? uint32_t(p.x_rows ? p.x_rows[r] : r) * uint32_t(K) + chunk : ~0u;
  }
  const uint8_t* b_lo = static_cast<const uint8_t*>(kSwiglu ? ep->w1 : (ep ? ep->w2 : p.w));
  const uint8_t* b_hi = kSwiglu ? static_cast<const uint8_t*>(ep->w3) : b_lo;
  uint32_t b_off[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = (tid + i * kThreads) / 8;
    const int n = kSwiglu ? n0 + (row & (BN / 2 - 1)) : n0 + row;
    b_off[i] = n < p.N ? uint32_t(n) * uint32_t(K) + chunk : ~0u;
  }
  auto load_stage = [&](int slot, int kt) {
    uint8_t* as = smem + slot * kStageBytes + (tid / 8) * LDS + chunk;
    uint8_t* bs = smem + slot * kStageBytes + kABytes + (tid / 8) * LDS + chunk;
    const uint32_t kb = uint32_t(kt) * BK;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      cp_async16(as + i * 32 * LDS, act.xq + (a_off[i] == ~0u ? 0u : a_off[i] + kb), a_off[i] != ~0u);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      cp_async16(bs + i * 32 * LDS, (i < 2 ? b_lo : b_hi) + (b_off[i] == ~0u ? 0u : b_off[i] + kb), b_off[i] != ~0u);
  };

  // Activation-scale rows of this thread's accumulators: rows wm*32 + mi*16 + g (+8); -1 = none.
  int sa_off[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_begin + wm * 32 + mi * 16 + g + h * 8;
      sa_off[mi][h] = r < row_end ? (p.x_rows ? p.x_rows[r] : r) * kcols : -1;
    }
  // Weight-scale rows (one 128-row block per tile; for kSwiglu one of W1 and one of W3).
  const int sblk = n0 / 128;
  const float* sw0 = (kSwiglu ? ep->s1 : (ep ? ep->s2 : p.s)) + int64_t(sblk) * p.s_cols;
  const float* sw1 = kSwiglu ? ep->s3 + int64_t(sblk) * p.s_cols : sw0;

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

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

    // Scales of this K block (issued before the MMAs so their latency overlaps).
    float sa[2][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) sa[mi][h] = sa_off[mi][h] >= 0 ? __ldg(act.xs + sa_off[mi][h] + kt) : 0.f;
    const float sb0 = __ldg(sw0 + kt), sb1 = __ldg(sw1 + kt);

    const uint8_t* as = smem + (kt % kStages) * kStageBytes;
    const uint8_t* bs = as + kABytes;
    float part[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) part[i][j][q] = 0.f;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 32) {
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const uint8_t* r0 = as + (wm * 32 + mi * 16 + g) * LDS + kk + tig * 4;
        a[mi][0] = *reinterpret_cast<const uint32_t*>(r0);
        a[mi][1] = *reinterpret_cast<const uint32_t*>(r0 + 8 * LDS);
        a[mi][2] = *reinterpret_cast<const uint32_t*>(r0 + 16);
        a[mi][3] = *reinterpret_cast<const uint32_t*>(r0 + 8 * LDS + 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int nb = kSwiglu ? ((j < 2) ? wn * 16 + j * 8 : BN / 2 + wn * 16 + (j - 2) * 8) : wn * 32 + j * 8;
        const uint8_t* r0 = bs + (nb + g) * LDS + kk + tig * 4;
        b[j][0] = *reinterpret_cast<const uint32_t*>(r0);
        b[j][1] = *reinterpret_cast<const uint32_t*>(r0 + 16);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_e4m3(part[mi][j], a[mi], b[j]);
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float sb = (kSwiglu && j >= 2) ? sb1 : sb0;
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mi][j][q] = fmaf(part[mi][j][q], sa[mi][q >> 1] * sb, acc[mi][j][q]);
      }
  }
  cp_async_wait<0>();

  // ---- epilogue (as k_gemm.cu) ----
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_begin + wm * 32 + mi * 16 + g + h * 8;
      if (r >= row_end) continue;
      if (kSwiglu) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int i = n0 + wn * 16 + j * 8 + tig * 2;
          const float g0 = acc[mi][j][h * 2], g1 = acc[mi][j][h * 2 + 1];
          const float u0 = acc[mi][j + 2][h * 2], u1 = acc[mi][j + 2][h * 2 + 1];
          bf16* o = static_cast<bf16*>(p.out) + int64_t(r) * p.ldo + i;
          if (i + 1 < p.N) {
            *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(silu(g0) * u0, silu(g1) * u1);
          } else if (i < p.N) {
            o[0] = f2bf(silu(g0) * u0);
          }
        }
      } else {
        const float scale = MODE == int(LinMode::kDown) ? p.row_scale[r] : 1.f;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int n = n0 + wn * 32 + j * 8 + tig * 2 + q;
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
  static bool attr_set = false;  // once per instantiation (host-side, before any capture uses it)
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(gemm_fp8_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    attr_set = true;
  }
  const int cols = MODE == int(LinMode::kSwiglu) ? BN / 2 : BN;
  dim3 grid(ceil_div(p.N, cols), p.tile_expert ? p.max_tiles : ceil_div(p.M, BM));
  if (grid.y == 0 || grid.x == 0) return;
  gemm_fp8_kernel<MODE><<<grid, kThreads, kSmemBytes, s>>>(p, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemm_fp8_supported(const LinParams& p) {
  const bool weights_ok = p.experts != nullptr || (p.w != nullptr && p.s != nullptr);
  return p.fp8 && weights_ok && p.bo == 128 && p.bi == 128 && p.K > 0 && p.K % BK == 0 && p.N % 2 == 0 &&
         p.s_cols == p.K / BK && code_arch() >= 890;  // e4m3 mma.sync compiled in
}

void launch_gemm_fp8(const LinParams& p, const Fp8Act& a, cudaStream_t s) {
  CU_REQUIRE(gemm_fp8_supported(p), "gemm_fp8: unsupported shape or device (needs FP8 128x128 blocks, K % 128 == 0, sm_89+)");
  // Hopper: the wgmma kernel for expert tables and linears of >= 128 rows (below that the
  // 256-column tiles leave most SMs idle).
  if (p.fp8_wgmma && (p.tile_expert || p.M >= 128) && gemm_fp8_wgmma_supported(p))
    return launch_gemm_fp8_wgmma(p, a, s);
  CU_REQUIRE(!p.tile_expert || p.tile_rows <= BM, "gemm_fp8: tile table taller than the 64-row kernel's tiles");
  CU_REQUIRE(!p.out_q, "gemm_fp8: the quantising epilogue (out_q) exists only in the wgmma kernel");
  switch (p.mode) {
    case LinMode::kStore: launch_mode<int(LinMode::kStore)>(p, a, s); break;
    case LinMode::kSwiglu: launch_mode<int(LinMode::kSwiglu)>(p, a, s); break;
    case LinMode::kDown: launch_mode<int(LinMode::kDown)>(p, a, s); break;
  }
}

}  // namespace moeserve::cuda
