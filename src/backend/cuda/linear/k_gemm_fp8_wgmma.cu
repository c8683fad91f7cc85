// Hopper (sm_90a) grouped FP8 GEMM for the prefill experts: wgmma e4m3 -> f32, block-scaled
// like k_gemm_fp8.cu (same LinParams / Fp8Act contract and tile table, so the MoE align step
// is unchanged), warp-specialised and persistent.
//
// CTA = 3 warpgroups, 384 threads, one CTA per SM looping over (row tile, column tile) pairs:
// - warpgroup 0 (producer, 40 registers after setmaxnreg): cp.async (16 B, zero-fill for
//   missing rows) of the A tile [BM rows, 128 k] (rows gathered through x_rows: TMA cannot
//   gather) and the B tile [BNW weight rows, 128 k] into a kStages ring, plus 4-byte copies of
//   the stage's scales (the A rows' activation scales and each consumer's weight-block
//   scales) into the stage, so the consumers never wait on global loads. Each thread's
//   copies arrive on the stage's `full` mbarrier (cp.async.mbarrier.arrive.noinc, 128
//   arrivals). Chunks are stored 128-byte swizzled (16-B chunk c of row r at c ^ (r % 8)),
//   the layout the wgmma descriptors (swizzle mode 1, 1024-byte 8-row groups) read.
// - warpgroups 1 and 2 (consumers, 232 registers): per 128-wide K block, 4 wgmma k32 into a
//   partial tile `part`, wait, free the stage (one lane per warp arrives on `empty`, 8
//   arrivals), then promote acc += part * s_act[row, kb] * s_w[n-block, kb] (the DeepGEMM
//   idea: the f32 accumulator sees each block's exact partial sum times its two scales).
//   While one consumer promotes, the other's wgmmas keep the tensor cores busy.
// Tile shapes: see Cfg below. kSwiglu: half of a consumer's weight rows are W1 rows, the
// other half the same rows of W3, so silu(g) * u is formed in registers.
// The producer runs ahead across tiles, so the consumers' epilogue overlaps the next tile's
// loads.
#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/linear/mma_fp8.cuh"
#include "backend/cuda/linear/wgmma.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace moeserve::cuda {

// Tile shapes: MoE expert tables of 128 rows on the 128 x 256 tiles (kShapeWide), linears
// (plain row ranges) and 64-row tables on 64 x 256 (kShapeN). The 128 x 192 tiles
// (kShapePair), 128 x 256 for linears and the fused quantising epilogue (QOUT) measured slower
// and are not built (their code paths stay in the templates below, uninstantiated;
// docs/bench/cuda_switch_inventory.md). PREFILL_OFF=gemm_wgmma clears LinParams::fp8_wgmma.

