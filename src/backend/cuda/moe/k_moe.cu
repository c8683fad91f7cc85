// MoE glue kernels: the fused router (f32 gate GEMV, sigmoid, biased top-k, renormalise),
// the align step that groups (token, k) pairs by local expert and builds the tile table
// for the expert GEMV/GEMM kernels, and the ordered combine of per-pair outputs.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/moe/route_topk.cuh"
#include "core/debug_flags.h"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/common/kernels_prefill.h"

namespace moeserve::cuda {
namespace {

constexpr int kMaxExperts = 1024;

// Asks L2 to start fetching a chosen expert's gate/up weights (sm_90 bulk prefetch; a hint)
// while the top-k goes on: the up GEMV's first blocks can only start after this kernel.
__device__ __forceinline__ void prefetch_up(const RouteParams& p, int e) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int le = e - p.pf_first_local;
  if (le < 0 || le >= p.pf_num_local) return;
  const ExpertPtrs& x = p.pf_experts[le];
  for (uint64_t off = 0; off < p.pf_bytes; off += (1u << 20)) {
    const uint32_t n = uint32_t(min(uint64_t(1u << 20), p.pf_bytes - off));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(x.w1) + off), "r"(n)
                 : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(x.w3) + off), "r"(n)
                 : "memory");
  }
#endif
}

// Top-k of one token by one warp: sigmoid scores from the logits, then top_k by (biased
// score desc, expert id asc), weights renormalised over the chosen k. `score` / `choice`
// are this warp's shared arrays of kMaxExperts.
// Logit of (token t, expert e) from the workspace (p.logits_split: the sum of the two halves).
__device__ __forceinline__ float route_logit(const RouteParams& p, int t, int e) {
  if (!p.logits_split) return __ldcg(p.logits + int64_t(t) * p.E + e);
  const float* row = p.logits + int64_t(t) * 2 * p.E;
  return __ldcg(row + e) + __ldcg(row + p.E + e);
}

__device__ void route_token(const RouteParams& p, int t, float* score, float* choice) {
  const int lane = threadIdx.x & 31;
  for (int e = lane; e < p.E; e += 32) {
    const float s = 1.f / (1.f + expf(-route_logit(p, t, e)));
    score[e] = s;
    choice[e] = s + (p.bias ? p.bias[e] : 0.f);
  }
  __syncwarp();
  float sum = 0.f;
  for (int j = 0; j < p.top_k; ++j) {
    float best = -INFINITY;
    int best_e = kMaxExperts;
    for (int e = lane; e < p.E; e += 32) {
      const float c = choice[e];
      if (c > best || (c == best && e < best_e)) best = c, best_e = e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    if (best_e >= p.E) best_e = 0;  // only if every score is NaN
    if (lane == 0 && p.pf_experts && t * p.top_k + j < p.pf_pairs) prefetch_up(p, best_e);
    if (lane == 0) {
      p.ids[t * p.top_k + j] = best_e;
      p.weights[t * p.top_k + j] = score[best_e];
      choice[best_e] = -INFINITY;
    }
    sum += score[best_e];
    __syncwarp();
  }
  if (lane == 0) {
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int j = 0; j < p.top_k; ++j) p.weights[t * p.top_k + j] *= inv;
  }
  __syncwarp();
}

