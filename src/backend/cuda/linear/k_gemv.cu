// Memory-bound linear path for small row counts (decode): y[r, n] = sum_k x[r, k] W[n, k].
// Each weight byte is read once per launch: a warp streams whole weight rows with 16-byte
// loads, dequantises FP8 (or widens bf16) in registers, and multiplies against up to
// kGemvTile activation rows of its tile (activations come through L1; they are tiny).
// The same kernel serves plain linears (one matrix, tiles = consecutive row chunks) and
// MoE experts (tile table from the align kernel: each tile holds <= kGemvTile rows of one
// expert, so an active expert's weights are read once per tile, i.e. once per step
// whenever it serves <= kGemvTile (token, k) pairs).
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 2;  // weight rows per warp (kSwiglu: the gate row and the up row)

struct TileInfo {
  int expert, begin, end;
};

__device__ __forceinline__ bool tile_of(const LinParams& p, int tile, TileInfo* ti) {
  if (p.tile_expert) {
    if (tile >= *p.num_tiles) return false;
    *ti = {p.tile_expert[tile], p.tile_begin[tile], p.tile_end[tile]};
  } else {
    ti->expert = -1;
    ti->begin = tile * kGemvTile;
    ti->end = min(p.M, ti->begin + kGemvTile);
  }
  return true;
}

// Unpacks 16 weights (one uint4 of FP8, two of bf16) into floats (unscaled).
template <bool FP8>
__device__ __forceinline__ void unpack16(const uint4* v, float* out) {
  if constexpr (FP8) {
    const uint32_t words[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 a = fp8x2_to_f2(uint16_t(words[i] & 0xffff));
      float2 b = fp8x2_to_f2(uint16_t(words[i] >> 16));
      out[4 * i] = a.x;
      out[4 * i + 1] = a.y;
      out[4 * i + 2] = b.x;
      out[4 * i + 3] = b.y;
    }
  } else {
    const uint32_t words[8] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float2 a = bf16x2_to_f2(words[i]);
      out[2 * i] = a.x;
      out[2 * i + 1] = a.y;
    }
  }
}

template <bool FP8>
__device__ __forceinline__ float load1(const void* w, int64_t idx) {
  if constexpr (FP8) {
    uint8_t b = static_cast<const uint8_t*>(w)[idx];
    return fp8x2_to_f2(uint16_t(b)).x;
  } else {
    return bf2f(static_cast<const bf16*>(w)[idx]);
  }
}