namespace wgmma_detail {  // named: the sm_80 device pass does not use every member

constexpr int BK = 128, kThreads = 384;

// Three tile shapes (SHAPE):
//  - kShapeN, 64 rows x 256 weight rows: both consumers multiply the same A [64 x 128] by
//    their own 128 weight rows (wgmma N = 128); 64-row tile table.
//  - kShapePair, 128 rows x 192 weight rows: consumer w multiplies A rows [64 w, 64 w + 64)
//    by the shared B [192 x 128] (wgmma N = 192); 128-row tile table (p.tile_rows == 128).
//    Fewer bytes per flop from L2 (1/128 + 1/192 against 1/64 + 1/256); a consumer without
//    rows idles.
//  - kShapeWide, 128 rows x 256 weight rows: consumer w multiplies A rows [64 w, 64 w + 64)
//    by the shared B [256 x 128] in two halves of 128 weight rows (wgmma N = 128 each, one
//    partial tile reused, so the registers hold acc 2 x 64 + part 64); 128-row tile table;
//    1/128 + 1/256 bytes per flop (40% less L2 traffic than kShapeN); 4 stages.
constexpr int kShapeN = 0, kShapePair = 1, kShapeWide = 2;
template <int SHAPE>
struct Cfg {
  static constexpr bool PAIR = SHAPE == kShapePair, WIDE = SHAPE == kShapeWide;
  static constexpr int kStages = WIDE ? 4 : 5;
  static constexpr int BM = PAIR || WIDE ? 128 : 64;
  static constexpr int BNW = PAIR ? 192 : 256;  // weight rows per tile
  static constexpr int NW = PAIR ? 192 : 128;   // wgmma N per consumer (per half for WIDE)
  static constexpr int NJ = NW / 8;             // 8-column accumulator groups per consumer (half)
  // Stage = A tile, B tile, scales: the A rows' activation scales (BM floats) at +0 and
  // per consumer the weight scales {W1 lo, W1 hi, W3 lo, W3 hi} block at float 128 + 4 cw.
  static constexpr int kABytes = BM * BK, kBBytes = BNW * BK, kScaleOff = kABytes + kBBytes;
  static constexpr int kStageBytes = kScaleOff + 1024;
  // After the ring: the full / empty mbarriers, then (fused quantising epilogue) per-row
  // |max| exchange between the two consumers, double-buffered by tile parity [2][2][64].
  static constexpr int kBarOff = kStages * kStageBytes, kRedOff = kBarOff + 128;
  static constexpr int kSmemBytes = kRedOff + 2 * 2 * 64 * 4 + 1024 /* alignment */;
  static_assert(kStageBytes % 1024 == 0 && kABytes % 1024 == 0, "swizzle atoms need 1024-byte alignment");
  // Output columns per tile (kSwiglu: half the weight rows are W1, half W3).
  static constexpr int cols(bool swiglu) { return swiglu ? BNW / 2 : BNW; }
};

}  // namespace wgmma_detail

