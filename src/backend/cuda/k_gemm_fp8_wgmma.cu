// Hopper (sm_90a) grouped FP8 GEMM for the prefill experts: wgmma m64n128k32 e4m3 -> f32,
// block-scaled like k_gemm_fp8.cu (same LinParams / Fp8Act contract, same 64-row tile table,
// so the MoE align step is unchanged), warp-specialised and persistent.
//
// CTA = 3 warpgroups, 384 threads, one CTA per SM looping over (row tile, column tile) pairs:
// - warpgroup 0 (producer, 56 registers): cp.async (16 B, zero-fill for missing rows) of the
//   A tile [64 rows, 128 k] (rows gathered through x_rows) and the B tile [256 weight rows,
//   128 k] into a kStages ring; each thread's copies arrive on the stage's `full` mbarrier
//   (cp.async.mbarrier.arrive.noinc, 128 arrivals). Chunks are stored 128-byte swizzled (16-B
//   chunk c of row r at c ^ (r % 8)) so the wgmma descriptors read them conflict-free.
// - warpgroups 1 and 2 (consumers, 224 registers): each multiplies the shared A tile by its
//   own 128 B rows: 4 wgmma k32 per 128-wide K block into `part` [64 x 128], then promotes
//   acc += part * s_act[row, kb] * s_w[n-block, kb] (the DeepGEMM idea: the f32 accumulator
//   sees each block's exact partial sum times its two scales). After the wgmmas complete one
//   lane per warp arrives on the stage's `empty` mbarrier (8 arrivals) to free it.
// Tile = 64 rows x 256 weight rows. kSwiglu: the 256 rows are W1[n0 + 64w, +64) then
// W3[same] for consumer w (n0 = 128 * column tile, 128 output columns per CTA), so each
// consumer holds gate and up of the same 64 output columns and writes silu(g) * u directly.
// kStore / kDown: consumer w owns output columns n0 + 128w + [0, 128) (n0 = 256 * column
// tile), exactly one 128-row weight-scale block.
// The producer runs ahead across tiles, so the consumers' epilogue overlaps the next tile's
// loads.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels_fp8.h"
#include "backend/cuda/mma_fp8.cuh"
#include "backend/cuda/wgmma.cuh"

#include <algorithm>
#include <cstdlib>