// Router logits [T, E] = x [T, H] . gate [E, H]^T in f32. A warp owns one expert row and a
// chunk of kRouteTok tokens, so the gate (3 MB f32 for M2.5) is read once per token chunk
// rather than once per token, and a decode step spreads it over E / 2 blocks instead of one.
// Gate rows of H <= 32 * 4 * kRoutePre f32 (M2.5: 3072 = 24 float4 per lane) are loaded
// into registers before the PDL wait: the whole 3 MB is in flight while the preceding
// RMSNorm finishes. With p.counter (T <= kRouteTok), the last block to finish (threadfence
// reduction) also runs the top-k for every token: router = one kernel at decode.
constexpr int kRouteTok = 8, kRouteWarps = 2, kRoutePre = 24;
// Fused add + RMSNorm (p.norm): up to 4 tokens of H <= 3072, normalised by every block into
// shared memory (a 12 KB read of the residual and the addend per token, from L2); the last
// block, after every other block has read the old residual, stores residual and normed rows.
constexpr int kRouteNormTok = 4, kRouteNormH = 3072;
// kFused = false (T > 8, many blocks): no register prefetch, no shared memory, no norm or
// top-k, so the kernel keeps its occupancy (the fused variant's 253 registers and 41 KB of
// shared memory allow 4 blocks per SM, the plain one ~14).
template <bool kFused>
__global__ void __launch_bounds__(kRouteWarps * 32) route_logits_kernel(RouteParams p) {
  __shared__ float score[kFused ? kRouteWarps : 1][kFused ? kMaxExperts : 1];
  __shared__ float choice[kFused ? kRouteWarps : 1][kFused ? kMaxExperts : 1];
  __shared__ int is_last;
  __shared__ float scratch[32];
  // p.norm: this block's normed rows
  __shared__ __align__(16) bf16 xs[kFused ? kRouteNormTok : 1][kFused ? kRouteNormH : 8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int e = blockIdx.x * kRouteWarps + warp, t0 = blockIdx.y * kRouteTok;
  const bool pre = kFused && p.H % 128 == 0 && p.H / 128 <= kRoutePre && !p.gate_bf16;
  const bool norm = kFused && p.norm;
  float4 wpre[kFused ? kRoutePre : 1];
  if (pre && e < p.E) {
    const float4* g = reinterpret_cast<const float4*>(static_cast<const float*>(p.gate) + int64_t(e) * p.H);
#pragma unroll
    for (int i = 0; i < (kFused ? kRoutePre : 1); ++i)
      if (i < p.H / 128) wpre[i] = __ldg(g + i * 32 + lane);
  }
  pdl_enter();
  const int nt = min(kRouteTok, p.T - t0);
  if (norm) {
    for (int j = 0; j < nt; ++j)
      add_norm_row_to_smem<kRouteNormH / (8 * kRouteWarps * 32)>(
          static_cast<const bf16*>(p.residual) + int64_t(j) * p.H, static_cast<const bf16*>(p.x) + int64_t(j) * p.H,
          static_cast<const bf16*>(p.norm_w), p.H, p.eps, &xs[j][0], scratch);
    __syncthreads();
  }
  float acc[kRouteTok];
#pragma unroll
  for (int j = 0; j < kRouteTok; ++j) acc[j] = 0.f;
  auto fma4 = [&](const float4& w, int h) {  // h: first of 4 columns
#pragma unroll
    for (int j = 0; j < kRouteTok; ++j) {
      if (j < nt) {
        const int64_t xi = int64_t(t0 + j) * p.H + h;
        float x0, x1, x2, x3;
        if (norm) {
          const uint2 raw = *reinterpret_cast<const uint2*>(&xs[j][h]);
          const float2 a = bf16x2_to_f2(raw.x), b = bf16x2_to_f2(raw.y);
          x0 = a.x, x1 = a.y, x2 = b.x, x3 = b.y;
        } else if (p.x_bf16) {
          const uint2 raw = __ldg(reinterpret_cast<const uint2*>(static_cast<const bf16*>(p.x) + xi));
          const float2 a = bf16x2_to_f2(raw.x), b = bf16x2_to_f2(raw.y);
          x0 = a.x, x1 = a.y, x2 = b.x, x3 = b.y;
        } else {
          const float4 v = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + xi));
          x0 = v.x, x1 = v.y, x2 = v.z, x3 = v.w;
        }
        acc[j] = fmaf(x0, w.x, fmaf(x1, w.y, fmaf(x2, w.z, fmaf(x3, w.w, acc[j]))));
      }
    }
  };
  if (e < p.E) {
    if (pre) {
#pragma unroll
      for (int i = 0; i < (kFused ? kRoutePre : 1); ++i)
        if (i < p.H / 128) fma4(wpre[i], 4 * (i * 32 + lane));
    } else if (p.H % 4 == 0 && !p.gate_bf16) {
      const float4* g = reinterpret_cast<const float4*>(static_cast<const float*>(p.gate) + int64_t(e) * p.H);
#pragma unroll 4
      for (int h4 = lane; h4 < p.H / 4; h4 += 32) fma4(__ldg(g + h4), 4 * h4);
    } else {
      for (int h = lane; h < p.H; h += 32) {
        const int64_t wi = int64_t(e) * p.H + h;
        const float wv = p.gate_bf16 ? bf2f(static_cast<const bf16*>(p.gate)[wi]) : static_cast<const float*>(p.gate)[wi];
#pragma unroll
        for (int j = 0; j < kRouteTok; ++j) {
          if (j < nt) {
            const int64_t xi = int64_t(t0 + j) * p.H + h;
            const float xv = p.x_bf16 ? bf2f(static_cast<const bf16*>(p.x)[xi]) : static_cast<const float*>(p.x)[xi];
            acc[j] = fmaf(xv, wv, acc[j]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kRouteTok; ++j) {
      const float v = warp_sum(acc[j]);
      if (lane == 0 && j < nt) p.logits[int64_t(t0 + j) * p.E + e] = v;
    }
  }
  if (!kFused || !p.counter) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(p.counter, 1) == int(gridDim.x * gridDim.y) - 1;
  __syncthreads();
  if (!is_last) return;
  if (threadIdx.x == 0) *p.counter = 0;  // ready for the next layer / graph replay
  __threadfence();
  if (norm) {  // every other block is done with the old residual
    for (int j = 0; j < nt; ++j)
      for (int h = threadIdx.x; h < p.H; h += blockDim.x) {
        const int64_t i = int64_t(j) * p.H + h;
        const float v = bf2f(static_cast<const bf16*>(p.residual)[i]) + bf2f(static_cast<const bf16*>(p.x)[i]);
        static_cast<bf16*>(p.residual)[i] = f2bf(v);
        static_cast<bf16*>(p.norm_out)[i] = xs[j][h];
      }
  }
  for (int t = warp; t < p.T; t += kRouteWarps) route_token(p, t, score[warp], choice[warp]);
}

// Decode router (T <= kRouteTok, f32 gate, H % 128 == 0, H <= 128 * kRoutePre, top_k <= 32):
// one warp per expert row (E / 8 blocks of 8 warps; the row's 24 float4 per lane are loaded
// before the PDL wait, so the 3 MB gate streams during the predecessor's tail), then the
// last block (threadfence reduction) runs the top-k of each token with the whole block
// (block_rank_topk, route_topk.cuh).
constexpr int kDecWarps = 8;
__global__ void __launch_bounds__(kDecWarps * 32) route_decode_kernel(RouteParams p) {
  __shared__ float score[kMaxExperts];
  __shared__ __align__(16) float choice[kMaxExperts];
  __shared__ int sel[32];
  __shared__ int is_last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int e = blockIdx.x * kDecWarps + warp;
  const int nv = p.pf_pairs == 2 ? 0 : p.H / 128;  // float4 per lane (pf_pairs = the ROUTE_DIAG mode here: 1 skips the top-k, 2 the logits)
  float4 w[kRoutePre];
  const float4* g = reinterpret_cast<const float4*>(static_cast<const float*>(p.gate) + int64_t(min(e, p.E - 1)) * p.H);
#pragma unroll
  for (int i = 0; i < kRoutePre; ++i)
    if (i < nv) w[i] = __ldg(g + i * 32 + lane);
  pdl_enter();
  float acc[kRouteTok];
#pragma unroll
  for (int j = 0; j < kRouteTok; ++j) acc[j] = 0.f;
#pragma unroll
  for (int i = 0; i < kRoutePre; ++i) {
    if (i >= nv) break;
    const int h = 4 * (i * 32 + lane);
#pragma unroll
    for (int j = 0; j < kRouteTok; ++j) {
      if (j < p.T) {
        const uint2 raw = __ldg(reinterpret_cast<const uint2*>(static_cast<const bf16*>(p.x) + int64_t(j) * p.H + h));
        const float2 a = bf16x2_to_f2(raw.x), b = bf16x2_to_f2(raw.y);
        acc[j] = fmaf(a.x, w[i].x, fmaf(a.y, w[i].y, fmaf(b.x, w[i].z, fmaf(b.y, w[i].w, acc[j]))));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRouteTok; ++j) {
    const float v = warp_sum(acc[j]);
    if (lane == 0 && j < p.T && e < p.E) p.logits[int64_t(j) * p.E + e] = v;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(p.counter, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!is_last) return;
  if (tid == 0) *p.counter = 0;  // ready for the next layer / graph replay
  __threadfence();
  if (p.pf_pairs == 1) return;
  block_rank_topk(p, p.T, score, choice, sel);
}


// One warp per token (the unfused path, larger T).
__global__ void route_kernel(RouteParams p) {
  __shared__ float score[kMaxExperts];   // sigmoid(logit)
  __shared__ float choice[kMaxExperts];  // score + bias
  pdl_enter();
  route_token(p, blockIdx.x, score, choice);
}

// Expert offsets and the tile table from per-expert pair counts, by a block of kMaxExperts
// threads (thread e owns expert e; my_cnt = 0 past num_local): a Hillis-Steele inclusive
// scan of (pairs, tiles) over kMaxExperts entries, then expert e's tiles and, by the last
// thread, *num_tiles. Returns e's exclusive pair offset. All threads must call it.
__device__ __forceinline__ int align_scan_tiles(const MoeAlignParams& p, int my_cnt) {
  __shared__ int scan_a[kMaxExperts], scan_b[kMaxExperts];  // (pairs, tiles) inclusive scans
  const int e = threadIdx.x;
  const int my_tiles = (my_cnt + p.tile_rows - 1) / p.tile_rows;
  scan_a[e] = my_cnt;
  scan_b[e] = my_tiles;
  __syncthreads();
  for (int d = 1; d < kMaxExperts; d <<= 1) {
    const int va = e >= d ? scan_a[e - d] : 0, vb = e >= d ? scan_b[e - d] : 0;
    __syncthreads();
    scan_a[e] += va;
    scan_b[e] += vb;
    __syncthreads();
  }
  const int off = scan_a[e] - my_cnt;
  if (e < p.num_local) {
    const int t0 = scan_b[e] - my_tiles;
    for (int j = 0; j < my_tiles; ++j) {
      p.tile_expert[t0 + j] = e;
      p.tile_begin[t0 + j] = off + j * p.tile_rows;
      p.tile_end[t0 + j] = off + min(my_cnt, (j + 1) * p.tile_rows);
    }
  }
  if (e == kMaxExperts - 1) *p.num_tiles = scan_b[e];
  return off;
}

// Single block of 1024 threads. Pass 1 counts pairs per local expert (the atomic's return
// value is the pair's rank within its expert); a block-wide scan turns counts and per-expert
// tile counts into offsets (thread e owns expert e, so no serial loop over experts); each
// expert's thread writes its tiles; pass 2 scatters. The order of pairs inside one expert is
// not deterministic, but every pair's result is computed independently and combined in k
// order, so outputs are.
__global__ void __launch_bounds__(1024) align_kernel(MoeAlignParams p) {
  __shared__ int count[kMaxExperts];
  __shared__ int offset[kMaxExperts];
  pdl_enter();
  const int P = p.T * p.top_k;
  for (int e = threadIdx.x; e < p.num_local; e += blockDim.x) count[e] = 0;
  __syncthreads();
  // Both passes handle kU pairs per thread per iteration with all their loads issued first:
  // one block walks every pair (65,536 at 8k tokens), so the loop is load-latency bound.
  constexpr int kU = 4;
  for (int i0 = threadIdx.x; i0 < P; i0 += kU * blockDim.x) {
    int e[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * blockDim.x;
      e[u] = i < P ? p.ids[i] - p.first_local : -1;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * blockDim.x;
      if (i < P) p.pair_pos[i] = (e[u] >= 0 && e[u] < p.num_local) ? atomicAdd(&count[e[u]], 1) : -1;
    }
  }
  __syncthreads();
  // Offsets by a block-wide scan (num_local <= blockDim.x = kMaxExperts).
  const int e = threadIdx.x;
  const int off = align_scan_tiles(p, e < p.num_local ? count[e] : 0);
  if (e < p.num_local) offset[e] = off;
  __syncthreads();
  for (int i0 = threadIdx.x; i0 < P; i0 += kU * blockDim.x) {
    int ex[kU], rank[kU];
    float w[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * blockDim.x;
      ex[u] = -1;
      if (i < P) ex[u] = p.ids[i] - p.first_local, rank[u] = p.pair_pos[i], w[u] = p.weights[i];
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * blockDim.x;
      if (ex[u] >= 0 && ex[u] < p.num_local) {
        const int pos = offset[ex[u]] + rank[u];
        p.pair_pos[i] = pos;
        p.sorted_token[pos] = i / p.top_k;
        p.sorted_weight[pos] = w[u];
      }
    }
  }
}

// Multi-block align (large P, with a scratch buffer): the single block above walks every
// pair twice and took ~156 us at 65,536 pairs on the H200. Here pairs are cut into chunks of
// `chunk` (one block each): count (per-block histogram, rank within the block's chunk) ->
// scan (one block: per expert, exclusive prefix over blocks, then the expert offsets and the
// tile table as above) -> scatter. scratch: [nb][num_local] block prefixes, then
// [num_local] expert offsets.
__global__ void __launch_bounds__(1024) align_count_kernel(MoeAlignParams p, int chunk) {
  __shared__ int count[kMaxExperts];
  pdl_enter();
  const int P = p.T * p.top_k, b = blockIdx.x, i0 = b * chunk, i1 = min(P, i0 + chunk);
  for (int e = threadIdx.x; e < p.num_local; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const int e = p.ids[i] - p.first_local;
    p.pair_pos[i] = (e >= 0 && e < p.num_local) ? atomicAdd(&count[e], 1) : -1;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < p.num_local; e += blockDim.x) p.scratch[size_t(b) * p.num_local + e] = count[e];
}

__global__ void __launch_bounds__(1024) align_scan_kernel(MoeAlignParams p, int nb) {
  pdl_enter();
  const int e = threadIdx.x, L = p.num_local;
  int my_cnt = 0;
  if (e < L) {
    // Exclusive prefix over blocks; loads batched 8 at a time (independent of the sum).
    for (int b0 = 0; b0 < nb; b0 += 8) {
      int c[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) c[u] = b0 + u < nb ? p.scratch[size_t(b0 + u) * L + e] : 0;
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (b0 + u < nb) p.scratch[size_t(b0 + u) * L + e] = my_cnt, my_cnt += c[u];
    }
  }
  const int off = align_scan_tiles(p, my_cnt);
  if (e < L) p.scratch[size_t(nb) * L + e] = off;
}

__global__ void __launch_bounds__(1024) align_scatter_kernel(MoeAlignParams p, int chunk, int nb) {
  pdl_enter();
  const int P = p.T * p.top_k, b = blockIdx.x, i0 = b * chunk, i1 = min(P, i0 + chunk), L = p.num_local;
  for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const int e = p.ids[i] - p.first_local;
    if (e >= 0 && e < L) {
      const int pos = p.scratch[size_t(nb) * L + e] + p.scratch[size_t(b) * L + e] + p.pair_pos[i];
      p.pair_pos[i] = pos;
      p.sorted_token[pos] = i / p.top_k;
      p.sorted_weight[pos] = p.weights[i];
    }
  }
}

__global__ void combine_kernel(const float* ypair, const int32_t* pair_pos, int top_k, int H, void* out,
                               bool out_bf16) {
  pdl_enter();
  const int t = blockIdx.x;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) {
      const int pos = pair_pos[t * top_k + j];
      if (pos >= 0) acc += ypair[int64_t(pos) * H + h];
    }
    if (out_bf16)
      static_cast<bf16*>(out)[int64_t(t) * H + h] = f2bf(acc);
    else
      static_cast<float*>(out)[int64_t(t) * H + h] = acc;
  }
}

// Prefill top-k (E <= 32 * kPer, top_k <= 32): one warp per token with its E scores in
// registers (lane owns experts lane, lane + 32, ...), kTopkWarps tokens per block. Order:
// biased score desc, then id asc (route_token's), with order-preserving score bits (NaN
// ranks with -inf; 0 = taken). Each of the top_k rounds is either (kRedux = false) the warp
// maximum of a 64-bit key (score bits, 1023 - id) by five xor-shuffle steps, or (kRedux) two
// redux.sync instructions: the maximum score bits, then the minimum id among the lanes
// holding it. Weights are renormalised exactly as route_token does (sequential sum in k
// order, times 1 / sum), so given the same logits all kernels write the same ids and weights.
constexpr int kTopkWarps = 4;
__device__ __forceinline__ uint32_t ordered_bits(float c) {
  if (c != c) c = -INFINITY;  // NaN ranks with -inf (behind every finite score)
  const uint32_t u = __float_as_uint(c);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
template <int kPer, bool kRedux>
__global__ void __launch_bounds__(kTopkWarps * 32) route_topk_warp_kernel(RouteParams p) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kTopkWarps + (threadIdx.x >> 5);
  if (t >= p.T) return;
  float sc[kPer];
  uint32_t key[kPer];  // ordered score bits, 0 = taken / no expert
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    sc[i] = 0.f, key[i] = 0;
    if (e < p.E) {
      sc[i] = 1.f / (1.f + expf(-route_logit(p, t, e)));
      key[i] = ordered_bits(sc[i] + (p.bias ? p.bias[e] : 0.f));
    }
  }
  int my_id = 0;
  float my_sc = 0.f, sum = 0.f;
  for (int j = 0; j < p.top_k; ++j) {
    int e;
    if constexpr (kRedux) {
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < kPer; ++i) m = max(m, key[i]);
      const uint32_t M = __reduce_max_sync(0xffffffffu, m);
      uint32_t c = kMaxExperts;  // this lane's lowest id holding M
#pragma unroll
      for (int i = kPer - 1; i >= 0; --i)
        if (key[i] == M) c = uint32_t(i * 32 + lane);
      e = int(__reduce_min_sync(0xffffffffu, c));
    } else {
      uint64_t best = 0;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const uint64_t k = (uint64_t(key[i]) << 32) | uint32_t(kMaxExperts - 1 - (i * 32 + lane));
        best = key[i] && k > best ? k : best;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const uint64_t ob = __shfl_xor_sync(0xffffffffu, best, o);
        best = ob > best ? ob : best;
      }
      e = kMaxExperts - 1 - int(uint32_t(best));
    }
    // (Every expert taken cannot happen: top_k <= E is checked on the host.)
    const int owner = e & 31, slot = e >> 5;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i == slot) {
        s = sc[i];
        if (lane == owner) key[i] = 0;
      }
    s = __shfl_sync(0xffffffffu, s, owner);
    sum += s;
    if (lane == j) my_id = e, my_sc = s;
  }
  if (lane < p.top_k) {
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    p.ids[int64_t(t) * p.top_k + lane] = my_id;
    p.weights[int64_t(t) * p.top_k + lane] = my_sc * inv;
  }
}

