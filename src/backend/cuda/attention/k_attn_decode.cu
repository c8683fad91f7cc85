// Fused decode attention (sm_90+): QK-norm + partial NeoX RoPE of this step's q and k, the
// paged KV write of k/v, and split-KV GQA attention with the split merge, in ONE kernel.
// Replaces qk_norm_rope_write_kv + attention + combine (three dependent launches per layer at
// batch 1) when every sequence has exactly one query token.
//
// Grid (splits, kv heads, sequences); the `splits` blocks of one (sequence, kv head) form a
// thread-block cluster and merge their partial softmax states through distributed shared
// memory, so no partials go through global memory and no extra kernel runs.
// Block: 8 warps. Warp w owns rows 2 (w % 4), +1 of the G <= 8 q heads of the kv head and
// every other 64-key tile of the block's key range (w / 4): two K/V tiles are staged per
// iteration. (The per-tile work of a warp is latency-bound scalar math: 2 rows per warp
// instead of 4 halves it.) Everything the block reads before griddepcontrol.wait is a graph input or cache
// content of earlier steps (context lengths, block tables: uploaded before the step's first
// kernel; K/V of positions < ctx - 1), never something the predecessor (the q/k/v GEMV) writes;
// the newest key (position ctx - 1, written here) is patched into the staged tile after the
// wait. So the K/V stream overlaps the predecessor's tail.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kW = 8, kT = kW * 32, kKeys = 64, kD = 128, kRows = 8, kRowsPerWarp = 2, kMaxSplits = 8;
constexpr int kRowGroups = kRows / kRowsPerWarp;  // warps per key half

struct Smem {
  float qs[kRows][kD];                      // normed, rotated, bf16-rounded q rows x scale*log2(e)
  __align__(16) bf16 ks[2][kKeys][kD + 2];  // two K tiles (+2: conflict-free row-per-lane reads)
  __align__(16) bf16 vs[2][kKeys][kD];
  float po[2][kRows][kD];  // per key half: unnormalised output (merge input for the cluster)
  float pml[2][kRows][2];  // per key half: (running max, sum) in base 2
  float knew[kD], vnew[kD];
  float inv_freq[kD / 2];
  float scratch[32];
};

__device__ __forceinline__ float bfround(float v) { return bf2f(f2bf(v)); }

__global__ void __launch_bounds__(kT) attn_decode_kernel(AttnParams a, QkNormRopeParams n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& S = *reinterpret_cast<Smem*>(smem_raw);
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = gridDim.x, split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = a.Hq / a.Hkv, D = kD;
  const int row_stride = a.Hkv * D;

  // ---- graph inputs (safe before the wait, see the header) ----
  const int t = a.query_start[seq];
  const int ctx = a.context_lens[seq];
  const int newest = ctx - 1;
  const int chunk = ((ctx + splits - 1) / splits + kKeys - 1) / kKeys * kKeys;
  const int kbeg = split * chunk, kend = min(ctx, kbeg + chunk);
  const int ntiles = kend > kbeg ? (kend - kbeg + kKeys - 1) / kKeys : 0;
  const int iters = (ntiles + 1) / 2;
  const int32_t* btab = a.block_tables + int64_t(seq) * a.max_blocks_per_seq;

  // Stages tiles 2 it and 2 it + 1 of the block's range (zeros past kend).
  auto stage = [&](int it) {
#pragma unroll 8
    for (int i = tid; i < 2 * kKeys * (kD / 8); i += kT) {
      const int h = i / (kKeys * (kD / 8)), rem = i % (kKeys * (kD / 8));
      const int kk = rem / (kD / 8), c = (rem % (kD / 8)) * 8;
      const int j = kbeg + (2 * it + h) * kKeys + kk;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (j < kend) {
        const int blk = btab[j / a.block_size];
        const int64_t off = (int64_t(blk) * a.block_size + j % a.block_size) * row_stride + kvh * D + c;
        kv = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(a.k_cache) + off));
        vv = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(a.v_cache) + off));
      }
      const uint32_t* kw = reinterpret_cast<const uint32_t*>(&kv);