namespace {

using namespace wgmma_detail;

#ifdef MOESERVE_SM90A_DEVICE
// Destination of 16-byte chunk c of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

struct Tile {
  int expert, row_begin, row_end, ct;
};
__device__ __forceinline__ Tile tile_of(const LinParams& p, int t, int ncol, int bm) {
  Tile r;
  const int rt = t / ncol;
  r.ct = t - rt * ncol;
  if (p.tile_expert) {
    r.expert = p.tile_expert[rt];
    r.row_begin = p.tile_begin[rt];
    r.row_end = p.tile_end[rt];
  } else {
    r.expert = -1;
    r.row_begin = rt * bm;
    r.row_end = min(p.M, r.row_begin + bm);
  }
  return r;
}

// Weight row (relative to n0 + rr, in units of 16 rows) and matrix (0: W1 / W, 1: W3) of
// B-tile row rr + 16 i.
template <bool PAIR, bool SWIGLU>
__device__ __forceinline__ constexpr int b_row16(int i) {
  return !SWIGLU ? i : PAIR ? i % 6 : 4 * (i / 8) + i % 4;
}
template <bool PAIR, bool SWIGLU>
__device__ __forceinline__ constexpr int b_half(int i) {
  return !SWIGLU ? 0 : PAIR ? (i >= 6) : (i / 4) & 1;
}

// Consumer of the 128 x 256 tiles (kShapeWide). The B tile is laid out as for kShapeN (rows
// [128 hf, 128 hf + 128) are what kShapeN's consumer hf multiplies: for kSwiglu 64 W1 rows then
// the same 64 rows of W3), so the producer is shared. A tile of more than 64 rows is split by
// rows: consumer cw takes A rows [64 cw, 64 cw + 64) and both halves hf, one after the other,
// into one partial tile. A tile of <= 64 rows (an expert's last, or only, tile) is split by
// columns as kShapeN does: both consumers take A rows [0, 64), consumer cw half cw, so neither
// idles. `red` (fused quantisation, split-column tiles only): per-row |max| exchange, as in
// the kernel below.
template <int MODE, bool QOUT>
__device__ __forceinline__ void wide_consumer(const LinParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                              int total, int ncol, int cw, int warp, int lane) {
  using C = Cfg<kShapeWide>;
  constexpr bool kSwiglu = MODE == int(LinMode::kSwiglu);
  constexpr int BM = C::BM, NJ = C::NJ, kCols = C::cols(kSwiglu), kStages = C::kStages;
  const uint8_t* b_tile = smem + C::kABytes;
  // qbar: split-column tiles so far (the same count in both consumers), the `red` buffer parity.
  uint32_t it = 0, qbar = 0;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const Tile tl = tile_of(p, tile, ncol, BM);
    const bool splitn = tl.row_end - tl.row_begin <= 64;  // same for both consumers
    const int r0 = tl.row_begin + (splitn ? 0 : 64 * cw);
    const bool active = r0 < tl.row_end;  // split by rows: the second consumer may have none
    const uint8_t* a_tile = smem + (splitn ? 0 : cw * 64 * BK);
    int rows[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[h] = r0 + 16 * warp + lane / 4 + 8 * h;
    const int sa_idx = rows[0] - tl.row_begin;
    // Half hf covers output columns c0 + hw hf + 8 (j mod NJ') (NJ' = NJ / 2 for kSwiglu).
    const int c00 = tl.ct * kCols, hw = kSwiglu ? 64 : 128;
    float acc[2][4 * NJ], part[4 * NJ];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int i = 0; i < 4 * NJ; ++i) acc[hf][i] = 0.f;
    for (int kt = 0; kt < p.K / BK; ++kt, ++it) {
      const int s = int(it % kStages);
      sm90::mbar_wait(full + s, (it / kStages) & 1);
      const float* ss = reinterpret_cast<const float*>(smem + s * C::kStageBytes + C::kScaleOff);
      const float sa0 = ss[sa_idx], sa1 = ss[sa_idx + 8];
      float ws[8];  // per half {W1 lo, W1 hi, W3 lo, W3 hi}
#pragma unroll
      for (int i = 0; i < 8; ++i) ws[i] = ss[128 + i];
      if (active) {
        sm90::fence_proxy_async();
        const uint64_t da = sm90::smem_desc_sw128(a_tile + s * C::kStageBytes);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          if (splitn && hf != cw) continue;
          const uint64_t db = sm90::smem_desc_sw128(b_tile + s * C::kStageBytes + hf * 128 * BK);
#pragma unroll
          for (int i = 0; i < 4 * NJ; ++i) sm90::reg_fence(part[i]);
          sm90::wgmma_fence();
#pragma unroll
          for (int k = 0; k < BK / 32; ++k) sm90::wgmma_m64n128k32_e4m3(part, da + 2 * k, db + 2 * k, k > 0);
          sm90::wgmma_commit();
          sm90::wgmma_wait0();
#pragma unroll
          for (int i = 0; i < 4 * NJ; ++i) sm90::reg_fence(part[i]);
          if ((hf == 1 || splitn) && lane == 0) sm90::mbar_arrive(empty + s);
          const int jsplit = (128 - ((c00 + hw * hf) & 127)) / 8;
#pragma unroll
          for (int j = 0; j < NJ; ++j) {
            const bool up = kSwiglu && j >= NJ / 2;
            const int jj = kSwiglu ? j % (NJ / 2) : j;
            const bool hi = jj >= jsplit;
            const float sb = ws[4 * hf + (up ? 2 : 0) + (hi ? 1 : 0)];
            const float f0 = sa0 * sb, f1 = sa1 * sb;
            acc[hf][4 * j + 0] = fmaf(part[4 * j + 0], f0, acc[hf][4 * j + 0]);
            acc[hf][4 * j + 1] = fmaf(part[4 * j + 1], f0, acc[hf][4 * j + 1]);
            acc[hf][4 * j + 2] = fmaf(part[4 * j + 2], f1, acc[hf][4 * j + 2]);
            acc[hf][4 * j + 3] = fmaf(part[4 * j + 3], f1, acc[hf][4 * j + 3]);
          }
        }
      } else if (lane == 0) {
        sm90::mbar_arrive(empty + s);
      }
    }
    if (!active) continue;