// gate [E, H] f32 -> out [2E, H] bf16: rows [0, E) hi = bf16(w), rows [E, 2E) lo = bf16(w -
// hi). hi + lo is within 2^-17 |w| of w (each half keeps 8 significant bits), and x . hi +
// x . lo has no product rounding for bf16 x (8 x 8 bits fit f32's 24). The gate is a weight
// and `out` a workspace no kernel of the last two launches touches (the previous layer's
// router GEMM is further back), so the whole split runs before the PDL wait, under the
// preceding norm kernel. n % 4 == 0.
__global__ void split_gate_kernel(const float* w, bf16* out, int64_t n) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n; i += int64_t(gridDim.x) * blockDim.x * 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(w + i));
    const __nv_bfloat162 h01 = __floats2bfloat162_rn(v.x, v.y), h23 = __floats2bfloat162_rn(v.z, v.w);
    const float2 f01 = __bfloat1622float2(h01), f23 = __bfloat1622float2(h23);
    const __nv_bfloat162 l01 = __floats2bfloat162_rn(v.x - f01.x, v.y - f01.y);
    const __nv_bfloat162 l23 = __floats2bfloat162_rn(v.z - f23.x, v.w - f23.y);
    uint2 hi, lo;
    hi.x = *reinterpret_cast<const uint32_t*>(&h01), hi.y = *reinterpret_cast<const uint32_t*>(&h23);
    lo.x = *reinterpret_cast<const uint32_t*>(&l01), lo.y = *reinterpret_cast<const uint32_t*>(&l23);
    *reinterpret_cast<uint2*>(out + i) = hi;
    *reinterpret_cast<uint2*>(out + n + i) = lo;
  }
  pdl_enter();
}