namespace moeserve::cuda {

// MOESERVE_FP8_WGMMA=0 turns the wgmma path off process-wide (A/B runs of bench-model).
bool g_fp8_gemm_wgmma = [] {
  const char* e = std::getenv("MOESERVE_FP8_WGMMA");
  return !(e && e[0] == '0');
}();

namespace {

constexpr int BM = kGemmTileM, BNW = 256, BK = 128;  // BNW: weight rows per tile
constexpr int kStages = 5, kThreads = 384;
constexpr int kABytes = BM * BK, kBBytes = BNW * BK, kStageBytes = kABytes + kBBytes;  // 8 + 32 KB
constexpr int kSmemBytes = kStages * kStageBytes + 1024 /* alignment */ + 2 * kStages * 8;
static_assert(kStageBytes % 1024 == 0 && kABytes % 1024 == 0, "swizzle atoms need 1024-byte alignment");

#ifdef MOESERVE_SM90A_DEVICE
// Destination of 16-byte chunk c of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

struct Tile {
  int expert, row_begin, row_end, ct;
};
__device__ __forceinline__ Tile tile_of(const LinParams& p, int t, int ncol) {
  Tile r;
  const int rt = t / ncol;
  r.ct = t - rt * ncol;
  if (p.tile_expert) {
    r.expert = p.tile_expert[rt];
    r.row_begin = p.tile_begin[rt];
    r.row_end = p.tile_end[rt];
  } else {
    r.expert = -1;
    r.row_begin = rt * BM;
    r.row_end = min(p.M, r.row_begin + BM);
  }
  return r;
}
#endif

template <int MODE>
__global__ void __launch_bounds__(kThreads, 1) gemm_fp8_wgmma_kernel(LinParams p, Fp8Act act) {
#ifdef MOESERVE_SM90A_DEVICE
  constexpr bool kSwiglu = MODE == int(LinMode::kSwiglu);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
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
  const int ncol = kSwiglu ? ceil_div(p.N, BNW / 2) : ceil_div(p.N, BNW);
  const int total = (p.tile_expert ? *p.num_tiles : ceil_div(p.M, BM)) * ncol;

  if (wg == 0) {
    // ---------------- producer ----------------
    sm90::setmaxnreg_dec<56>();
    const int t = tid, rr = t / 8, chunk = t % 8;  // rows rr + 16 i, 16-byte chunk `chunk`
    uint32_t it = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const Tile tl = tile_of(p, tile, ncol);
      const ExpertPtrs* ep = tl.expert >= 0 ? p.experts + tl.expert : nullptr;
      // 32-bit byte offsets (every operand is < 2^31 bytes, checked by the launcher) keep the
      // producer inside its 56 registers. ~0u: row missing (zero-filled).
      uint32_t a_off[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = tl.row_begin + rr + 16 * i;
        a_off[i] = r < tl.row_end ? uint32_t(p.x_rows ? p.x_rows[r] : r) * uint32_t(K) + chunk * 16 : ~0u;
      }
      const uint8_t* w_lo = static_cast<const uint8_t*>(kSwiglu ? ep->w1 : (ep ? ep->w2 : p.w));
      const uint8_t* w_hi = kSwiglu ? static_cast<const uint8_t*>(ep->w3) : w_lo;
      // B-tile row rr + 16 i (i < 16) reads weight row n0 + rr + 16 i (kStore / kDown), or for
      // kSwiglu (consumer c = i / 8, half (i / 4) % 2 = W1 / W3) n0 + 64 c + rr + 16 (i % 4).
      // Validity is uniform per 64 (kSwiglu) or 128 rows since N % 64 (128) == 0.
      const int n0 = tl.ct * (kSwiglu ? BNW / 2 : BNW);
      const uint32_t b_off = uint32_t(n0 + rr) * uint32_t(K) + chunk * 16, k16 = 16u * uint32_t(K);
      const bool ok0 = n0 < p.N, ok1 = n0 + (kSwiglu ? 64 : 128) < p.N;
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int s = int(it % kStages);
        sm90::mbar_wait(empty + s, ((it / kStages) & 1) ^ 1);
        uint8_t* as = smem + s * kStageBytes;
        uint8_t* bs = as + kABytes;
        const uint32_t kb = uint32_t(kt) * BK;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = rr + 16 * i;
          cp_async16(as + swz(r, chunk), act.xq + (a_off[i] == ~0u ? 0u : a_off[i] + kb), a_off[i] != ~0u);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int r = rr + 16 * i;
          const uint32_t row = kSwiglu ? uint32_t(4 * (i / 8) + i % 4) : uint32_t(i);  // in units of 16 rows
          const uint8_t* base = (kSwiglu && ((i / 4) & 1)) ? w_hi : w_lo;
          const bool ok = i < 8 ? ok0 : ok1;
          cp_async16(bs + swz(r, chunk), base + (ok ? b_off + row * k16 + kb : 0u), ok);
        }
        sm90::cp_async_mbar_arrive(full + s);
      }
    }
    sm90::cp_async_wait_all();
    return;
  }

  // ---------------- consumers ----------------
  sm90::setmaxnreg_inc<224>();
  const int cw = wg - 1;                       // consumer index 0 / 1
  const int lt = tid % 128, warp = lt / 32, lane = lt % 32;
  const int kcols = K / BK;
  uint32_t it = 0;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const Tile tl = tile_of(p, tile, ncol);
    const ExpertPtrs* ep = tl.expert >= 0 ? p.experts + tl.expert : nullptr;
    int rows[2];
    const float* sa_ptr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rows[h] = tl.row_begin + 16 * warp + lane / 4 + 8 * h;
      sa_ptr[h] = rows[h] < tl.row_end ? act.xs + size_t(p.x_rows ? p.x_rows[rows[h]] : rows[h]) * kcols : nullptr;
    }
    // Output columns of this consumer and its weight-scale block row(s).
    const int c0 = kSwiglu ? tl.ct * (BNW / 2) + 64 * cw : tl.ct * BNW + 128 * cw;
    const int sblk = min(c0, p.N - 1) / 128;
    const float* sw0 = (kSwiglu ? ep->s1 : (ep ? ep->s2 : p.s)) + size_t(sblk) * p.s_cols;
    const float* sw1 = kSwiglu ? ep->s3 + size_t(sblk) * p.s_cols : sw0;

    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const int s = int(it % kStages);
      // Scales first: their global latency overlaps the barrier wait and the wgmmas.
      const float sa0 = sa_ptr[0] ? __ldg(sa_ptr[0] + kt) : 0.f;
      const float sa1 = sa_ptr[1] ? __ldg(sa_ptr[1] + kt) : 0.f;
      const float sb0 = __ldg(sw0 + kt), sb1 = kSwiglu ? __ldg(sw1 + kt) : sb0;
      sm90::mbar_wait(full + s, (it / kStages) & 1);
      sm90::fence_proxy_async();
      const uint8_t* as = smem + s * kStageBytes;
      const uint64_t da = sm90::smem_desc_sw128(as);
      const uint64_t db = sm90::smem_desc_sw128(as + kABytes + cw * (128 * BK));
