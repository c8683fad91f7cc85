// MLA kernels (kernels_mla.h): the latent norm / RoPE / cache write, and attention in the
// absorbed form over the latent cache. First CUDA version: correct for every step shape
// (prefill chunks, decode, verify rows, mixed batches) and graph-capturable (no allocation, no
// host sync); one block per (head, token) re-reads the head's W_kb / W_vb and the context's
// latents, so it is not yet a fast prefill (a decompressed-K/V flash-style prefill and a
// FlashMLA-style decode are the next steps).
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels_mla.h"
#include "core/fp8_e4m3.h"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float ld_bf16(const void* p, int64_t i) { return bf2f(static_cast<const bf16*>(p)[i]); }

__device__ __forceinline__ float ld_cache(const void* c, bool fp8, float scale, int64_t i) {
  if (fp8) return fp8::kv_load(static_cast<const uint8_t*>(c)[i], scale);
  return bf2f(static_cast<const bf16*>(c)[i]);
}

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
__device__ __forceinline__ float ld_kvb(const MlaAttnParams& p, int64_t row, int col) {
  const int64_t i = row * p.C + col;
  if (!p.kv_b_fp8) return bf2f(static_cast<const bf16*>(p.kv_b)[i]);
  const float s = p.kv_b_scale_inv[(row / p.block_out) * p.scale_cols + col / p.block_in];
  return fp8::e4m3_to_f32(static_cast<const uint8_t*>(p.kv_b)[i]) * s;
}

__global__ void __launch_bounds__(kThreads) k_mla_attention(MlaAttnParams p) {
  extern __shared__ float sm[];
  const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int C = p.C, R = p.R, N = p.N, V = p.V, L = C + R, qk = N + R, kvw = N + V;
  float* q_lat = sm;            // [C]: scale * W_kb(h)^T q_nope
  float* acc = q_lat + C;       // [C]: running sum of p_j c_j (this thread's columns)
  float* q_rope = acc + C;      // [R]: scale * q_rope
  float* q_nope = q_rope + R;   // [N]
  float* sc = q_nope + N;       // [kWarps]: one tile's scores
  bf16* out = static_cast<bf16*>(p.out) + (int64_t(t) * p.H + h) * V;
  if (p.num_seqs == 0 || t >= p.query_start[p.num_seqs]) {  // a padding row of a graph bucket
    for (int e = tid; e < V; e += kThreads) out[e] = f2bf(0.f);
    return;  // the whole block: no barrier is skipped by part of it
  }
  const bf16* qrow = static_cast<const bf16*>(p.q) + (int64_t(t) * p.H + h) * qk;
  for (int d = tid; d < N; d += kThreads) q_nope[d] = bf2f(qrow[d]);
  for (int d = tid; d < R; d += kThreads) q_rope[d] = bf2f(qrow[N + d]) * p.scale;
  __syncthreads();
  const int64_t kb_row0 = int64_t(h) * kvw;
  for (int c = tid; c < C; c += kThreads) {
    float s = 0.f;
    for (int d = 0; d < N; ++d) s += q_nope[d] * ld_kvb(p, kb_row0 + d, c);
    q_lat[c] = s * p.scale;
    acc[c] = 0.f;
  }
  // The token's sequence (query_start is sorted) and its block table.
  int seq = 0;
  while (seq + 1 < p.num_seqs && p.query_start[seq + 1] <= t) ++seq;
  const int32_t* table = p.block_tables + int64_t(seq) * p.max_blocks_per_seq;
  const int n = p.positions[t] + 1;
  __syncthreads();
  float m = -INFINITY, l = 0.f;
  for (int j0 = 0; j0 < n; j0 += kWarps) {
    const int j = j0 + warp;
    if (j < n) {
      const int64_t row = (int64_t(table[j / p.block_size]) * p.block_size + j % p.block_size) * L;
      float s = 0.f;
      for (int c = lane; c < C; c += 32) s += q_lat[c] * ld_cache(p.cache, p.cache_fp8, p.k_scale, row + c);
      for (int r = lane; r < R; r += 32) s += q_rope[r] * ld_cache(p.cache, p.cache_fp8, p.k_scale, row + C + r);
      s = warp_sum(s);
      if (lane == 0) sc[warp] = s;
    }
    __syncthreads();
    const int cnt = min(kWarps, n - j0);
    float tile_max = -INFINITY;
    for (int w = 0; w < cnt; ++w) tile_max = fmaxf(tile_max, sc[w]);
    const float m_new = fmaxf(m, tile_max);
    const float corr = __expf(m - m_new);  // m = -inf at the start: corr 0, acc and l are 0 anyway
    float pw[kWarps];
    float psum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      pw[w] = w < cnt ? __expf(sc[w] - m_new) : 0.f;
      psum += pw[w];
    }
    l = l * corr + psum;
    m = m_new;
    for (int c = tid; c < C; c += kThreads) {
      float a = acc[c] * corr;
      for (int w = 0; w < cnt; ++w) {
        const int jj = j0 + w;
        const int64_t row = (int64_t(table[jj / p.block_size]) * p.block_size + jj % p.block_size) * L;
        a += pw[w] * ld_cache(p.cache, p.cache_fp8, p.k_scale, row + c);
      }
      acc[c] = a;
    }
    __syncthreads();  // sc is rewritten by the next tile
  }
  const float inv_l = 1.f / l;
  for (int c = tid; c < C; c += kThreads) acc[c] *= inv_l;
  __syncthreads();
  // out[e] = W_vb(h)[e, :] . o
  const int64_t vb_row0 = kb_row0 + N;
  for (int e = warp; e < V; e += kWarps) {
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += acc[c] * ld_kvb(p, vb_row0 + e, c);
    s = warp_sum(s);
    if (lane == 0) out[e] = f2bf(s);
  }
}

}  // namespace

void launch_mla_rope_write_kv(const MlaRopeKvParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  k_mla_rope_write_kv<<<p.T, kThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void launch_mla_attention(const MlaAttnParams& p, cudaStream_t s) {
  if (p.T == 0 || p.H == 0) return;
  const size_t smem = size_t(2 * p.C + p.R + p.N + kWarps) * sizeof(float);
  k_mla_attention<<<dim3(p.H, p.T), kThreads, smem, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeserve::cuda