// Vectorised combine: thread i of token t's block owns columns [4 i, 4 i + 4) (H % 4 == 0),
// reads them from each of the token's pair rows (f32 float4 or bf16 x4), sums in k order.
template <bool YBF16>
__global__ void combine4_kernel(const void* ypair, const int32_t* pair_pos, int top_k, int H, void* out,
                                bool out_bf16) {
  pdl_enter();
  const int t = blockIdx.x;
  for (int h = 4 * threadIdx.x; h < H; h += 4 * blockDim.x) {
    float a[4] = {0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < top_k; ++j) {
      const int pos = pair_pos[t * top_k + j];
      if (pos < 0) continue;
      const int64_t o = int64_t(pos) * H + h;
      if constexpr (YBF16) {
        const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const bf16*>(ypair) + o);
        const float2 lo = bf16x2_to_f2(raw.x), hi = bf16x2_to_f2(raw.y);
        a[0] += lo.x, a[1] += lo.y, a[2] += hi.x, a[3] += hi.y;
      } else {
        const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(ypair) + o);
        a[0] += v.x, a[1] += v.y, a[2] += v.z, a[3] += v.w;
      }
    }
    const int64_t o = int64_t(t) * H + h;
    if (out_bf16) {
      __nv_bfloat162* d = reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(out) + o);
      d[0] = __floats2bfloat162_rn(a[0], a[1]);
      d[1] = __floats2bfloat162_rn(a[2], a[3]);
    } else {
      *reinterpret_cast<float4*>(static_cast<float*>(out) + o) = make_float4(a[0], a[1], a[2], a[3]);
    }
  }
}

}  // namespace