template <bool FP8, int MODE>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(LinParams p) {
  // MoE: grid (row blocks, tiles). Plain linear: a 1-D grid with the row tiles varying
  // fastest, so the <= 8 tiles that read the same weight rows run together and all but the
  // first find those rows in L2 (one DRAM pass over the weights for up to 64 rows).
  pdl_enter();
  int tile = blockIdx.y, nblk = blockIdx.x;
  if (!p.tile_expert) {
    const int ntiles = ceil_div(p.M, kGemvTile);
    tile = blockIdx.x % ntiles;
    nblk = blockIdx.x / ntiles;
  }
  TileInfo ti;
  if (!tile_of(p, tile, &ti)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_base = (nblk * kWarps + warp) * (MODE == int(LinMode::kSwiglu) ? 1 : kRowsPerWarp);

  // The weight matrices this warp reads and the global row of each of its kRowsPerWarp rows.
  const void* wmat[kRowsPerWarp];
  const float* smat[kRowsPerWarp];
  int64_t wrow[kRowsPerWarp];
  bool valid[kRowsPerWarp];
  const ExpertPtrs* ep = ti.expert >= 0 ? p.experts + ti.expert : nullptr;
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    if (MODE == int(LinMode::kSwiglu)) {
      wmat[j] = j == 0 ? ep->w1 : ep->w3;
      smat[j] = j == 0 ? ep->s1 : ep->s3;
      wrow[j] = n_base;
    } else {
      wmat[j] = ep ? ep->w2 : p.w;
      smat[j] = ep ? ep->s2 : p.s;
      wrow[j] = n_base + j;
    }
    valid[j] = wrow[j] < p.N;
    if (!valid[j]) wrow[j] = 0;  // read row 0, discard the result
  }
  if (!valid[0]) return;

  const int nrows = ti.end - ti.begin;
  const bf16* xrow[kGemvTile];
#pragma unroll
  for (int t = 0; t < kGemvTile; ++t) {
    const int r = ti.begin + min(t, nrows - 1);
    const int xr = p.x_rows ? p.x_rows[r] : r;
    xrow[t] = static_cast<const bf16*>(p.x) + int64_t(xr) * p.ldx;
  }

  float acc[kGemvTile][kRowsPerWarp];
#pragma unroll
  for (int t = 0; t < kGemvTile; ++t)
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) acc[t][j] = 0.f;

  const int K = p.K;
  // 16-byte vector path needs every row start and every x row 16-byte aligned.
  const bool vec = (K % 16 == 0) && (p.ldx % 8 == 0) && (p.bi % 16 == 0);
  if (vec) {
    // The 16 weights of a lane lie in one block_in column block (16 | bi), so the block scale
    // multiplies the 16-term partial sum once per row instead of every weight (fewer ALU ops:
    // decode MoE tiles of 1-2 rows are otherwise bound by the dequantisation arithmetic).
    // Loads of kUnroll consecutive 512-column chunks are all issued before any arithmetic:
    // a warp then has kUnroll x kRowsPerWarp 16-byte loads per lane in flight (one K=3072 FP8
    // row pair in a single round trip), which is what keeps HBM busy at 1-8 rows per tile.
    constexpr int kVec = FP8 ? 1 : 2;           // uint4 per 16 weights
    constexpr int kUnroll = FP8 ? 4 : 1;  // bf16 (lm_head) already streams at ~bandwidth
    for (int k0 = lane * 16; k0 < K; k0 += 32 * 16 * kUnroll) {
      uint4 raw[kUnroll][kRowsPerWarp][kVec];
      float sc[kUnroll][kRowsPerWarp];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int k = k0 + u * 512;
        if (k < K) {
#pragma unroll
          for (int j = 0; j < kRowsPerWarp; ++j) {
            const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(wmat[j]) +
                                                              (wrow[j] * K + k) * (FP8 ? 1 : 2));
#pragma unroll
            for (int v = 0; v < kVec; ++v) raw[u][j][v] = __ldg(src + v);
            sc[u][j] = FP8 ? __ldg(smat[j] + (wrow[j] / p.bo) * p.s_cols + k / p.bi) : 1.f;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int k = k0 + u * 512;
        if (k >= K) break;
        float w[kRowsPerWarp][16];
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j) unpack16<FP8>(raw[u][j], w[j]);
#pragma unroll
        for (int t = 0; t < kGemvTile; ++t) {
          if (t < nrows) {
            const uint4* xp = reinterpret_cast<const uint4*>(xrow[t] + k);
            const uint4 a = __ldg(xp), b = __ldg(xp + 1);
            const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float part[kRowsPerWarp];
#pragma unroll
            for (int j = 0; j < kRowsPerWarp; ++j) part[j] = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const float2 xv = bf16x2_to_f2(words[i]);
#pragma unroll
              for (int j = 0; j < kRowsPerWarp; ++j) {
                part[j] = fmaf(w[j][2 * i], xv.x, part[j]);
                part[j] = fmaf(w[j][2 * i + 1], xv.y, part[j]);
              }
            }
#pragma unroll
            for (int j = 0; j < kRowsPerWarp; ++j) acc[t][j] = fmaf(part[j], sc[u][j], acc[t][j]);
          }
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
      float w[kRowsPerWarp];
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        w[j] = load1<FP8>(wmat[j], wrow[j] * K + k);
        if (FP8) w[j] *= smat[j][(wrow[j] / p.bo) * p.s_cols + k / p.bi];
      }
#pragma unroll
      for (int t = 0; t < kGemvTile; ++t)
        if (t < nrows) {
          const float xv = bf2f(xrow[t][k]);
#pragma unroll
          for (int j = 0; j < kRowsPerWarp; ++j) acc[t][j] = fmaf(w[j], xv, acc[t][j]);
        }
    }
  }

#pragma unroll
  for (int t = 0; t < kGemvTile; ++t)
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) acc[t][j] = warp_sum(acc[t][j]);

  if (lane < kGemvTile && lane < nrows) {
    // Lane t writes row t (static register indexing through the unrolled select).
    float v[kRowsPerWarp];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      v[j] = acc[0][j];
#pragma unroll
      for (int t = 1; t < kGemvTile; ++t)
        if (lane == t) v[j] = acc[t][j];
    }
    const int r = ti.begin + lane;
    if (MODE == int(LinMode::kSwiglu)) {
      static_cast<bf16*>(p.out)[int64_t(r) * p.ldo + n_base] = f2bf(silu(v[0]) * v[1]);
    } else {
      const float scale = MODE == int(LinMode::kDown) ? p.row_scale[r] : 1.f;
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        if (!valid[j]) continue;
        const int64_t o = int64_t(r) * p.ldo + wrow[j];
        if (p.out_f32)
          static_cast<float*>(p.out)[o] = v[j] * scale;
        else
          static_cast<bf16*>(p.out)[o] = f2bf(v[j] * scale);
      }
    }
  }
}

template <int MODE>
void launch_mode(const LinParams& p, cudaStream_t s) {
  const int rows_per_block = kWarps * (MODE == int(LinMode::kSwiglu) ? 1 : kRowsPerWarp);
  const int nblocks = ceil_div(p.N, rows_per_block);
  dim3 grid = p.tile_expert ? dim3(nblocks, p.max_tiles) : dim3(nblocks * ceil_div(p.M, kGemvTile), 1);
  if (grid.x == 0 || grid.y == 0) return;
  if (p.fp8)
    launch_pdl(gemv_kernel<true, MODE>, grid, dim3(kWarps * 32), 0, s, p);
  else
    launch_pdl(gemv_kernel<false, MODE>, grid, dim3(kWarps * 32), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_gemv(const LinParams& p, cudaStream_t s) {
  if (gemv_tc_supported(p)) {
    launch_gemv_tc(p, s);
    return;
  }
  switch (p.mode) {
    case LinMode::kStore: launch_mode<int(LinMode::kStore)>(p, s); break;
    case LinMode::kSwiglu: launch_mode<int(LinMode::kSwiglu)>(p, s); break;
    case LinMode::kDown: launch_mode<int(LinMode::kDown)>(p, s); break;
  }
}

}  // namespace moeserve::cuda
