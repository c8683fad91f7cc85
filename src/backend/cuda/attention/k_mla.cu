// MLA kernels (kernels_mla.h): the latent norm / RoPE / cache write, and the per-head
// projections around the absorbed attention (k_mla_flash.cu): q_nope through W_kb into the
// latent space before, the latent output through W_vb after, as batched tensor-core GEMMs.
#include <cuda_bf16.h>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/attention/kernels_mla.h"
#include "core/fp8_e4m3.h"
#include "backend/cuda/linear/mma_bf16.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float ld_bf16(const void* p, int64_t i) { return bf2f(static_cast<const bf16*>(p)[i]); }

// Rotates the pair (a, b) of pair index i: out_a = a cos - b sin, out_b = b cos + a sin.
__device__ __forceinline__ void rot_pair(float& a, float& b, float cs, float sn) {
  const float x = a, y = b;
  a = x * cs - y * sn;
  b = y * cs + x * sn;
}

// Element offsets of pair i within a rotary vector of R dims (NeoX: i, i + R/2; GptJ: 2i, 2i+1).
__device__ __forceinline__ void pair_dims(RopeStyle st, int R, int i, int* d0, int* d1) {
  if (st == RopeStyle::NeoX) *d0 = i, *d1 = i + R / 2;
  else *d0 = 2 * i, *d1 = 2 * i + 1;
}

__global__ void __launch_bounds__(kThreads) k_mla_rope_write_kv(MlaRopeKvParams p) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, tid = threadIdx.x;
  const int C = p.C, R = p.R, L = C + R, qk = p.N + R;
  bf16* lat = static_cast<bf16*>(p.latent) + int64_t(t) * L;
  bf16* q = static_cast<bf16*>(p.q) + int64_t(t) * p.H * qk;
  const int slot = p.slot_mapping[t];
  // kv_a_layernorm: mean of squares in f32 over the C latent values.
  float ss = 0.f;
  for (int c = tid; c < C; c += kThreads) {
    const float x = bf2f(lat[c]);
    ss += x * x;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / float(C) + p.eps);
  for (int c = tid; c < C; c += kThreads) {
    const float w = p.norm_w_bf16 ? ld_bf16(p.norm_w, c) : static_cast<const float*>(p.norm_w)[c];
    const bf16 y = f2bf(w * (bf2f(lat[c]) * inv));
    lat[c] = y;
    if (slot >= 0) {
      const int64_t at = int64_t(slot) * L + c;
      if (p.cache_fp8) static_cast<uint8_t*>(p.cache)[at] = fp8::kv_store(bf2f(y), p.k_scale);
      else static_cast<bf16*>(p.cache)[at] = y;
    }
  }
  // RoPE: pair i of the latent's rope part (h = -1) and of every head's q_rope.
  const float pos = float(p.positions[t]);
  const float msc = p.rope.scaling == RopeScaling::Yarn ? p.rope.attention_factor : 1.f;
  const int half = R / 2;
  for (int item = tid; item < (p.H + 1) * half; item += kThreads) {
    const int h = item / half - 1, i = item % half;
    float sn, cs;
    sincosf(pos * rope_inv_freq(p.rope, i), &sn, &cs);
    cs *= msc, sn *= msc;
    int d0, d1;
    pair_dims(p.rope.style, R, i, &d0, &d1);
    bf16* v = h < 0 ? lat + C : q + int64_t(h) * qk + p.N;
    float a = bf2f(v[d0]), b = bf2f(v[d1]);
    rot_pair(a, b, cs, sn);
    const bf16 ya = f2bf(a), yb = f2bf(b);
    v[d0] = ya, v[d1] = yb;
    if (h < 0 && slot >= 0) {
      const int64_t at = int64_t(slot) * L + C;
      if (p.cache_fp8) {
        static_cast<uint8_t*>(p.cache)[at + d0] = fp8::kv_store(bf2f(ya), p.k_scale);
        static_cast<uint8_t*>(p.cache)[at + d1] = fp8::kv_store(bf2f(yb), p.k_scale);
      } else {
        static_cast<bf16*>(p.cache)[at + d0] = ya;
        static_cast<bf16*>(p.cache)[at + d1] = yb;
      }
    }
  }
}

// kv_b element (row, col) as f32 (bf16, or e4m3 times its block's scale_inv).
__device__ __forceinline__ float ld_kvb(const MlaProjParams& p, int64_t row, int col) {
  const int64_t i = row * p.C + col;
  if (!p.kv_b_fp8) return bf2f(static_cast<const bf16*>(p.kv_b)[i]);
  const float s = p.kv_b_scale_inv[(row / p.block_out) * p.scale_cols + col / p.block_in];
  return fp8::e4m3_to_f32(static_cast<const uint8_t*>(p.kv_b)[i]) * s;
}