void launch_split_gate_bf16(const float* gate, void* out, int E, int H, cudaStream_t s) {
  const int64_t n = int64_t(E) * H;
  if (n == 0) return;
  CU_REQUIRE(n % 4 == 0 && reinterpret_cast<uintptr_t>(gate) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0,
             "split_gate_bf16: needs E * H % 4 == 0 and aligned buffers");
  launch_pdl(split_gate_kernel, dim3(unsigned(std::min<int64_t>((n / 4 + 255) / 256, 2048))), dim3(256), 0, s, gate,
             static_cast<bf16*>(out), n);
  CUDA_CHECK_LAUNCH();
}

bool route_norm_supported(const RouteParams& p) {
  return p.counter && p.x_bf16 && !p.gate_bf16 && p.T <= kRouteNormTok && p.H <= kRouteNormH && p.H % 128 == 0 &&
         p.H / 128 <= kRoutePre;  // (H % 8 == 0 for the 16-byte norm loads follows)
}

void launch_moe_route(const RouteParams& p, cudaStream_t s) {
  CU_REQUIRE(p.E <= kMaxExperts && p.top_k <= p.E, "moe_route: " + std::to_string(p.E) + " experts, top_k " + std::to_string(p.top_k) + " unsupported");
  if (p.T == 0) return;
  CU_REQUIRE(p.logits != nullptr, "moe_route: no logits workspace");
  // Decode (one token chunk): top-k in the last logits block (needs the counter).
  RouteParams q = p;
  if (p.T > kRouteTok) q.counter = nullptr;
  CU_REQUIRE(!p.norm || route_norm_supported(p), "moe_route: fused norm unsupported for these shapes");
  if (q.counter && !q.norm && !q.pf_experts && !q.gate_bf16 && q.x_bf16 && q.top_k <= 32 && q.H % 128 == 0 &&
      q.H / 128 <= kRoutePre) {
    RouteParams d = q;
    // MOESERVE_ROUTE_DIAG=1 (diagnostic build, timing only, wrong routing): skip the top-k
    // (pf_pairs is unused by this kernel otherwise: no expert prefetch here).
    static const int diag = debug_flags().route_diag ? 1 : 0;
    d.pf_pairs = diag;
    launch_pdl(route_decode_kernel, dim3(ceil_div(p.E, kDecWarps)), dim3(kDecWarps * 32), 0, s, d);
    CUDA_CHECK_LAUNCH();
    return;
  }
  launch_pdl(q.counter ? route_logits_kernel<true> : route_logits_kernel<false>, dim3(ceil_div(p.E, kRouteWarps), ceil_div(p.T, kRouteTok)), dim3(kRouteWarps * 32), 0,
             s, q);
  CUDA_CHECK_LAUNCH();
  if (!q.counter) {
    launch_pdl(route_kernel, dim3(p.T), dim3(32), 0, s, p);
    CUDA_CHECK_LAUNCH();
  }
}