#pragma unroll
      for (int w = 0; w < 4; ++w) *reinterpret_cast<uint32_t*>(&S.ks[h][kk][c + 2 * w]) = kw[w];
      *reinterpret_cast<uint4*>(&S.vs[h][kk][c]) = vv;
    }
  };
  // L2 prefetch of the next ops' weights (a hint; weights are constant, so before the wait):
  // the grid's blocks split each tensor into 16-byte-aligned slices, one bulk prefetch per
  // 64 KB issued by the lanes of warp 0.
  if (warp == 0) {
    const int nblk = gridDim.x * gridDim.y * gridDim.z;
    const int b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
#pragma unroll
    for (int i = 0; i < AttnParams::kMaxPf; ++i) {
      if (!a.pf_ptr[i]) continue;
      const uint64_t total = a.pf_bytes[i] / 16 * 16, slice = (total / nblk + 15) / 16 * 16;
      const uint64_t beg = min(total, uint64_t(b) * slice), end = min(total, beg + slice);
      for (uint64_t off = beg + uint64_t(lane) * 65536; off < end; off += 32ull * 65536) {
        const uint32_t nb = uint32_t(min(uint64_t(65536), end - off));
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(a.pf_ptr[i]) + off),
                     "r"(nb)
                     : "memory");
      }
    }
  }
  if (iters > 0) stage(0);
  // RoPE frequencies as fp32 like the reference implementations (double pow: before the wait).
  for (int d = tid; d < n.rotary_dim / 2; d += kT)
    S.inv_freq[d] = float(1.0 / pow(double(n.theta), double(2 * d) / double(n.rotary_dim)));

  pdl_enter();
  __syncthreads();  // inv_freq

  // ---- QK-norm statistics over the full q / k rows (every block recomputes them: 14 KB of L2) ----
  const bf16* qrow = static_cast<const bf16*>(n.q) + int64_t(t) * n.q_width;
  const bf16* krow = static_cast<const bf16*>(n.k) + int64_t(t) * n.k_width;
  float qss = 0.f, kss = 0.f;
  if (!n.q_sumsq)
    for (int c = tid * 8; c < n.q_width; c += kT * 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(qrow + c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = bf16x2_to_f2(w[e]);
        qss += f.x * f.x + f.y * f.y;
      }
    }
  if (!n.k_sumsq)
    for (int c = tid * 8; c < n.k_width; c += kT * 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(krow + c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = bf16x2_to_f2(w[e]);
        kss += f.x * f.x + f.y * f.y;
      }
    }
  qss = n.q_sumsq ? n.q_sumsq[t] : block_sum(qss, S.scratch);
  kss = n.k_sumsq ? n.k_sumsq[t] : block_sum(kss, S.scratch);
  const float rq = rsqrtf(qss / float(n.q_full) + n.eps), rk = rsqrtf(kss / float(n.k_full) + n.eps);
  const float pos = float(n.positions[t]);
  const int half = n.rotary_dim / 2;
  const float qscale = a.scale * 1.4426950408889634f;  // log2(e): softmax in base 2
  const bf16* qw = static_cast<const bf16*>(n.q_w);
  const bf16* kw = static_cast<const bf16*>(n.k_w);
  // Value of element d of a head (row base x, norm weight base w, factor r) after norm + RoPE,
  // rounded to bf16 as the unfused kernels store it.
  auto normed = [&](const bf16* x, const bf16* w, float r, int d) {
    if (d >= n.rotary_dim) return bfround(bf2f(x[d]) * r * bf2f(w[d]));
    const int d0 = d < half ? d : d - half;
    float sn, cs;
    sincosf(pos * S.inv_freq[d0], &sn, &cs);
    const float u = bf2f(x[d0]) * r * bf2f(w[d0]), v = bf2f(x[d0 + half]) * r * bf2f(w[d0 + half]);
    return bfround(d < half ? u * cs - v * sn : v * cs + u * sn);
  };
