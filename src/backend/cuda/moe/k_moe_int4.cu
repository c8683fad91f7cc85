// W4A16 routed experts (compressed-tensors pack-quantized INT4, symmetric, group % 32 == 0):
// the MoE gate/up (fused SiLU * up) and down products over the align kernel's tile table.
//
// Weights stay packed on the GPU as the checkpoint has them: w I32 [N, K/8] (element 8j+i in
// bits 4i..4i+3 of word j, nibble q + 8) and scales BF16 [N, K/group]. Two kernels with the same
// math: moe_int4_decode_kernel for decode tiles (<= 8 (token, k) pairs of one expert, so each
// distinct expert is read once per step when it serves <= 8 pairs; described above it) and
// moe_int4_kernel for prefill (TOK = 64: the grouped GEMM's tiles).
//
// Math: mma.sync m16n8k16 f16 x f16 -> f32 in the "swap AB" form (weights are the M side, the
// tile's tokens the N side). A nibble becomes q exactly (f16 magic 0x6400 | n = 1024 + n, minus
// 1032), then q * scale in f16: exact whenever the product is a normal f16 (|q| <= 8 times an
// 8-bit bf16 significand needs <= 11 bits; scales >= 2^-14 ~ 6.1e-5 in practice). Activations are
// bf16 -> f16 (exact in f16's normal range, clamped to +-65504), staged per 128-column chunk in
// shared memory. Accumulation in f32. So the result equals the f32 CPU reference on the
// dequantised weights up to f32 summation order and the bf16 stores, for in-range values.
//
// Layout: a block is 4 warps; warp w owns 2 weight m-tiles of 16 rows (kSwiglu: 16 rows of W1
// and the same 16 of W3; kDown: 32 rows of W2). Lane (g = lane / 4, t = lane % 4) loads 16
// bytes of weight rows g and g + 8 per chunk: words 4t..4t+3 = the 32 columns of group t of the
// chunk, i.e. one scale per row. The k order inside the mma is permuted (pairs (e_p, e_p+4) of
// a word, the order the nibble shifts give), and the activations are staged in the same order,
// so B fragments are plain 16-byte shared loads. While chunk c is multiplied, the weights of
// chunks c + 1 and c + 2 (decode; c + 1 at 64-pair tiles) and the activations of chunk c + 1 are
// in flight (registers).
#include <cuda_fp16.h>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/moe/kernels_int4.h"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kChunk = 128;              // columns per pipeline step (4 groups of 32)
constexpr int kRowBytes = 2 * kChunk + 64;  // staged row stride: 320 bytes, conflict-free B loads

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// bf16 pair -> clamped f16 pair.
__device__ __forceinline__ uint32_t f16_pair(float a, float b) {
  a = fminf(fmaxf(a, -65504.f), 65504.f);
  b = fminf(fmaxf(b, -65504.f), 65504.f);
  return h2_bits(__floats2half2_rn(a, b));
}

// 8 bf16 activations (columns 8j..8j+7) -> f16 pairs (x_p, x_p+4), p = 0..3.
__device__ __forceinline__ uint4 stage_word(uint4 v) {
  const float2 a = bf16x2_to_f2(v.x), b = bf16x2_to_f2(v.y), c = bf16x2_to_f2(v.z), d = bf16x2_to_f2(v.w);
  // v.x = (x0, x1), v.y = (x2, x3), v.z = (x4, x5), v.w = (x6, x7)
  return make_uint4(f16_pair(a.x, c.x), f16_pair(a.y, c.y), f16_pair(b.x, d.x), f16_pair(b.y, d.y));
}

// (a & mask) | magic in one instruction.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t mask, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(magic));
  return r;
}

