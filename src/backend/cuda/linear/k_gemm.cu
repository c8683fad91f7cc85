// Tensor-core linear path for larger row counts (prefill; MoE prefill as a grouped GEMM).
// Tile 64 (rows) x 128 (output columns) x 32 (k), 8 warps in a 2 x 4 grid, each warp 32 x 32
// with mma.sync m16n8k16 bf16 -> f32. Weights are dequantised while being staged into shared
// memory: bf16(fp8 * block_scale) (relative error <= 2^-9 per weight, well under the bf16
// activation rounding already present). Runs on sm_80+; the FP8-native paths (cuBLASLt
// block-scaled FP8, k_gemm_fp8*.cu) take FP8 linears from fp8_act_min_tokens rows: see the
// kernel table in src/backend/cuda/README.md.
//
// Modes: kStore (plain linear), kSwiglu (the block's 128 staged rows are 64 rows of W1 and the
// same 64 rows of W3, so each thread holds matching gate/up accumulators and writes
// silu(g) * u directly), kDown (f32 rows scaled by the routing weight).
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"

namespace moeserve::cuda {
namespace {

constexpr int BM = kGemmTileM, BN = 128, BK = 32, PAD = 8, LDS = BK + PAD;  // LDS in bf16
constexpr int kThreads = 256;

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int MODE>
__global__ void __launch_bounds__(kThreads) gemm_kernel(LinParams p) {
  __shared__ __align__(16) bf16 As[BM][LDS];
  __shared__ __align__(16) bf16 Bs[BN][LDS];

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
  constexpr bool kSwiglu = MODE == int(LinMode::kSwiglu);
  // Output columns covered by this block: kSwiglu: I-rows [n0, n0 + 64); else [n0, n0 + 128).
  const int n0 = blockIdx.x * (kSwiglu ? BN / 2 : BN);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / 4, wn = warp % 4, g = lane >> 2, tig = lane & 3;
  const int K = p.K;
  const bool vec = (K % 16 == 0) && (p.ldx % 8 == 0) && (p.bi % 16 == 0);

  // Staging assignment: A: row tid/4, 8 k-values at (tid%4)*8. B: row tid/2, 16 k at (tid%2)*16.
  const int a_row = tid >> 2, a_col = (tid & 3) * 8;
  const int b_row = tid >> 1, b_col = (tid & 1) * 16;
  const int a_r = row_begin + a_row;
  const bool a_ok = a_r < row_end;
  const bf16* a_src =
      static_cast<const bf16*>(p.x) + int64_t(a_ok ? (p.x_rows ? p.x_rows[a_r] : a_r) : 0) * p.ldx;
  const void* b_mat;
  const float* b_scale;
  int b_n;  // row of b_mat
  if (kSwiglu) {
    const bool up = b_row >= BN / 2;
    b_mat = up ? ep->w3 : ep->w1;
    b_scale = up ? ep->s3 : ep->s1;
    b_n = n0 + (b_row & (BN / 2 - 1));
  } else {
    b_mat = ep ? ep->w2 : p.w;
    b_scale = ep ? ep->s2 : p.s;
    b_n = n0 + b_row;
  }
  const bool b_ok = b_n < p.N;

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

  for (int k0 = 0; k0 < K; k0 += BK) {
    // ---- stage A (bf16 activations) ----
    {
      uint32_t v[4] = {0, 0, 0, 0};
      const int k = k0 + a_col;
      if (a_ok) {
        if (vec) {
          if (k < K) {
            uint4 t = __ldg(reinterpret_cast<const uint4*>(a_src + k));
            v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
          }
        } else {
          float f[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) f[i] = k + i < K ? bf2f(a_src[k + i]) : 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] = pack_bf16(f[2 * i], f[2 * i + 1]);
        }
      }
      *reinterpret_cast<uint4*>(&As[a_row][a_col]) = make_uint4(v[0], v[1], v[2], v[3]);
    }
    // ---- stage B (weights, dequantised to bf16) ----
    {
      float f[16];
      const int k = k0 + b_col;
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = 0.f;
      if (b_ok) {
        if (vec && k < K) {
          if (p.fp8) {
            const uint4 t = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(b_mat) +
                                                                 int64_t(b_n) * K + k));
            const uint32_t w[4] = {t.x, t.y, t.z, t.w};
            const float sc = __ldg(b_scale + (b_n / p.bo) * p.s_cols + k / p.bi);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              float2 lo = fp8x2_to_f2(uint16_t(w[i] & 0xffff)), hi = fp8x2_to_f2(uint16_t(w[i] >> 16));
              f[4 * i] = lo.x * sc, f[4 * i + 1] = lo.y * sc, f[4 * i + 2] = hi.x * sc, f[4 * i + 3] = hi.y * sc;
            }
          } else {
            const uint4* src = reinterpret_cast<const uint4*>(static_cast<const bf16*>(b_mat) + int64_t(b_n) * K + k);
            const uint4 t0 = __ldg(src), t1 = __ldg(src + 1);
            const uint32_t w[8] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z, t1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              float2 x = bf16x2_to_f2(w[i]);
              f[2 * i] = x.x, f[2 * i + 1] = x.y;
            }
          }
        } else if (!vec) {
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            if (k + i < K) {
              const int64_t idx = int64_t(b_n) * K + k + i;
              if (p.fp8)
                f[i] = fp8x2_to_f2(uint16_t(static_cast<const uint8_t*>(b_mat)[idx])).x *
                       b_scale[(b_n / p.bo) * p.s_cols + (k + i) / p.bi];
              else
                f[i] = bf2f(static_cast<const bf16*>(b_mat)[idx]);
            }
          }
        }
      }
      uint32_t v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = pack_bf16(f[2 * i], f[2 * i + 1]);
      *reinterpret_cast<uint4*>(&Bs[b_row][b_col]) = make_uint4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<uint4*>(&Bs[b_row][b_col + 8]) = make_uint4(v[4], v[5], v[6], v[7]);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = wm * 32 + mi * 16 + g;
        a[mi][0] = *reinterpret_cast<const uint32_t*>(&As[r][kk + tig * 2]);
        a[mi][1] = *reinterpret_cast<const uint32_t*>(&As[r + 8][kk + tig * 2]);
        a[mi][2] = *reinterpret_cast<const uint32_t*>(&As[r][kk + 8 + tig * 2]);
        a[mi][3] = *reinterpret_cast<const uint32_t*>(&As[r + 8][kk + 8 + tig * 2]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int nb = kSwiglu ? ((j < 2) ? wn * 16 + j * 8 : BN / 2 + wn * 16 + (j - 2) * 8) : wn * 32 + j * 8;
        b[j][0] = *reinterpret_cast<const uint32_t*>(&Bs[nb + g][kk + tig * 2]);
        b[j][1] = *reinterpret_cast<const uint32_t*>(&Bs[nb + g][kk + 8 + tig * 2]);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_bf16(acc[mi][j], a[mi], b[j]);
    }
    __syncthreads();
  }

  // ---- epilogue ----
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // h = 0: row g, h = 1: row g + 8
      const int r = row_begin + wm * 32 + mi * 16 + g + h * 8;
      if (r >= row_end) continue;
      if (kSwiglu) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int i = n0 + wn * 16 + j * 8 + tig * 2 + q;
            if (i < p.N) {
              const float gv = acc[mi][j][h * 2 + q], uv = acc[mi][j + 2][h * 2 + q];
              static_cast<bf16*>(p.out)[int64_t(r) * p.ldo + i] = f2bf(silu(gv) * uv);
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
void launch_mode(const LinParams& p, cudaStream_t s) {
  const int cols = MODE == int(LinMode::kSwiglu) ? BN / 2 : BN;
  dim3 grid(ceil_div(p.N, cols), p.tile_expert ? p.max_tiles : ceil_div(p.M, BM));
  if (grid.y == 0) return;
  gemm_kernel<MODE><<<grid, kThreads, 0, s>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_gemm(const LinParams& p, cudaStream_t s) {
  switch (p.mode) {
    case LinMode::kStore: launch_mode<int(LinMode::kStore)>(p, s); break;
    case LinMode::kSwiglu: launch_mode<int(LinMode::kSwiglu)>(p, s); break;
    case LinMode::kDown: launch_mode<int(LinMode::kDown)>(p, s); break;
  }
}

}  // namespace moeserve::cuda