// Tile of 64 tokens x 64 outputs of one head, K in steps of 64 staged in shared memory as bf16
// (A [token][k], B [n][k]: both fragments by plain ldmatrix); 4 warps of 16 tokens x 64 outputs.
// Small K and N (N = 128 for the absorb's K, V = 128 outputs) make this bound by the kv_b read
// at decode (each head's rows are read once per 64 tokens) and cheap next to attention at prefill.
constexpr int kPM = 64, kPN = 64, kPK = 64, kPLd = kPK + 8, kPThreads = 128;

// A tile [64 tokens][64 k] of bf16 by 16-byte loads: 4 chunks of 8 per thread, all in flight.
__device__ __forceinline__ void stage_a_vec(const MlaProjParams& p, bool absorb, int h, int m0, int k0, int K,
                                            bf16* As) {
  const int qk = p.N + p.R;
  uint4 v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = threadIdx.x + j * kPThreads, r = i >> 3, kc = (i & 7) * 8, t = m0 + r, kk = k0 + kc;
    v[j] = make_uint4(0, 0, 0, 0);
    if (t < p.T && kk < K) {
      const bf16* src = absorb ? static_cast<const bf16*>(p.q) + (int64_t(p.t0 + t) * p.H + h) * qk + kk
                               : static_cast<const bf16*>(p.o_lat) + (int64_t(t) * p.H + h) * p.C + kk;
      v[j] = *reinterpret_cast<const uint4*>(src);
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = threadIdx.x + j * kPThreads;
    *reinterpret_cast<uint4*>(As + (i >> 3) * kPLd + (i & 7) * 8) = v[j];
  }
}

// B tile as [64 n][64 k] bf16 from a bf16 kv_b: 16-byte chunks of 8 along the weight row
// (absorb: row k, chunk along n, stored transposed; kVOut: row n, chunk along k).
__device__ __forceinline__ void stage_b_bf16(const MlaProjParams& p, bool absorb, int64_t wrow0, int n0, int k0,
                                             int K, int Nout, bf16* Bs) {
  uint4 v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = threadIdx.x + j * kPThreads, a = i >> 3, c = (i & 7) * 8;  // (row, chunk) of the tile
    const int kk = absorb ? k0 + a : k0 + c, nn = absorb ? n0 + c : n0 + a;
    v[j] = make_uint4(0, 0, 0, 0);
    if (kk < K && nn < Nout) {
      const int64_t row = absorb ? wrow0 + kk : wrow0 + nn;
      v[j] = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.kv_b) + row * p.C + (absorb ? nn : kk));
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = threadIdx.x + j * kPThreads, a = i >> 3, c = (i & 7) * 8;
    if (absorb) {
      const bf16* e = reinterpret_cast<const bf16*>(&v[j]);
#pragma unroll
      for (int x = 0; x < 8; ++x) Bs[(c + x) * kPLd + a] = e[x];
    } else {
      *reinterpret_cast<uint4*>(Bs + a * kPLd + c) = v[j];
    }
  }
}

// The same from an e4m3 kv_b: 16-byte chunks of 16 weights, one block scale each.
__device__ __forceinline__ void stage_b_fp8(const MlaProjParams& p, bool absorb, int64_t wrow0, int n0, int k0,
                                            int K, int Nout, bf16* Bs) {
  uint4 v[2];
  float sc[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int i = threadIdx.x + j * kPThreads, a = i >> 2, c = (i & 3) * 16;
    const int kk = absorb ? k0 + a : k0 + c, nn = absorb ? n0 + c : n0 + a;
    v[j] = make_uint4(0, 0, 0, 0);
    sc[j] = 0.f;
    if (kk < K && nn < Nout) {
      const int64_t row = absorb ? wrow0 + kk : wrow0 + nn;
      const int col = absorb ? nn : kk;
      v[j] = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.kv_b) + row * p.C + col);
      sc[j] = p.kv_b_scale_inv[(row / p.block_out) * p.scale_cols + col / p.block_in];
    }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int i = threadIdx.x + j * kPThreads, a = i >> 2, c = (i & 3) * 16;
    const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
    bf16 e[16];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const float2 lo = fp8x2_to_f2(uint16_t(w[x])), hi = fp8x2_to_f2(uint16_t(w[x] >> 16));
      e[4 * x] = f2bf(lo.x * sc[j]), e[4 * x + 1] = f2bf(lo.y * sc[j]);
      e[4 * x + 2] = f2bf(hi.x * sc[j]), e[4 * x + 3] = f2bf(hi.y * sc[j]);
    }
    if (absorb) {
#pragma unroll
      for (int x = 0; x < 16; ++x) Bs[(c + x) * kPLd + a] = e[x];
    } else {
#pragma unroll
      for (int x = 0; x < 16; ++x) Bs[a * kPLd + c + x] = e[x];
    }
  }
}