#pragma unroll
  for (int i = tid; i < kRows * kD; i += kT) {
    const int r = i / D, d = i % D;
    float v = 0.f;
    if (r < G) {
      const int h = kvh * G + r;
      v = normed(qrow + h * D, qw + h * D, rq, d) * qscale;
    }
    S.qs[r][d] = v;
  }
  const bool has_new = newest >= kbeg && newest < kend;  // this block owns the newest key
  if (has_new && tid < D) {
    const float kn = normed(krow + kvh * D, kw + kvh * D, rk, tid);
    const float vn = bf2f(static_cast<const bf16*>(n.v)[int64_t(t) * n.k_width + kvh * D + tid]);
    S.knew[tid] = kn, S.vnew[tid] = vn;
    const int64_t slot = n.slots[t];
    if (slot >= 0 && slot < n.num_slots) {
      static_cast<bf16*>(n.kc)[slot * n.k_width + kvh * D + tid] = f2bf(kn);
      static_cast<bf16*>(n.vc)[slot * n.k_width + kvh * D + tid] = f2bf(vn);
    }
  }
  const int new_it = has_new ? (newest - kbeg) / kKeys / 2 : -1;
  const int new_h = has_new ? (newest - kbeg) / kKeys % 2 : 0, new_kk = has_new ? (newest - kbeg) % kKeys : 0;

  // ---- attention over the block's key range ----
  const int rg = warp % kRowGroups, kh = warp / kRowGroups;
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kD / 32];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY, l[rr] = 0.f;
#pragma unroll
    for (int i = 0; i < kD / 32; ++i) acc[rr][i] = 0.f;
  }
  const bool rows_live = rg * kRowsPerWarp < G;
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      __syncthreads();  // previous tiles consumed
      stage(it);
    }
    __syncthreads();  // tiles staged (and q, knew on the first pass)
    if (it == new_it) {
      if (tid < D) {
        S.ks[new_h][new_kk][tid] = f2bf(S.knew[tid]);
        S.vs[new_h][new_kk][tid] = f2bf(S.vnew[tid]);
      }
      __syncthreads();
    }
    const int k0 = kbeg + (2 * it + kh) * kKeys;
    if (!rows_live || k0 >= kend) continue;
    const int kn = min(kKeys, kend - k0);
    float s0[kRowsPerWarp], s1[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) s0[rr] = s1[rr] = 0.f;
#pragma unroll 4
    for (int d = 0; d < kD; d += 2) {
      const float2 ka = bf16x2_to_f2(*reinterpret_cast<const uint32_t*>(&S.ks[kh][lane][d]));
      const float2 kb = bf16x2_to_f2(*reinterpret_cast<const uint32_t*>(&S.ks[kh][lane + 32][d]));
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float2 qv = *reinterpret_cast<const float2*>(&S.qs[rg * kRowsPerWarp + rr][d]);
        s0[rr] = fmaf(qv.x, ka.x, fmaf(qv.y, ka.y, s0[rr]));
        s1[rr] = fmaf(qv.x, kb.x, fmaf(qv.y, kb.y, s1[rr]));
      }
    }
    float p0[kRowsPerWarp], p1[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      if (lane >= kn) s0[rr] = -INFINITY;
      if (lane + 32 >= kn) s1[rr] = -INFINITY;
      const float mn = fmaxf(m[rr], warp_max(fmaxf(s0[rr], s1[rr])));  // finite: kn >= 1
      const float corr = exp2f(m[rr] - mn);
      p0[rr] = exp2f(s0[rr] - mn);
      p1[rr] = exp2f(s1[rr] - mn);
      l[rr] = l[rr] * corr + warp_sum(p0[rr] + p1[rr]);
      m[rr] = mn;
#pragma unroll
      for (int i = 0; i < kD / 32; ++i) acc[rr][i] *= corr;
    }
    for (int kk = 0; kk < kn; ++kk) {
      float vv[kD / 32];
#pragma unroll
      for (int i = 0; i < kD / 32; ++i) vv[i] = bf2f(S.vs[kh][kk][lane + 32 * i]);
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float pk = __shfl_sync(0xffffffffu, kk < 32 ? p0[rr] : p1[rr], kk & 31);
#pragma unroll
        for (int i = 0; i < kD / 32; ++i) acc[rr][i] = fmaf(pk, vv[i], acc[rr][i]);
      }
    }
  }

  // ---- partial state of each (key half, row) into shared memory, then the cluster merge ----
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = rg * kRowsPerWarp + rr;
#pragma unroll
    for (int i = 0; i < kD / 32; ++i) S.po[kh][r][lane + 32 * i] = acc[rr][i];
    if (lane == 0) S.pml[kh][r][0] = m[rr], S.pml[kh][r][1] = l[rr];
  }
  cluster.sync();  // every block's partials written and visible cluster-wide
  // Block `split` merges elements split * kT + tid, + splits * kT, ... of the G x D outputs.
  for (int e = split * kT + tid; e < G * D; e += splits * kT) {
    const int r = e / D, d = e % D;
    float M = -INFINITY;
    for (int b = 0; b < splits; ++b) {
      const Smem* o = cluster.map_shared_rank(&S, b);
      M = fmaxf(M, fmaxf(o->pml[0][r][0], o->pml[1][r][0]));
    }
    float L = 0.f, acc_o = 0.f;
    if (M != -INFINITY)
      for (int b = 0; b < splits; ++b) {
        const Smem* o = cluster.map_shared_rank(&S, b);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float mh = o->pml[h][r][0];
          if (mh == -INFINITY) continue;
          const float w = exp2f(mh - M);
          L += o->pml[h][r][1] * w;
          acc_o += o->po[h][r][d] * w;
        }
      }
    static_cast<bf16*>(a.out)[(int64_t(t) * a.Hq + kvh * G + r) * D + d] = f2bf(L > 0.f ? acc_o / L : 0.f);
  }
  cluster.sync();  // no block leaves (freeing its shared memory) while a peer still reads it