#pragma unroll
      for (int i = 0; i < 64; ++i) sm90::reg_fence(part[i]);
      sm90::wgmma_fence();
#pragma unroll
      for (int k = 0; k < BK / 32; ++k) sm90::wgmma_m64n128k32_e4m3(part, da + 2 * k, db + 2 * k, k > 0);
      sm90::wgmma_commit();
      sm90::wgmma_wait0();
#pragma unroll
      for (int i = 0; i < 64; ++i) sm90::reg_fence(part[i]);
      if (lane == 0) sm90::mbar_arrive(empty + s);
      const float g0 = sa0 * sb0, g1 = sa1 * sb0, u0 = sa0 * sb1, u1 = sa1 * sb1;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const bool up = kSwiglu && j >= 8;
        acc[4 * j + 0] = fmaf(part[4 * j + 0], up ? u0 : g0, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], up ? u0 : g0, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], up ? u1 : g1, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], up ? u1 : g1, acc[4 * j + 3]);
      }
    }

    // ---- epilogue: straight from registers (lane holds 2 adjacent columns per 8) ----
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rows[h];
      if (r >= tl.row_end) continue;
      if (kSwiglu) {
        bf16* o = static_cast<bf16*>(p.out) + size_t(r) * p.ldo;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int c = c0 + 8 * j + 2 * (lane % 4);
          if (c < p.N) {
            const float ga = acc[4 * j + 2 * h], gb = acc[4 * j + 2 * h + 1];
            const float ua = acc[4 * (j + 8) + 2 * h], ub = acc[4 * (j + 8) + 2 * h + 1];
            *reinterpret_cast<__nv_bfloat162*>(o + c) = __floats2bfloat162_rn(silu(ga) * ua, silu(gb) * ub);
          }
        }
      } else {
        const float scale = MODE == int(LinMode::kDown) ? p.row_scale[r] : 1.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
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
    if (cudaFuncGetAttributes(&a, gemm_fp8_wgmma_kernel<int(LinMode::kStore)>) != cudaSuccess) return false;
    return a.binaryVersion == 90;
#else
    return false;
#endif
  }();
  return ok;
}

template <int MODE>
void launch_mode(const LinParams& p, const Fp8Act& a, cudaStream_t s) {
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(gemm_fp8_wgmma_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    attr_set = true;
  }
  const int ncol = MODE == int(LinMode::kSwiglu) ? ceil_div(p.N, BNW / 2) : ceil_div(p.N, BNW);
  const int64_t tiles = int64_t(p.tile_expert ? p.max_tiles : ceil_div(p.M, BM)) * ncol;
  if (tiles == 0) return;
  const int grid = int(std::min<int64_t>(tiles, sm_count()));
  gemm_fp8_wgmma_kernel<MODE><<<grid, kThreads, kSmemBytes, s>>>(p, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemm_fp8_wgmma_supported(const LinParams& p) {
  if (!gemm_fp8_supported(p) || !wgmma_device_ok()) return false;
  const bool swiglu = p.mode == LinMode::kSwiglu;
  return p.N % (swiglu ? 64 : 128) == 0 && p.ldo % 2 == 0 && (p.mode != LinMode::kDown || p.row_scale) &&
         (!swiglu || p.experts);
}

void launch_gemm_fp8_wgmma(const LinParams& p, const Fp8Act& a, cudaStream_t s) {
  CU_REQUIRE(gemm_fp8_wgmma_supported(p), "gemm_fp8_wgmma: unsupported shape or device (needs sm_90a, N % 128 == 0)");
  switch (p.mode) {
    case LinMode::kStore: launch_mode<int(LinMode::kStore)>(p, a, s); break;
    case LinMode::kSwiglu: launch_mode<int(LinMode::kSwiglu)>(p, a, s); break;
    case LinMode::kDown: launch_mode<int(LinMode::kDown)>(p, a, s); break;
  }
}

}  // namespace moeserve::cuda