    // ---- epilogue (lane holds 2 adjacent columns per 8-column group) ----
    if constexpr (QOUT) {
      // |max| of each row over its 128 columns: both halves here (split by rows), or this
      // consumer's half and the other's through shared memory (split by columns).
      float v[2][2][NJ];  // [h][hf][2 j + c]
      float am[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m = 0.f;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
          for (int j = 0; j < NJ / 2; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float g = acc[hf][4 * j + 2 * h + c], u = acc[hf][4 * (j + NJ / 2) + 2 * h + c];
              const float b = __bfloat162float(__float2bfloat16_rn(silu(g) * u));
              v[h][hf][2 * j + c] = b;
              if (!splitn || hf == cw) m = fmaxf(m, fabsf(b));
            }
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        am[h] = m;
      }
      if (splitn) {
        float* red = reinterpret_cast<float*>(smem + C::kRedOff) + (qbar++ & 1) * 128;
        const int lr = 16 * warp + lane / 4;
        if (lane % 4 == 0) red[cw * 64 + lr] = am[0], red[cw * 64 + lr + 8] = am[1];
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
#pragma unroll
        for (int h = 0; h < 2; ++h) am[h] = fmaxf(am[h], red[(1 - cw) * 64 + lr + 8 * h]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rows[h];
        if (r >= tl.row_end) continue;
        // The scale as quant_fp8_kernel computes it; the elements are multiplied by its
        // reciprocal (one division per row: 64 IEEE divisions per row cost ~1 us per tile).
        const float sc = am[h] > 0.f ? am[h] / kFp8Max : 1.f, inv = 1.f / sc;
        uint8_t* o = p.out_q + size_t(r) * p.ldo;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          if (splitn && hf != cw) continue;
#pragma unroll
          for (int j = 0; j < NJ / 2; ++j) {
            const int c = c00 + hw * hf + 8 * j + 2 * (lane % 4);
            *reinterpret_cast<__nv_fp8x2_storage_t*>(o + c) = __nv_cvt_float2_to_fp8x2(
                make_float2(v[h][hf][2 * j] * inv, v[h][hf][2 * j + 1] * inv), __NV_SATFINITE, __NV_E4M3);
          }
        }
        if ((!splitn || cw == 0) && lane % 4 == 0) p.out_qs[size_t(r) * (p.N / 128) + c00 / 128] = sc;
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rows[h];
        if (r >= tl.row_end) continue;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          if (splitn && hf != cw) continue;
          const int c0 = c00 + hw * hf;
          if (kSwiglu) {
            bf16* o = static_cast<bf16*>(p.out) + size_t(r) * p.ldo;
#pragma unroll
            for (int j = 0; j < NJ / 2; ++j) {
              const int c = c0 + 8 * j + 2 * (lane % 4);
              if (c < p.N) {
                const float ga = acc[hf][4 * j + 2 * h], gb = acc[hf][4 * j + 2 * h + 1];
                const float ua = acc[hf][4 * (j + NJ / 2) + 2 * h], ub = acc[hf][4 * (j + NJ / 2) + 2 * h + 1];
                *reinterpret_cast<__nv_bfloat162*>(o + c) = __floats2bfloat162_rn(silu(ga) * ua, silu(gb) * ub);
              }
            }
          } else {
            const float scale = MODE == int(LinMode::kDown) ? p.row_scale[r] : 1.f;
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
              const int c = c0 + 8 * j + 2 * (lane % 4);
              if (c < p.N) {
                const float va = acc[hf][4 * j + 2 * h] * scale, vb = acc[hf][4 * j + 2 * h + 1] * scale;
                const size_t o = size_t(r) * p.ldo + c;
                if (p.out_f32)
                  *reinterpret_cast<float2*>(static_cast<float*>(p.out) + o) = make_float2(va, vb);
                else
                  *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.out) + o) = __floats2bfloat162_rn(va, vb);
              }
            }
          }
        }
      }
    }
  }
}
#endif