// One packed word (8 nibbles) times its f16 scale -> the 4 f16 pairs (q_p * s, q_p+4 * s).
// Nibble pairs (p, p + 4) at bits 4p: f16 0x6400 | n = 1024 + n, q = that - 1032 (p = 0, 2); for
// p = 1, 3 the pair is taken in place (bits 4..7 of each half: 1024 + 16 n) and q = that / 16 - 72
// by one fma. Every step is exact (integers below 2048, a power-of-two scale); then q * s.
__device__ __forceinline__ void unpack_word(uint32_t w, __half2 s2, uint32_t out[4]) {
  constexpr uint32_t kMagic = 0x64006400u, kLo = 0x000F000Fu, kHi = 0x00F000F0u;
  const uint32_t b1032 = 0x64086408u;  // f16 pair (1032, 1032)
  const uint32_t k16 = 0x2c002c00u;    // (1/16, 1/16)
  const uint32_t k72 = 0xd480d480u;    // (-72, -72)
  const uint32_t w8 = w >> 8;
  const uint32_t m0 = lop3_and_or(w, kLo, kMagic), m1 = lop3_and_or(w, kHi, kMagic);
  const uint32_t m2 = lop3_and_or(w8, kLo, kMagic), m3 = lop3_and_or(w8, kHi, kMagic);
  const __half2 q0 = __hsub2(*reinterpret_cast<const __half2*>(&m0), *reinterpret_cast<const __half2*>(&b1032));
  const __half2 q2 = __hsub2(*reinterpret_cast<const __half2*>(&m2), *reinterpret_cast<const __half2*>(&b1032));
  const __half2 q1 = __hfma2(*reinterpret_cast<const __half2*>(&m1), *reinterpret_cast<const __half2*>(&k16),
                             *reinterpret_cast<const __half2*>(&k72));
  const __half2 q3 = __hfma2(*reinterpret_cast<const __half2*>(&m3), *reinterpret_cast<const __half2*>(&k16),
                             *reinterpret_cast<const __half2*>(&k72));
  out[0] = h2_bits(__hmul2(q0, s2));
  out[1] = h2_bits(__hmul2(q1, s2));
  out[2] = h2_bits(__hmul2(q2, s2));
  out[3] = h2_bits(__hmul2(q3, s2));
}

// bf16 scale -> f16 pair (exact for scales in f16's normal range).
__device__ __forceinline__ __half2 scale_h2(bf16 s) { return __half2half2(__float2half_rn(__bfloat162float(s))); }

__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// TOK: pairs per tile (64: prefill; decode tiles run moe_int4_decode_kernel). Grid (row blocks, max_tiles).
template <int MODE, int TOK>
__global__ void __launch_bounds__(kWarps * 32) moe_int4_kernel(LinParams p) {
  constexpr int NT = TOK / 8;                      // n-tiles of 8 tokens
  constexpr int kItems = TOK * (kChunk / 8) / (kWarps * 32) > 0 ? TOK * (kChunk / 8) / (kWarps * 32) : 1;
  constexpr bool kSw = MODE == int(LinMode::kSwiglu);
  __shared__ __align__(16) unsigned char xs[2][TOK * kRowBytes];
  pdl_enter();
  const int tile = blockIdx.y;
  if (tile >= *p.num_tiles) return;
  const int expert = p.tile_expert[tile], begin = p.tile_begin[tile], nrows = p.tile_end[tile] - begin;
  const ExpertPtrs& ep = p.experts[expert];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int K = p.K, N = p.N, group = p.bi;
  const int wpr = K / 8, spr = K / group;  // packed words / scales per weight row
  // The warp's two weight m-tiles: matrix and first row.
  const int row0 = kSw ? (blockIdx.x * kWarps + warp) * 16 : (blockIdx.x * kWarps + warp) * 32;
  const uint32_t* wm[2];
  const bf16* sm[2];
  int mrow[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    wm[j] = static_cast<const uint32_t*>(kSw ? (j == 0 ? ep.w1 : ep.w3) : ep.w2);
    sm[j] = reinterpret_cast<const bf16*>(kSw ? (j == 0 ? ep.s1 : ep.s3) : ep.s2);
    mrow[j] = kSw ? row0 : row0 + 16 * j;
  }
  const int nchunks = (K + kChunk - 1) / kChunk;

  // Staging: item i = (token row, word of the chunk); stored at slot (word % 4) * 4 + word / 4.
  auto load_x = [&](int c, uint4 v[kItems]) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int item = threadIdx.x + i * kWarps * 32, r = item / (kChunk / 8), word = item % (kChunk / 8);
      const int col = c * kChunk + word * 8;
      v[i] = make_uint4(0, 0, 0, 0);
      if (item < TOK * (kChunk / 8) && r < nrows && col < K) {
        const int sr = begin + r, xr = p.x_rows ? p.x_rows[sr] : sr;
        v[i] = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.x) + int64_t(xr) * p.ldx + col));
      }
    }
  };
  auto store_x = [&](int buf, const uint4 v[kItems]) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int item = threadIdx.x + i * kWarps * 32, r = item / (kChunk / 8), word = item % (kChunk / 8);
      if (item < TOK * (kChunk / 8))
        *reinterpret_cast<uint4*>(&xs[buf][r * kRowBytes + ((word % 4) * 4 + word / 4) * 16]) = stage_word(v[i]);
    }
  };
  // Weights of chunk c: [m-tile][row g / g + 8] 16 bytes (group t of the chunk) and the scale.
  auto load_w = [&](int c, uint4 w[2][2], bf16 s[2][2]) {
    const int col = c * kChunk + 32 * t;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mrow[j] + g + 8 * h;
        w[j][h] = make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);  // q = 0
        s[j][h] = __float2bfloat16_rn(0.f);
        if (r < N && col < K) {
          w[j][h] = ld_stream(wm[j] + int64_t(r) * wpr + col / 8);
          s[j][h] = sm[j][int64_t(r) * spr + col / group];
        }
      }
  };

  float acc[2][NT][4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][n][e] = 0.f;

  // Weights: a ring of kRing chunks in registers, so chunks c + 1 .. c + kRing - 1 are in flight
  // while c is multiplied (the chunk loop is unrolled by kRing: the ring index stays static).
  // 64-pair tiles are bound by the mma work, where a third ring slot only spills (255 registers).
  constexpr int kRing = 2;
  uint4 xv[kItems], wr[kRing][2][2];
  bf16 sr[kRing][2][2];