#endif
}

}  // namespace

bool attn_decode_supported(const AttnParams& a, const QkNormRopeParams& n) {
  return !a.kv_fp8 && !n.cache_fp8 && code_arch() >= 900 && a.max_query_len == 1 && a.num_seqs == a.T && a.D == kD && a.Hkv > 0 &&
         a.Hq % a.Hkv == 0 && a.Hq / a.Hkv <= kRows && n.act_bf16 && n.w_bf16 && n.kc && n.cache_bf16 &&
         n.head_dim == kD && n.rotary_dim <= kD && n.rotary_dim % 2 == 0 && n.q_width == a.Hq * kD &&
         n.k_width == a.Hkv * kD && n.T == a.T;
}

int attn_decode_splits(int num_sms, int kv_groups, int max_context) {
  // ~2 blocks per SM (about the residency at this kernel's 80 KB of shared memory), a power
  // of two <= 8 (portable cluster size), and >= 2 tiles (128 keys) per block.
  const int want = (2 * num_sms + kv_groups - 1) / std::max(1, kv_groups);
  int s = 1;
  while (s * 2 <= std::min(want, kMaxSplits) && s * 2 * 128 <= max_context) s *= 2;
  return s;
}

void launch_attn_decode(const AttnParams& a, const QkNormRopeParams& n, int splits, cudaStream_t s) {
  CU_REQUIRE(splits >= 1 && splits <= kMaxSplits, "attn_decode: splits " + std::to_string(splits));
  if (a.T == 0) return;
  static std::atomic<uint64_t> attr_set{0};  // bit per device: the smem opt-in is per device
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attr_set.load() & bit)) {
    CUDA_CHECK(cudaFuncSetAttribute(attn_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))));
    attr_set.fetch_or(bit);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(splits, a.Hkv, a.num_seqs);
  cfg.blockDim = dim3(kT);
  cfg.dynamicSmemBytes = sizeof(Smem);
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int na = 0;
  attr[na].id = cudaLaunchAttributeClusterDimension;
  attr[na].val.clusterDim.x = splits, attr[na].val.clusterDim.y = 1, attr[na].val.clusterDim.z = 1;
  ++na;
  if (pdl_enabled()) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, attn_decode_kernel, a, n));
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kRows == limits::kDecodeRows && kMaxSplits == limits::kDecode1MaxSplits);
}  // namespace moeserve::cuda