// QOUT (kSwiglu, 256-weight-row tiles): the epilogue quantises bf16(silu(g) * u) to e4m3 per
// 128 columns (p.out_q / p.out_qs) instead of storing bf16. A tile's 128 output columns are one
// quantisation group, split 64 / 64 between the consumers, so each row's |max| is reduced
// over the lane quad, then exchanged with the other consumer through shared memory.
template <int MODE, int SHAPE, bool QOUT = false>
__global__ void __launch_bounds__(kThreads, 1) gemm_fp8_wgmma_kernel(LinParams p, Fp8Act act) {
#ifdef MOESERVE_SM90A_DEVICE
  using C = Cfg<SHAPE>;
  constexpr bool PAIR = C::PAIR, WIDE = C::WIDE;
  constexpr int kStages = C::kStages;
  constexpr bool kSwiglu = MODE == int(LinMode::kSwiglu);
  static_assert(!QOUT || (kSwiglu && !PAIR && C::cols(true) == 128), "fused quantisation: 256-weight-row swiglu tiles");
  constexpr int BM = C::BM, BNW = C::BNW, NJ = C::NJ, kCols = C::cols(kSwiglu);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kBarOff);
  uint64_t* empty = full + kStages;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(full + s, 128);
      sm90::mbar_init(empty + s, 8);
    }
  }
  __syncthreads();

  const int K = p.K, KT = K / BK;
  const int ncol = ceil_div(p.N, kCols);
  const int total = (p.tile_expert ? *p.num_tiles : ceil_div(p.M, BM)) * ncol;

  if (wg == 0) {
    // ---------------- producer ----------------
    sm90::setmaxnreg_dec<40>();
    const int rr = tid / 8, chunk = tid % 8;  // rows rr + 16 i, 16-byte chunk `chunk`
    uint32_t it = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const Tile tl = tile_of(p, tile, ncol, BM);
      const ExpertPtrs* ep = tl.expert >= 0 ? p.experts + tl.expert : nullptr;
      // 32-bit byte offsets (every operand is < 2^31 bytes, checked by the launcher) keep the
      // producer inside its 40 registers. ~0u: row missing (zero-filled).
      uint32_t a_off[BM / 16];
#pragma unroll
      for (int i = 0; i < BM / 16; ++i) {
        const int r = tl.row_begin + rr + 16 * i;
        a_off[i] = r < tl.row_end ? uint32_t(p.x_rows ? p.x_rows[r] : r) * uint32_t(K) + chunk * 16 : ~0u;
      }
      const uint8_t* w_lo = static_cast<const uint8_t*>(kSwiglu ? ep->w1 : (ep ? ep->w2 : p.w));
      const uint8_t* w_hi = kSwiglu ? static_cast<const uint8_t*>(ep->w3) : w_lo;
      const int n0 = tl.ct * kCols + rr;
      // Scales copied with each stage (so the consumers never wait on global loads): thread
      // t < BM the activation scale of A row t, thread t < 8 weight scale t % 4 of consumer t / 4.
      uint32_t sa_src = ~0u;  // element offset into act.xs
      if (tid < BM && tl.row_begin + tid < tl.row_end) {
        const int r = tl.row_begin + tid;
        sa_src = uint32_t(p.x_rows ? p.x_rows[r] : r) * uint32_t(KT);
      }
      const float* sw_src = nullptr;
      if (tid < 8) {
        const int q = tid % 4, c0 = tl.ct * kCols + (PAIR ? 0 : (kSwiglu ? 64 : 128) * (tid / 4));
        const int nblk = (p.N + 127) / 128, blo = min(c0 / 128, nblk - 1), blk = q & 1 ? min(blo + 1, nblk - 1) : blo;
        const float* base = q >= 2 ? (kSwiglu ? ep->s3 : nullptr) : (kSwiglu ? ep->s1 : (ep ? ep->s2 : p.s));
        if (base) sw_src = base + size_t(blk) * KT;
      }
      const uint32_t b_off = uint32_t(n0) * uint32_t(K) + chunk * 16, k16 = 16u * uint32_t(K);
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int s = int(it % kStages);
        sm90::mbar_wait(empty + s, ((it / kStages) & 1) ^ 1);
        uint8_t* as = smem + s * C::kStageBytes;
        uint8_t* bs = as + C::kABytes;
        const uint32_t kb = uint32_t(kt) * BK;
#pragma unroll
        for (int i = 0; i < BM / 16; ++i)
          cp_async16(as + swz(rr + 16 * i, chunk), act.xq + (a_off[i] == ~0u ? 0u : a_off[i] + kb), a_off[i] != ~0u);
#pragma unroll
        for (int i = 0; i < BNW / 16; ++i) {
          const int row16 = b_row16<PAIR, kSwiglu>(i);
          const uint8_t* base = b_half<PAIR, kSwiglu>(i) ? w_hi : w_lo;
          const bool ok = n0 + 16 * row16 < p.N;
          cp_async16(bs + swz(rr + 16 * i, chunk), base + (ok ? b_off + uint32_t(row16) * k16 + kb : 0u), ok);
        }
        float* ss = reinterpret_cast<float*>(as + C::kScaleOff);
        if (tid < BM) cp_async4(ss + tid, act.xs + (sa_src == ~0u ? 0u : sa_src + kt), sa_src != ~0u);
        if (tid < 8) cp_async4(ss + 128 + tid, sw_src ? sw_src + kt : act.xs, sw_src != nullptr);
        sm90::cp_async_mbar_arrive(full + s);
      }
    }
    sm90::cp_async_wait_all();
    return;
  }

  // ---------------- consumers ----------------
  sm90::setmaxnreg_inc<232>();
  const int cw = wg - 1;  // consumer index 0 / 1
  const int lt = tid % 128, warp = lt / 32, lane = lt % 32;
  if constexpr (WIDE) {
    wide_consumer<MODE, QOUT>(p, smem, full, empty, total, ncol, cw, warp, lane);
    return;
  }
  uint32_t it = 0, tile_iter = 0;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x, ++tile_iter) {
    const Tile tl = tile_of(p, tile, ncol, BM);
    const int r0 = tl.row_begin + (PAIR ? 64 * cw : 0);
    const bool active = r0 < tl.row_end;  // PAIR: the second consumer may have no rows
    int rows[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[h] = r0 + 16 * warp + lane / 4 + 8 * h;
    const int sa_idx = rows[0] - tl.row_begin;  // this lane's A rows in the stage's scale list (+8)
    // First output column of this consumer; accumulator group j covers columns
    // c0 + 8 (j mod NJ') (NJ' = NJ / 2 for kSwiglu: j >= NJ' are the W3 rows of the same columns).
    const int c0 = tl.ct * kCols + (PAIR ? 0 : (kSwiglu ? 64 : 128) * cw);
    // Weight-scale blocks: 128 output columns each; a 96- or 192-column range may touch two.
    const int jsplit = (128 - (c0 & 127)) / 8;  // groups j' >= jsplit use the second block

    float acc[4 * NJ], part[4 * NJ];
#pragma unroll
    for (int i = 0; i < 4 * NJ; ++i) acc[i] = 0.f;
    const uint8_t* a_tile = smem + (PAIR ? cw * 64 * BK : 0);
    const uint8_t* b_tile = smem + C::kABytes + (PAIR ? 0 : cw * 128 * BK);
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const int s = int(it % kStages);
      sm90::mbar_wait(full + s, (it / kStages) & 1);
      const float* ss = reinterpret_cast<const float*>(smem + s * C::kStageBytes + C::kScaleOff);
      const float sa0 = ss[sa_idx], sa1 = ss[sa_idx + 8];
      const float w1lo = ss[128 + 4 * cw], w1hi = ss[129 + 4 * cw];
      const float w3lo = kSwiglu ? ss[130 + 4 * cw] : 0.f, w3hi = kSwiglu ? ss[131 + 4 * cw] : 0.f;
      if (active) {
        sm90::fence_proxy_async();
        const uint64_t da = sm90::smem_desc_sw128(a_tile + s * C::kStageBytes);
        const uint64_t db = sm90::smem_desc_sw128(b_tile + s * C::kStageBytes);
#pragma unroll
        for (int i = 0; i < 4 * NJ; ++i) sm90::reg_fence(part[i]);
        sm90::wgmma_fence();
#pragma unroll
        for (int k = 0; k < BK / 32; ++k) {
          if constexpr (PAIR)
            sm90::wgmma_m64n192k32_e4m3(part, da + 2 * k, db + 2 * k, k > 0);
          else
            sm90::wgmma_m64n128k32_e4m3(part, da + 2 * k, db + 2 * k, k > 0);
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait0();
#pragma unroll
        for (int i = 0; i < 4 * NJ; ++i) sm90::reg_fence(part[i]);
      }
      if (lane == 0) sm90::mbar_arrive(empty + s);
      if (active) {
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const bool up = kSwiglu && j >= NJ / 2;
          const int jj = kSwiglu ? j % (NJ / 2) : j;
          const bool hi = jj >= jsplit;
          const float sb = up ? (hi ? w3hi : w3lo) : (hi ? w1hi : w1lo);
          const float f0 = sa0 * sb, f1 = sa1 * sb;
          acc[4 * j + 0] = fmaf(part[4 * j + 0], f0, acc[4 * j + 0]);
          acc[4 * j + 1] = fmaf(part[4 * j + 1], f0, acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(part[4 * j + 2], f1, acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(part[4 * j + 3], f1, acc[4 * j + 3]);
        }
      }
    }
    if (!active) continue;

    // ---- epilogue: straight from registers (lane holds 2 adjacent columns per 8) ----
    if constexpr (QOUT) {
      // v = bf16(silu(g) * u) (the unfused path's stored value), amax over the row's 128
      // columns: lane quad (16 values each) -> consumer's 64 columns -> both consumers.
      float v[2][NJ];  // [h][2 j + c], j < NJ / 2
      float am[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < NJ / 2; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float g = acc[4 * j + 2 * h + c], u = acc[4 * (j + NJ / 2) + 2 * h + c];
            const float b = __bfloat162float(__float2bfloat16_rn(silu(g) * u));
            v[h][2 * j + c] = b;
            m = fmaxf(m, fabsf(b));
          }
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        am[h] = m;
      }
      float* red = reinterpret_cast<float*>(smem + C::kRedOff) + (tile_iter & 1) * 128;
      const int lr = 16 * warp + lane / 4;  // this lane's first row within the tile
      if (lane % 4 == 0) red[cw * 64 + lr] = am[0], red[cw * 64 + lr + 8] = am[1];
      // Both consumer warpgroups (256 threads), named barrier 1. The buffer alternates by
      // tile: a consumer cannot reach the barrier two tiles on before the other passed this one.
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rows[h];
        const float amax = fmaxf(am[h], red[(1 - cw) * 64 + lr + 8 * h]);
        if (r >= tl.row_end) continue;
        // The scale as quant_fp8_kernel (k_quant.cu) computes it, s = amax / 448; q = rn(v * (1 / s))
        // (that kernel divides: the product differs from the quotient by <= 1.5 ulp of f32, so
        // a byte differs by one e4m3 step only where v / s lies that close to a rounding boundary).
        const float sc = amax > 0.f ? amax / kFp8Max : 1.f, inv = 1.f / sc;
        uint8_t* o = p.out_q + size_t(r) * p.ldo;
#pragma unroll
        for (int j = 0; j < NJ / 2; ++j) {
          const int c = c0 + 8 * j + 2 * (lane % 4);
          const __nv_fp8x2_storage_t q2 = __nv_cvt_float2_to_fp8x2(
              make_float2(v[h][2 * j] * inv, v[h][2 * j + 1] * inv), __NV_SATFINITE, __NV_E4M3);
          *reinterpret_cast<__nv_fp8x2_storage_t*>(o + c) = q2;
        }
        if (cw == 0 && lane % 4 == 0) p.out_qs[size_t(r) * (p.N / 128) + c0 / 128] = sc;
      }
    } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rows[h];
      if (r >= tl.row_end) continue;
      if (kSwiglu) {
        bf16* o = static_cast<bf16*>(p.out) + size_t(r) * p.ldo;
#pragma unroll
        for (int j = 0; j < NJ / 2; ++j) {
          const int c = c0 + 8 * j + 2 * (lane % 4);
          if (c < p.N) {
            const float ga = acc[4 * j + 2 * h], gb = acc[4 * j + 2 * h + 1];
            const float ua = acc[4 * (j + NJ / 2) + 2 * h], ub = acc[4 * (j + NJ / 2) + 2 * h + 1];
            *reinterpret_cast<__nv_bfloat162*>(o + c) = __floats2bfloat162_rn(silu(ga) * ua, silu(gb) * ub);
          }
        }
      } else {
        const float scale = MODE == int(LinMode::kDown) ? p.row_scale[r] : 1.f;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const int c = c0 + 8 * j + 2 * (lane % 4);
          if (c < p.N) {
            const float va = acc[4 * j + 2 * h] * scale, vb = acc[4 * j + 2 * h + 1] * scale;
            const size_t o = size_t(r) * p.ldo + c;
            if (p.out_f32)
              *reinterpret_cast<float2*>(static_cast<float*>(p.out) + o) = make_float2(va, vb);
            else
              *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.out) + o) = __floats2bfloat162_rn(va, vb);
          }
        }
      }
    }
    }  // !QOUT
  }