#pragma unroll
  for (int d = 0; d < kRing; ++d)
    if (d < nchunks) load_w(d, wr[d], sr[d]);
  load_x(0, xv);
  store_x(0, xv);
  __syncthreads();
  for (int c0 = 0; c0 < nchunks; c0 += kRing) {
#pragma unroll
    for (int d = 0; d < kRing; ++d) {
      const int c = c0 + d;
      if (c >= nchunks) break;  // block-uniform
      const bool more = c + 1 < nchunks;
      if (more) load_x(c + 1, xv);
      const unsigned char* xb = xs[c & 1];
      __half2 s2[2][2];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) s2[j][h] = scale_h2(sr[d][j][h]);
#pragma unroll
      for (int w = 0; w < 4; ++w) {  // word w of this lane's group: columns 8w..8w+7 of it
        uint32_t a[2][2][4];         // [m-tile][row g / g + 8][pair]
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint4& v = wr[d][j][h];
            const uint32_t word = w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
            unpack_word(word, s2[j][h], a[j][h]);
          }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint4 b = *reinterpret_cast<const uint4*>(xb + (n * 8 + g) * kRowBytes + (w * 4 + t) * 16);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            mma16816(acc[j][n], a[j][0][0], a[j][1][0], a[j][0][1], a[j][1][1], b.x, b.y);
            mma16816(acc[j][n], a[j][0][2], a[j][1][2], a[j][0][3], a[j][1][3], b.z, b.w);
          }
        }
      }
      if (c + kRing < nchunks) load_w(c + kRing, wr[d], sr[d]);
      if (more) store_x((c + 1) & 1, xv);
      __syncthreads();
    }
  }

  // Epilogue: acc[j][n] = rows (mrow[j] + g, + 8) x tokens (8n + 2t, + 1).
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = n * 8 + 2 * t + (e & 1), rr = g + 8 * (e >> 1);
      if (tok >= nrows) continue;
      const int r = begin + tok;
      if (kSw) {
        const int col = mrow[0] + rr;
        if (col < N)
          static_cast<bf16*>(p.out)[int64_t(r) * p.ldo + col] = f2bf(silu(acc[0][n][e]) * acc[1][n][e]);
      } else {
        const float scale = p.row_scale ? p.row_scale[r] : 1.f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int col = mrow[j] + rr;
          if (col < N) static_cast<float*>(p.out)[int64_t(r) * p.ldo + col] = acc[j][n][e] * scale;
        }
      }
    }
}