void launch_moe_route_topk(const RouteParams& p, cudaStream_t s) {
  CU_REQUIRE(p.E <= kMaxExperts && p.top_k <= p.E && p.logits != nullptr, "moe_route_topk: bad arguments");
  if (p.T == 0) return;
  if (p.topk_warp && p.top_k <= 32 && p.E <= 256) {
    launch_pdl(p.topk_warp == 2 ? route_topk_warp_kernel<8, true> : route_topk_warp_kernel<8, false>,
               dim3(ceil_div(p.T, kTopkWarps)), dim3(kTopkWarps * 32), 0, s, p);
  } else {
    route_kernel<<<p.T, 32, 0, s>>>(p);
  }
  CUDA_CHECK_LAUNCH();
}

void launch_moe_align(const MoeAlignParams& p, cudaStream_t s) {
  CU_REQUIRE(p.num_local <= kMaxExperts, "moe_align: " + std::to_string(p.num_local) + " local experts unsupported");
  const int64_t P = int64_t(p.T) * p.top_k;
  // Chunks of >= 1024 pairs, at most 128 blocks.
  const int chunk = int(std::max<int64_t>(1024, (P + 127) / 128));
  const int nb = int((P + chunk - 1) / chunk);
  if (p.scratch && P >= kAlignMultiMinPairs && size_t(nb + 1) * p.num_local * 4 <= p.scratch_bytes) {
    launch_pdl(align_count_kernel, dim3(nb), dim3(1024), 0, s, p, chunk);
    CUDA_CHECK_LAUNCH();
    launch_pdl(align_scan_kernel, dim3(1), dim3(1024), 0, s, p, nb);
    CUDA_CHECK_LAUNCH();
    launch_pdl(align_scatter_kernel, dim3(nb), dim3(1024), 0, s, p, chunk, nb);
    CUDA_CHECK_LAUNCH();
    return;
  }
  launch_pdl(align_kernel, dim3(1), dim3(1024), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(const float* ypair, const int32_t* pair_pos, int T, int top_k, int H, void* out,
                        bool out_bf16, cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(combine_kernel, dim3(T), dim3(256), 0, s, ypair, pair_pos, top_k, H, out, out_bf16);
  CUDA_CHECK_LAUNCH();
}

void launch_moe_combine4(const void* ypair, bool ypair_bf16, const int32_t* pair_pos, int T, int top_k, int H,
                         void* out, bool out_bf16, cudaStream_t s) {
  CU_REQUIRE(H % 4 == 0 && reinterpret_cast<uintptr_t>(ypair) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
             "moe_combine4: H % 4 and 16-byte alignment");
  if (T == 0) return;
  const int threads = std::min(1024, std::max(32, (H / 4 + 31) / 32 * 32));
  launch_pdl(ypair_bf16 ? combine4_kernel<true> : combine4_kernel<false>, dim3(T), dim3(threads), 0, s, ypair, pair_pos,
             top_k, H, out, out_bf16);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kRouteTok == limits::kRouteTok && kRoutePre == limits::kRoutePre && kGemvTile == limits::kGemvTile && kGemmTileM == limits::kGemmTileM);
}  // namespace moeserve::cuda