#endif
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v;
  }();
  return n;
}

// The kernel has a body only in an sm_90a device pass; a binary built without 90a (or run
// on another chip) reports a different binary version here and keeps the mma.sync path.
bool wgmma_device_ok() {
  static const bool ok = [] {
#ifdef MOESERVE_HAVE_SM90A
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (major != 9 || minor != 0) return false;
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, gemm_fp8_wgmma_kernel<int(LinMode::kStore), kShapeN>) != cudaSuccess) return false;
    return a.binaryVersion == 90;
#else
    return false;
#endif
  }();
  return ok;
}

template <int MODE, int SHAPE, bool QOUT = false>
void launch_mode(const LinParams& p, const Fp8Act& a, cudaStream_t s) {
  using C = Cfg<SHAPE>;
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(gemm_fp8_wgmma_kernel<MODE, SHAPE, QOUT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    attr_set = true;
  }
  const int ncol = ceil_div(p.N, C::cols(MODE == int(LinMode::kSwiglu)));
  const int64_t tiles = int64_t(p.tile_expert ? p.max_tiles : ceil_div(p.M, C::BM)) * ncol;
  if (tiles == 0) return;
  const int grid = int(std::min<int64_t>(tiles, sm_count()));
  gemm_fp8_wgmma_kernel<MODE, SHAPE, QOUT><<<grid, kThreads, C::kSmemBytes, s>>>(p, a);
  CUDA_CHECK_LAUNCH();
}