// Decode tiles (<= kGemvTile pairs of one expert): KS warps of a block split K (KS = 2 for
// gate/up: 2,048 warps at batch 1 instead of 1,024, ~16 per SM), each streaming its K range
// through its own ring of kRing weight chunks in registers. The activations of the tile's rows
// are staged for a whole piece of kRing chunks per split (one barrier per piece, not per chunk),
// chunk by chunk: the copy of the next piece's chunk d is in flight while chunk d is multiplied.
// Staged rows past the tile's pairs are never written; they only feed accumulator columns the
// epilogue drops. The KS partial sums meet in shared memory in a fixed order.
template <int MODE, int KS>
__global__ void __launch_bounds__(kWarps * 32, 4) moe_int4_decode_kernel(LinParams p) {
  constexpr bool kSw = MODE == int(LinMode::kSwiglu);
  constexpr int kRing = 3, kGroups = kWarps / KS, kTok = kGemvTile;
  constexpr int kPieceRow = kRing * 2 * kChunk + 64;  // staged bytes per token row of a piece (832: conflict-free)
  constexpr int kItems = KS * kTok * (kChunk / 8) / (kWarps * 32);  // staging words per thread and chunk
  __shared__ __align__(16) unsigned char xs[2][KS][kTok][kPieceRow];
  __shared__ float red[KS > 1 ? kGroups : 1][8][32];
  pdl_enter();
  const int tile = blockIdx.y;
  if (tile >= *p.num_tiles) return;
  const int expert = p.tile_expert[tile], begin = p.tile_begin[tile], nrows = p.tile_end[tile] - begin;
  const ExpertPtrs& ep = p.experts[expert];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int ks = warp % KS, rg = warp / KS;
  const int K = p.K, N = p.N, group = p.bi;
  const int wpr = K / 8, spr = K / group;
  const int row0 = (blockIdx.x * kGroups + rg) * (kSw ? 16 : 32);
  const uint32_t* wm[2];
  const bf16* sm[2];
  int mrow[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    wm[j] = static_cast<const uint32_t*>(kSw ? (j == 0 ? ep.w1 : ep.w3) : ep.w2);
    sm[j] = reinterpret_cast<const bf16*>(kSw ? (j == 0 ? ep.s1 : ep.s3) : ep.s2);
    mrow[j] = kSw ? row0 : row0 + 16 * j;
  }
  const int nchunks = (K + kChunk - 1) / kChunk;
  const int cps = (nchunks + KS - 1) / KS;  // chunks per split
  const int npieces = (cps + kRing - 1) / kRing;
  const int c_begin = ks * cps, c_end = min(nchunks, c_begin + cps);

  // Staging of chunk d of piece pc for every split: item = (split, row < nrows, word of the chunk).
  const int stage_total = KS * nrows * (kChunk / 8);
  auto load_x = [&](int pc, int d, uint4 v[kItems]) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int item = threadIdx.x + i * kWarps * 32;
      v[i] = make_uint4(0, 0, 0, 0);
      if (item < stage_total) {
        const int sp = item / (nrows * (kChunk / 8)), rem = item % (nrows * (kChunk / 8));
        const int r = rem / (kChunk / 8), word = rem % (kChunk / 8);
        const int c = sp * cps + pc * kRing + d, col = c * kChunk + word * 8;
        if (c < min(nchunks, (sp + 1) * cps) && col < K) {
          const int sr = begin + r, xr = p.x_rows ? p.x_rows[sr] : sr;
          v[i] = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.x) + int64_t(xr) * p.ldx + col));
        }
      }
    }
  };
  auto store_x = [&](int buf, int d, const uint4 v[kItems]) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int item = threadIdx.x + i * kWarps * 32;
      if (item < stage_total) {
        const int sp = item / (nrows * (kChunk / 8)), rem = item % (nrows * (kChunk / 8));
        const int r = rem / (kChunk / 8), word = rem % (kChunk / 8);
        *reinterpret_cast<uint4*>(&xs[buf][sp][r][d * 2 * kChunk + ((word % 4) * 4 + word / 4) * 16]) = stage_word(v[i]);
      }
    }
  };
  auto load_w = [&](int c, uint4 w[2][2], bf16 sc[2][2]) {
    const int col = c * kChunk + 32 * t;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mrow[j] + g + 8 * h;
        w[j][h] = make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);  // q = 0
        sc[j][h] = __float2bfloat16_rn(0.f);
        if (r < N && col < K) {
          w[j][h] = ld_stream(wm[j] + int64_t(r) * wpr + col / 8);
          sc[j][h] = sm[j][int64_t(r) * spr + col / group];
        }
      }
  };

  float acc[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  uint4 wr[kRing][2][2], xv[kItems];
  bf16 sr[kRing][2][2];
#pragma unroll
  for (int d = 0; d < kRing; ++d)
    if (c_begin + d < c_end) load_w(c_begin + d, wr[d], sr[d]);
#pragma unroll
  for (int d = 0; d < kRing; ++d) {
    load_x(0, d, xv);
    store_x(0, d, xv);
  }
  __syncthreads();
  for (int pc = 0; pc < npieces; ++pc) {
    const bool more = pc + 1 < npieces;  // block-uniform
    const unsigned char* xb = &xs[pc & 1][ks][g][0];
#pragma unroll
    for (int d = 0; d < kRing; ++d) {
      if (more) load_x(pc + 1, d, xv);
      const int c = c_begin + pc * kRing + d;
      if (c < c_end) {  // warp-uniform
        __half2 s2[2][2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) s2[j][h] = scale_h2(sr[d][j][h]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          uint32_t a[2][2][4];
#pragma unroll
          for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint4& v = wr[d][j][h];
              unpack_word(w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w, s2[j][h], a[j][h]);
            }
          const uint4 b = *reinterpret_cast<const uint4*>(xb + d * 2 * kChunk + (w * 4 + t) * 16);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            mma16816(acc[j], a[j][0][0], a[j][1][0], a[j][0][1], a[j][1][1], b.x, b.y);
            mma16816(acc[j], a[j][0][2], a[j][1][2], a[j][0][3], a[j][1][3], b.z, b.w);
          }
        }
        if (c + kRing < c_end) load_w(c + kRing, wr[d], sr[d]);
      }
      if (more) store_x((pc + 1) & 1, d, xv);
    }
    __syncthreads();
  }
  if constexpr (KS > 1) {  // splits 1.. hand their sums to split 0 (KS = 2)
    static_assert(KS == 2, "one partial buffer");
    if (ks == 1)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[rg][j * 4 + e][lane] = acc[j][e];
    __syncthreads();
    if (ks != 0) return;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] += red[rg][j * 4 + e][lane];
  }
  // acc[j] = rows (mrow[j] + g, + 8) x tokens (2t, 2t + 1).
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int tok = 2 * t + (e & 1), rr = g + 8 * (e >> 1);
    if (tok >= nrows) continue;
    const int r = begin + tok;
    if (kSw) {
      const int col = mrow[0] + rr;
      if (col < N) static_cast<bf16*>(p.out)[int64_t(r) * p.ldo + col] = f2bf(silu(acc[0][e]) * acc[1][e]);
    } else {
      const float scale = p.row_scale ? p.row_scale[r] : 1.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = mrow[j] + rr;
        if (col < N) static_cast<float*>(p.out)[int64_t(r) * p.ldo + col] = acc[j][e] * scale;
      }
    }
  }
}

