// MLA kernels (kernels_mla.h): the latent norm / RoPE / cache write, and the per-head
// projections around the absorbed attention (k_mla_flash.cu): q_nope through W_kb into the
// latent space before, the latent output through W_vb after, as batched tensor-core GEMMs.
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels_mla.h"
#include "core/fp8_e4m3.h"

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

__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* addr) {
  const unsigned a = unsigned(__cvta_generic_to_shared(addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// Tile of 64 tokens x 64 outputs of one head, K in steps of 64 staged in shared memory as bf16
// (A [token][k], B [n][k]: both fragments by plain ldmatrix); 4 warps of 16 tokens x 64 outputs.
// Small K and N (N = 128 for the absorb's K, V = 128 outputs) make this bound by the kv_b read
// at decode (each head's rows are read once per 64 tokens) and cheap next to attention at prefill.
constexpr int kPM = 64, kPN = 64, kPK = 64, kPLd = kPK + 8, kPThreads = 128;

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
  for (int k0 = 0; k0 < K; k0 += kPK) {
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