template <int SHAPE>
void launch_variant(const LinParams& p, const Fp8Act& a, cudaStream_t s) {
  switch (p.mode) {
    case LinMode::kStore: launch_mode<int(LinMode::kStore), SHAPE>(p, a, s); break;
    case LinMode::kSwiglu: launch_mode<int(LinMode::kSwiglu), SHAPE>(p, a, s); break;
    case LinMode::kDown: launch_mode<int(LinMode::kDown), SHAPE>(p, a, s); break;
  }
}

// 128-row expert tables on 128 x 256, everything else on 64 x 256.
int shape_of(const LinParams& p) { return p.tile_expert && p.tile_rows == 128 ? kShapeWide : kShapeN; }

}  // namespace

bool fp8_wgmma_available() { return wgmma_device_ok(); }

bool gemm_fp8_wgmma_supported(const LinParams& p) {
  if (!gemm_fp8_supported(p) || !wgmma_device_ok()) return false;
  // Offsets inside the producer are 32-bit. Gathered rows (x_rows) index tokens, and there
  // are no more tokens than rows M (pairs), so M * K bounds both cases.
  const bool small = int64_t(p.M) * p.K < (int64_t(1) << 31) && int64_t(p.N) * p.K < (int64_t(1) << 31);
  // (The fused quantising epilogue, out_q, is not built.)
  return small && !p.out_q && p.N % 64 == 0 && p.ldo % 2 == 0 && (p.mode != LinMode::kDown || p.row_scale) &&
         (p.mode != LinMode::kSwiglu || p.experts) && (!p.tile_expert || p.tile_rows == 64 || p.tile_rows == 128);
}

void launch_gemm_fp8_wgmma(const LinParams& p, const Fp8Act& a, cudaStream_t s) {
  CU_REQUIRE(gemm_fp8_wgmma_supported(p), "gemm_fp8_wgmma: unsupported shape or device (needs sm_90a, N % 64 == 0)");
  switch (shape_of(p)) {
    case kShapeN: launch_variant<kShapeN>(p, a, s); break;
    default: launch_variant<kShapeWide>(p, a, s); break;
  }
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kFp8PairTileM == limits::kFp8PairTileM && kQuantGroup == limits::kQuantGroup);
}  // namespace moeserve::cuda