template <int MODE, int KS>
void launch_decode(const LinParams& p, cudaStream_t s) {
  const int rows_per_block = (kWarps / KS) * (MODE == int(LinMode::kSwiglu) ? 16 : 32);
  const dim3 grid(ceil_div(p.N, rows_per_block), p.max_tiles);
  if (grid.x == 0 || grid.y == 0) return;
  launch_pdl(moe_int4_decode_kernel<MODE, KS>, grid, dim3(kWarps * 32), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

template <int MODE, int TOK>
void launch_mode(const LinParams& p, cudaStream_t s) {
  const int rows_per_block = kWarps * (MODE == int(LinMode::kSwiglu) ? 16 : 32);
  const dim3 grid(ceil_div(p.N, rows_per_block), p.max_tiles);
  if (grid.x == 0 || grid.y == 0) return;
  launch_pdl(moe_int4_kernel<MODE, TOK>, grid, dim3(kWarps * 32), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool moe_int4_supported(const LinParams& p) {
  return p.experts && p.tile_expert && (p.mode == LinMode::kSwiglu || p.mode == LinMode::kDown) && p.bi > 0 &&
         p.bi % 32 == 0 && p.K % p.bi == 0 && p.ldx % 8 == 0 && (p.tile_rows == kGemvTile || p.tile_rows == kGemmTileM) &&
         (p.mode == LinMode::kSwiglu ? !p.out_f32 : p.out_f32);
}

void launch_moe_int4(const LinParams& p, cudaStream_t s) {
  CU_REQUIRE(moe_int4_supported(p), "launch_moe_int4: unsupported parameters");
  const bool gemm = p.tile_rows == kGemmTileM;
  if (p.mode == LinMode::kSwiglu)
    gemm ? launch_mode<int(LinMode::kSwiglu), kGemmTileM>(p, s) : launch_decode<int(LinMode::kSwiglu), 2>(p, s);
  else
    gemm ? launch_mode<int(LinMode::kDown), kGemmTileM>(p, s) : launch_decode<int(LinMode::kDown), 1>(p, s);
}

}  // namespace moeserve::cuda