__global__ void __launch_bounds__(kPThreads) k_mla_proj(MlaProjParams p) {
  __shared__ __align__(16) bf16 As[kPM * kPLd];
  __shared__ __align__(16) bf16 Bs[kPN * kPLd];
  const int n0 = blockIdx.x * kPN, m0 = blockIdx.y * kPM, h = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool absorb = p.mode == MlaProj::kQAbsorb;
  const int K = absorb ? p.N : p.C, Nout = absorb ? p.C : p.V;
  const int qk = p.N + p.R, L = p.C + p.R, kvw = p.N + p.V;
  const int64_t wrow0 = int64_t(h) * kvw + (absorb ? 0 : p.N);
  float acc[8][4] = {};
  // 16-byte staging (one round of loads per K step) where the dims allow: N, R % 8, C % 16 and
  // FP8 scale blocks of whole 16-column chunks (every real checkpoint); else element by element.
  const bool vec = p.N % 8 == 0 && p.R % 8 == 0 && p.C % 16 == 0 && (!p.kv_b_fp8 || p.block_in % 16 == 0);
  for (int k0 = 0; k0 < K; k0 += kPK) {
    if (vec) {
      stage_a_vec(p, absorb, h, m0, k0, K, As);
      if (p.kv_b_fp8) stage_b_fp8(p, absorb, wrow0, n0, k0, K, Nout, Bs);
      else stage_b_bf16(p, absorb, wrow0, n0, k0, K, Nout, Bs);
    } else {
#pragma unroll 4
      for (int i = tid; i < kPM * kPK; i += kPThreads) {
        const int r = i / kPK, k = i % kPK, t = m0 + r, kk = k0 + k;
        float v = 0.f;
        if (t < p.T && kk < K)
          v = absorb ? bf2f(static_cast<const bf16*>(p.q)[(int64_t(p.t0 + t) * p.H + h) * qk + kk])
                     : bf2f(static_cast<const bf16*>(p.o_lat)[(int64_t(t) * p.H + h) * p.C + kk]);
        As[r * kPLd + k] = f2bf(v);
      }
#pragma unroll 4
      for (int i = tid; i < kPN * kPK; i += kPThreads) {
        // Coalesced along the weight row: W_kb rows are k (n contiguous), W_vb rows are n.
        const int n = absorb ? i % kPN : i / kPK, k = absorb ? i / kPN : i % kPK;
        const int nn = n0 + n, kk = k0 + k;
        float v = 0.f;
        if (nn < Nout && kk < K) v = absorb ? ld_kvb(p, wrow0 + kk, nn) : ld_kvb(p, wrow0 + nn, kk);
        Bs[n * kPLd + k] = f2bf(v);
      }
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kPK; ks += 16) {
      uint32_t a[4];
      ldsm_x4(a, As + (warp * 16 + (lane & 15)) * kPLd + ks + (lane >> 4) * 8);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[4];
        ldsm_x4(b, Bs + (j * 16 + (lane & 7) + (lane >> 4) * 8) * kPLd + ks + ((lane >> 3) & 1) * 8);
        mma16816(acc[2 * j], a, b[0], b[1]);
        mma16816(acc[2 * j + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();
  }
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int t = m0 + warp * 16 + g + half * 8;
    if (t >= p.T) continue;
    const int tg = p.t0 + t;
    const bool zero = !absorb && (p.num_seqs == 0 || tg >= p.query_start[p.num_seqs]);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = n0 + j * 8 + 2 * c + e;
        if (n >= Nout) continue;
        const bf16 v = f2bf(zero ? 0.f : p.alpha * acc[j][2 * half + e]);
        if (absorb) static_cast<bf16*>(p.q_abs)[(int64_t(t) * p.H + h) * L + n] = v;
        else static_cast<bf16*>(p.out)[(int64_t(tg) * p.H + h) * p.V + n] = v;
      }
  }
  if (absorb && blockIdx.x == 0) {  // q_abs[:, h, C:] = alpha q_rope
    for (int i = tid; i < kPM * p.R; i += kPThreads) {
      const int t = m0 + i / p.R, d = i % p.R;
      if (t >= p.T) break;
      const float v = bf2f(static_cast<const bf16*>(p.q)[(int64_t(p.t0 + t) * p.H + h) * qk + p.N + d]);
      static_cast<bf16*>(p.q_abs)[(int64_t(t) * p.H + h) * L + p.C + d] = f2bf(p.alpha * v);
    }
  }
}

}  // namespace

void launch_mla_rope_write_kv(const MlaRopeKvParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  k_mla_rope_write_kv<<<p.T, kThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void launch_mla_proj(const MlaProjParams& p, cudaStream_t s) {
  if (p.T == 0 || p.H == 0) return;
  const int nout = p.mode == MlaProj::kQAbsorb ? p.C : p.V;
  k_mla_proj<<<dim3((nout + kPN - 1) / kPN, (p.T + kPM - 1) / kPM, p.H), kPThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeserve::cuda
