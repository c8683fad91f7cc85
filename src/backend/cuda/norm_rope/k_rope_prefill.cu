// Prefill QK-norm + partial NeoX RoPE (+ the paged KV write): the many-token form of
// qk_norm_rope_kernel (k_elementwise.cu). That kernel walks a token's row with 2-byte loads
// and stores, reading every element twice (sum of squares, then the rotation pair); here each
// thread holds 8 consecutive columns (one 16-byte vector) of q, k and v in registers: one
// load, one block reduction per row, one store, 16-byte cache writes.
//
// Rotation pairs (d, d + rot/2) of a head are rot/16 vectors apart. A head of D columns is
// D/8 consecutive threads of one warp (D/8 a power of two <= 32, vectors v = i * 256 + tid,
// so heads never straddle warps), so the partner vector is a __shfl_xor by rot/16 lanes
// (vector j of a head, j < rot/8, pairs with j ^ (rot/16); needs rot/16 a power of two).
// The angles (cos, sin of pos * inv_freq[d], d < rot/2) are computed once per token into
// shared memory with the same fp32 arithmetic as the generic kernel; the per-element
// products are those of norm_rope_row, so outputs match it up to the row sum's order (an
// occasional 1-ulp bf16 difference).
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/kernels_prefill.h"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {


namespace {

constexpr int kThreads = 256, kQV = 4, kKV = 1;  // q width <= 8192, k width <= 2048
constexpr int kMaxHalf = 128;                    // rotary_dim <= 256

__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 a = bf16x2_to_f2(w[e]);
    f[2 * e] = a.x, f[2 * e + 1] = a.y;
  }
}
__device__ __forceinline__ uint4 pack8(const float* f) {
  uint32_t o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * e], f[2 * e + 1]);
    o[e] = *reinterpret_cast<uint32_t*>(&h);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// Normalises and rotates one vector (8 columns from c) in place: f = x * r * w, then, for
// vectors inside the rotary part, the NeoX rotation with the partner vector (shuffle; every
// lane of the warp must call this).
__device__ __forceinline__ void norm_rope_vec(float* f, const uint4& wv, float r, int c, int D, int rot,
                                              const float* cs, const float* sn) {
  float w[8];
  unpack8(wv, w);
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = f[e] * r * w[e];
  const int half = rot / 2, j = (c % D) / 8, off = half / 8;
  float o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = __shfl_xor_sync(0xffffffffu, f[e], off);
  if (j < rot / 8) {
    const int d0 = (c % D) % half;  // angle index of the vector's first column
    if (j < off) {
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = f[e] * cs[d0 + e] - o[e] * sn[d0 + e];
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = f[e] * cs[d0 + e] + o[e] * sn[d0 + e];
    }
  }
}

// 4 blocks (32 warps) per SM: <= 64 registers, so more of each SM's rows are in flight (the
// first version, 97 registers and the norm weights held from before the PDL wait, ran 2 blocks
// per SM at ~1.7 TB/s). The norm weights (12 + 2 KB, L1/L2-resident) are read where used.
__global__ void __launch_bounds__(kThreads, 4) qk_rope_vec_kernel(QkNormRopeParams p) {
  __shared__ float scratch[32];
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int t = blockIdx.x, tid = threadIdx.x;
  const int nq = p.q_width / 8, nk = p.k_width / 8;
  const uint4* wq = reinterpret_cast<const uint4*>(p.q_w);
  const uint4* wk = reinterpret_cast<const uint4*>(p.k_w);
  const int half = p.rotary_dim / 2;  // <= kMaxHalf <= kThreads: thread d owns angle d
  // inv_freq depends on the launch parameters only: the double pow runs before the PDL wait
  // (it was on warp 0's path to its first load, and every warp waited for warp 0 at the
  // block sum).
  const float inv_freq = tid < half ? float(1.0 / pow(double(p.theta), double(2 * tid) / double(p.rotary_dim))) : 0.f;
  pdl_enter();
  // Every load of the row first (q, k, v, position), then the angles, then the math.
  const uint4* q = reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.q) + int64_t(t) * p.q_width);
  const uint4* k = reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.k) + int64_t(t) * p.k_width);
  uint4 rq_[kQV], rk_[kKV], vv[kKV];
#pragma unroll
  for (int i = 0; i < kQV; ++i)
    if (i * kThreads + tid < nq) rq_[i] = q[i * kThreads + tid];
