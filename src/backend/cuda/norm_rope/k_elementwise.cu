// Elementwise and row-wise kernels: embedding gather, (add +) RMSNorm, add, row sums of
// squares, fused full-width QK-norm + partial NeoX RoPE, paged KV write.
// Activations are bf16 or f32 (runtime flag, uniform per launch); statistics are f32.
#include <algorithm>
#include <cstdlib>

#include <cooperative_groups.h>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/kernels_prefill.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/norm_rope/row_vec.cuh"
#include "core/fp8_e4m3.h"

namespace moeserve::cuda {
namespace {

__device__ __forceinline__ float ld(const void* p, bool bf, int64_t i) {
  return bf ? bf2f(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void st(void* p, bool bf, int64_t i, float v) {
  if (bf)
    static_cast<bf16*>(p)[i] = f2bf(v);
  else
    static_cast<float*>(p)[i] = v;
}
// Value as stored (rounded to bf16 when the buffer is bf16).
__device__ __forceinline__ float round_as(bool bf, float v) { return bf ? bf2f(f2bf(v)) : v; }

__global__ void embedding_kernel(const void* table, bool tbf, const int32_t* ids, int H, int vocab,
                                 void* out, bool obf) {
  pdl_enter();
  const int t = blockIdx.x;
  const int id = ids[t];
  const bool ok = id >= 0 && id < vocab;  // invalid ids give a zero row (checked on the host too)
  for (int h = threadIdx.x; h < H; h += blockDim.x)
    st(out, obf, int64_t(t) * H + h, ok ? ld(table, tbf, int64_t(id) * H + h) : 0.f);
}

__global__ void rms_norm_kernel(RmsNormParams p) {
  pdl_enter();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int C = p.cols;
  float ss = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float v = ld(p.x, p.x_bf16, row * C + c);
    if (p.residual) {
      v += ld(p.residual, p.residual_bf16, row * C + c);
      st(p.residual, p.residual_bf16, row * C + c, v);
      v = round_as(p.residual_bf16, v);
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / C + p.eps);
  // Each thread re-reads exactly the elements it wrote above, so no barrier is needed.
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float v = p.residual ? ld(p.residual, p.residual_bf16, row * C + c) : ld(p.x, p.x_bf16, row * C + c);
    st(p.out, p.out_bf16, row * C + c, v * r * ld(p.weight, p.weight_bf16, c));
  }
}

// bf16 rows of C % 8 == 0, C <= 8 * kNormThreads * kNormV (decode: one block per row): all
// 16-byte loads of the row are issued before any use and the norm weight is loaded before
// the PDL wait (it is a weight), so a row costs one L2 round trip, a block reduction and the
// stores -- the scalar kernel above chains ~2 x C / blockDim dependent load/store steps
// (its residual store may alias the next load), several us at decode.
constexpr int kNormThreads = 256, kNormV = 4;
__global__ void __launch_bounds__(kNormThreads) rms_norm_vec_kernel(RmsNormParams p) {
  __shared__ float scratch[32];
  const int C = p.cols;
  const int64_t row = blockIdx.x;
  uint4 wv[kNormV];
  float v[kNormV][8];
  const float r = norm_row_begin<kNormV, kNormThreads>(p.weight, p.x, p.residual, row, C, p.eps, wv, v, scratch);
  bf16* out = static_cast<bf16*>(p.out) + row * C;
#pragma unroll
  for (int i = 0; i < kNormV; ++i) {
    const int c = (i * kNormThreads + threadIdx.x) * 8;
    if (c < C) {
      uint32_t o[4];
      norm_row_pack8(v[i], r, wv[i], o);
      *reinterpret_cast<uint4*>(out + c) = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

__global__ void add_kernel(const void* a, bool abf, const void* b, bool bbf, void* out, bool obf,
                           int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    st(out, obf, i, ld(a, abf, i) + ld(b, bbf, i));
}

__global__ void row_sumsq_kernel(const void* x, bool bf, int cols, float* out) {
  pdl_enter();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = ld(x, bf, row * cols + c);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  if (threadIdx.x == 0) out[row] = ss;
}

// Normalises one row of width W in place with factor r and weight w, then rotates the first
// rotary_dim dims of each head (NeoX: pairs (d, d + rot/2)). Each element is read and written by
// exactly one thread (the owner of its pair), so the in-place update is race-free.
// inv_freq[d] (d < rot / 2) comes from shared memory, computed once per block (the double
// pow per element made this kernel ~45 us per layer at decode).
// Only the heads of this block's slice (blockIdx.y of gridDim.y) are written.
__device__ void norm_rope_row(void* x, bool bf, int64_t base, int W, float r, const void* w, bool wbf,
                              int D, int rot, float pos, const float* inv_freq_tab) {
  const int half = rot / 2, heads = W / D;
  const int lo = int(int64_t(heads) * blockIdx.y / gridDim.y) * D;
  const int hi = blockIdx.y + 1 == gridDim.y ? W : int(int64_t(heads) * (blockIdx.y + 1) / gridDim.y) * D;
  for (int idx = lo + threadIdx.x; idx < hi; idx += blockDim.x) {
    const int d = idx % D;
    if (d < half) {
      const int j = idx + half;
      const float a = ld(x, bf, base + idx) * r * ld(w, wbf, idx);
      const float b = ld(x, bf, base + j) * r * ld(w, wbf, j);
      const float inv_freq = inv_freq_tab[d];
      float sn, cs;
      sincosf(pos * inv_freq, &sn, &cs);
      st(x, bf, base + idx, a * cs - b * sn);
      st(x, bf, base + j, b * cs + a * sn);
    } else if (d >= rot) {
      st(x, bf, base + idx, ld(x, bf, base + idx) * r * ld(w, wbf, idx));
    }
  }
}

constexpr int kMaxHalfRot = 512;  // rotary_dim <= 1024

// Grid (T, slices). slices == 1: one block per token. slices > 1 (decode, sm_90+): a thread
// block cluster of `slices` blocks per token, each owning 1/slices of the heads. The row
// statistic needs every head, and the row is updated in place, so a block must not read
// heads another block may already have rewritten: each block sums squares over its own
// slice only, and the cluster exchanges the partial sums through distributed shared memory
// (two cluster barriers) before anyone writes. With p.kc the block also writes its slice
// of k (normalised, rotated) and v into the paged cache (the fused write_kv).
template <bool kFp8Cache>
__global__ void qk_norm_rope_kernel(QkNormRopeParams p) {
  __shared__ float scratch[32];
  __shared__ float inv_freq[kMaxHalfRot];
  pdl_enter();
  const int t = blockIdx.x;
  // inv_freq as fp32 like the reference implementations; the angle is an fp32 product.
  for (int d = threadIdx.x; d < p.rotary_dim / 2; d += blockDim.x)
    inv_freq[d] = float(1.0 / pow(double(p.theta), double(2 * d) / double(p.rotary_dim)));
  __syncthreads();
  const int64_t qb = int64_t(t) * p.q_width, kb = int64_t(t) * p.k_width;
  const int D = p.head_dim;
  auto slice = [&](int W, int* lo, int* hi) {
    const int heads = W / D;
    *lo = int(int64_t(heads) * blockIdx.y / gridDim.y) * D;
    *hi = blockIdx.y + 1 == gridDim.y ? W : int(int64_t(heads) * (blockIdx.y + 1) / gridDim.y) * D;
  };
  int qlo, qhi, klo, khi;
  slice(p.q_width, &qlo, &qhi);
  slice(p.k_width, &klo, &khi);
  float qs = 0.f, ks = 0.f;
  if (!p.q_sumsq) {
    for (int c = qlo + threadIdx.x; c < qhi; c += blockDim.x) {
      float v = ld(p.q, p.act_bf16, qb + c);
      qs += v * v;
    }
    qs = block_sum(qs, scratch);
  }
  if (!p.k_sumsq) {
    for (int c = klo + threadIdx.x; c < khi; c += blockDim.x) {
      float v = ld(p.k, p.act_bf16, kb + c);
      ks += v * v;
    }
    ks = block_sum(ks, scratch);
  }
  if (gridDim.y > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    __shared__ float part[2];  // this block's (q, k) sums of squares over its slice
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) part[0] = qs, part[1] = ks;
    cluster.sync();
    float tq = 0.f, tk = 0.f;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) {
      const float* o = cluster.map_shared_rank(part, r);
      tq += o[0];
      tk += o[1];
    }
    qs = tq, ks = tk;
    cluster.sync();  // no block leaves (freeing `part`) while another still reads it
#endif
  }
  if (p.q_sumsq) qs = p.q_sumsq[t];
  if (p.k_sumsq) ks = p.k_sumsq[t];
  const float rq = rsqrtf(qs / float(p.q_full) + p.eps);
  const float rk = rsqrtf(ks / float(p.k_full) + p.eps);
  const float pos = float(p.positions[t]);
  norm_rope_row(p.q, p.act_bf16, qb, p.q_width, rq, p.q_w, p.w_bf16, p.head_dim, p.rotary_dim, pos, inv_freq);
  norm_rope_row(p.k, p.act_bf16, kb, p.k_width, rk, p.k_w, p.w_bf16, p.head_dim, p.rotary_dim, pos, inv_freq);
  if (!p.kc) return;
  const int64_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;
  __syncthreads();  // this block's k slice is rewritten (by other threads of the block)
  for (int c = klo + threadIdx.x; c < khi; c += blockDim.x) {
    if constexpr (kFp8Cache) {  // the same rounding as the CPU reference (core/fp8_e4m3.h)
      static_cast<uint8_t*>(p.kc)[slot * p.k_width + c] = fp8::kv_store(ld(p.k, p.act_bf16, kb + c), p.k_scale);
      static_cast<uint8_t*>(p.vc)[slot * p.k_width + c] = fp8::kv_store(ld(p.v, p.act_bf16, kb + c), p.v_scale);
    } else {
      st(p.kc, p.cache_bf16, slot * p.k_width + c, ld(p.k, p.act_bf16, kb + c));
      st(p.vc, p.cache_bf16, slot * p.k_width + c, ld(p.v, p.act_bf16, kb + c));
    }
  }
}

template <bool kFp8Cache>
__global__ void write_kv_kernel(const void* k, const void* v, bool sbf, void* kc, void* vc, KvStoreSpec cs,
                                const int32_t* slots, int width, int64_t num_slots) {
  pdl_enter();
  const int t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;  // padding token (or out of range: never written)
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    const float kx = ld(k, sbf, int64_t(t) * width + c), vx = ld(v, sbf, int64_t(t) * width + c);
    if constexpr (kFp8Cache) {
      static_cast<uint8_t*>(kc)[slot * width + c] = fp8::kv_store(kx, cs.k_scale);
      static_cast<uint8_t*>(vc)[slot * width + c] = fp8::kv_store(vx, cs.v_scale);
    } else {
      st(kc, cs.bf16, slot * width + c, kx);
      st(vc, cs.bf16, slot * width + c, vx);
    }
  }
}

}  // namespace

void launch_embedding(const void* table, bool table_bf16, const int32_t* ids, int T, int H, int vocab,
                      void* out, bool out_bf16, cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(embedding_kernel, dim3(T), dim3(256), 0, s, table, table_bf16, ids, H, vocab, out, out_bf16);
  CUDA_CHECK_LAUNCH();
}

void launch_rms_norm(const RmsNormParams& p, cudaStream_t s) {
  if (p.rows == 0) return;
  auto a16 = [](const void* q) { return q == nullptr || (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  if (p.x_bf16 && p.weight_bf16 && p.out_bf16 && (!p.residual || p.residual_bf16) && p.cols % 8 == 0 &&
      p.cols <= 8 * kNormThreads * kNormV && a16(p.x) && a16(p.weight) && a16(p.out) && a16(p.residual)) {
    launch_pdl(rms_norm_vec_kernel, dim3(p.rows), dim3(kNormThreads), 0, s, p);
    CUDA_CHECK_LAUNCH();
    return;
  }
  launch_pdl(rms_norm_kernel, dim3(p.rows), dim3(512), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

void launch_add(const void* a, bool a_bf16, const void* b, bool b_bf16, void* out, bool out_bf16,
                int64_t n, cudaStream_t s) {
  if (n == 0) return;
  int blocks = int(std::min<int64_t>((n + 255) / 256, 4096));
  launch_pdl(add_kernel, dim3(blocks), dim3(256), 0, s, a, a_bf16, b, b_bf16, out, out_bf16, n);
  CUDA_CHECK_LAUNCH();
}

void launch_row_sum_squares(const void* x, bool x_bf16, int rows, int cols, float* out, cudaStream_t s) {
  if (rows == 0) return;
  launch_pdl(row_sumsq_kernel, dim3(rows), dim3(256), 0, s, x, x_bf16, cols, out);
  CUDA_CHECK_LAUNCH();
}

void launch_qk_norm_rope(const QkNormRopeParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  CU_REQUIRE(p.rotary_dim / 2 <= kMaxHalfRot, "qk_norm_rope: rotary_dim " + std::to_string(p.rotary_dim) + " > 1024");
  // Few tokens (decode, sm_90+): a cluster of 8 blocks per token, each normalising (and
  // rotating) 1/8 of the heads, instead of one block walking all 56 heads of a token.
  // The cluster code needs sm_90 code.
  const int slices = p.T < 64 && code_arch() >= 900 ? 8 : 1;
  if (p.T >= kQkRopeVecMinTokens && qk_rope_vec_supported(p)) {  // prefill: k_rope_prefill.cu
    launch_qk_rope_vec(p, s);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(p.T, slices);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (slices > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1, attr[n].val.clusterDim.y = slices, attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  if (p.kc && p.cache_fp8) CUDA_CHECK(cudaLaunchKernelEx(&cfg, qk_norm_rope_kernel<true>, p));
  else CUDA_CHECK(cudaLaunchKernelEx(&cfg, qk_norm_rope_kernel<false>, p));
}

void launch_write_kv(const void* k, const void* v, bool src_bf16, void* kc, void* vc, const KvStoreSpec& cache,
                     const int32_t* slot_mapping, int T, int width, int64_t num_slots, cudaStream_t s) {
  if (T == 0) return;
  if (cache.fp8)
    launch_pdl(write_kv_kernel<true>, dim3(T), dim3(256), 0, s, k, v, src_bf16, kc, vc, cache, slot_mapping, width,
               num_slots);
  else
    launch_pdl(write_kv_kernel<false>, dim3(T), dim3(256), 0, s, k, v, src_bf16, kc, vc, cache, slot_mapping, width,
               num_slots);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kQkRopeVecMinTokens == limits::kQkRopeVecMinTokens);
}  // namespace moeserve::cuda