#pragma unroll
  for (int i = 0; i < kKV; ++i) {
    const int v = i * kThreads + tid;
    if (v < nk) {
      rk_[i] = k[v];
      if (p.kc) vv[i] = reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.v) + int64_t(t) * p.k_width)[v];
    }
  }
  if (tid < half) {
    // Same fp32 angle as qk_norm_rope_kernel: inv_freq rounded to f32, the product in f32.
    const float pos = float(p.positions[t]);
    sincosf(pos * inv_freq, &sn[tid], &cs[tid]);
  }
  float fq[kQV][8], fk[kKV][8];
  float qs = 0.f, ks = 0.f;
#pragma unroll
  for (int i = 0; i < kQV; ++i) {
    const int v = i * kThreads + tid;
    if (v < nq) {
      unpack8(rq_[i], fq[i]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) fq[i][e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) qs += fq[i][e] * fq[i][e];
  }
#pragma unroll
  for (int i = 0; i < kKV; ++i) {
    const int v = i * kThreads + tid;
    if (v < nk) {
      unpack8(rk_[i], fk[i]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) fk[i][e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ks += fk[i][e] * fk[i][e];
  }
  qs = p.q_sumsq ? p.q_sumsq[t] : block_sum(qs, scratch);
  ks = p.k_sumsq ? p.k_sumsq[t] : block_sum(ks, scratch);  // (block_sum's barriers also publish cs / sn)
  __syncthreads();
  const float rq = rsqrtf(qs / float(p.q_full) + p.eps);
  const float rk = rsqrtf(ks / float(p.k_full) + p.eps);
  uint4* qo = reinterpret_cast<uint4*>(static_cast<bf16*>(p.q) + int64_t(t) * p.q_width);
  uint4* ko = reinterpret_cast<uint4*>(static_cast<bf16*>(p.k) + int64_t(t) * p.k_width);
#pragma unroll
  for (int i = 0; i < kQV; ++i) {
    const int v = i * kThreads + tid;
    if (i * kThreads >= nq) break;  // uniform over the block: no lane of the warp is left out
    norm_rope_vec(fq[i], v < nq ? __ldg(wq + v) : make_uint4(0, 0, 0, 0), rq, v * 8, p.head_dim, p.rotary_dim, cs, sn);
    if (v < nq) qo[v] = pack8(fq[i]);
  }
  const int64_t slot = p.kc ? p.slots[t] : -1;
  const bool write = slot >= 0 && slot < p.num_slots;
#pragma unroll
  for (int i = 0; i < kKV; ++i) {
    const int v = i * kThreads + tid;
    if (i * kThreads >= nk) break;
    norm_rope_vec(fk[i], v < nk ? __ldg(wk + v) : make_uint4(0, 0, 0, 0), rk, v * 8, p.head_dim, p.rotary_dim, cs, sn);
    if (v < nk) {
      const uint4 kv = pack8(fk[i]);
      ko[v] = kv;
      if (write) {
        reinterpret_cast<uint4*>(static_cast<bf16*>(p.kc) + slot * p.k_width)[v] = kv;
        reinterpret_cast<uint4*>(static_cast<bf16*>(p.vc) + slot * p.k_width)[v] = vv[i];
      }
    }
  }
}

bool pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

bool qk_rope_vec_supported(const QkNormRopeParams& p) {
  auto a16 = [](const void* q) { return q == nullptr || (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  const int D = p.head_dim, rot = p.rotary_dim;
  return p.rope_vec && p.act_bf16 && p.w_bf16 && (!p.kc || p.cache_bf16) && D % 8 == 0 && pow2(D / 8) &&
         D / 8 <= 32 && rot % 16 == 0 && rot <= D && rot / 2 <= kMaxHalf && pow2(rot / 16) && p.q_width % D == 0 &&
         p.k_width % D == 0 && p.q_width <= 8 * kThreads * kQV && p.k_width <= 8 * kThreads * kKV && a16(p.q) &&
         a16(p.k) && a16(p.q_w) && a16(p.k_w) && a16(p.v) && a16(p.kc) && a16(p.vc);
}

void launch_qk_rope_vec(const QkNormRopeParams& p, cudaStream_t s) {
  CU_REQUIRE(qk_rope_vec_supported(p), "qk_rope_vec: unsupported shapes");
  if (p.T == 0) return;
  launch_pdl(qk_rope_vec_kernel, dim3(p.T), dim3(kThreads), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
