// Router of the DeepSeek-V3 family (kernels_generic.h, launch_route_grouped_*): sigmoid scores,
// the e_score_correction_bias, grouped top-k (n_group / topk_group), renormalisation and
// routed_scaling_factor, as the CPU reference (backend/cpu/cpu_moe.cpp) selects. Two kernels:
//
// 1. Logits [T, E] = x [T, H] . gate [E, H]^T in f32 by a GEMV over many blocks: a block of 8
//    warps owns ROWS expert rows and a chunk of 8 tokens; every thread loads NV float4 of each
//    row (column stride 256 float4) BEFORE the PDL wait (the gate is a weight), so the whole
//    gate (11 MB f32 for Kimi-K2.5's 384 x 7168) streams over E / ROWS blocks while the
//    preceding norm finishes and is read once per 8 tokens. Products are accumulated per thread
//    in column order, then reduced warp by warp and over the 8 warps in a fixed order
//    (deterministic, batch-independent).
// 2. Selection, one warp per token (lane owns experts lane, lane + 32, ...; E <= 32 * kPer):
//    scores s = sigmoid(logit), choice c = s + bias (NaN ranks as -inf); with n_group > 1 the
//    group score is the sum of a group's two best choices (with a bias and >= 2 experts per
//    group, else the best), merged across lanes as top-2 multisets, and the topk_group best
//    groups are kept (ties: lower group id); the other experts' choices become -inf; then the
//    top_k experts by choice desc, id asc (two redux.sync per round: the largest ordered key,
//    then the lowest id holding it). Weights: s / sum (sum of the chosen s in k order, if
//    renormalised) * routed_scaling_factor, the CPU's operations in its order.
#include <cfloat>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/kernels_generic.h"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kTok = 8;
constexpr int kTopkWarps = 4;

template <int ROWS, int NV, bool XBF16>
__global__ void __launch_bounds__(kThreads) grouped_logits_kernel(GenericRouteParams p) {
  __shared__ float red[kWarps][ROWS * kTok];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int e0 = blockIdx.x * ROWS, t0 = blockIdx.y * kTok, H4 = p.H / 4;
  const float4* gate = static_cast<const float4*>(p.gate);
  float4 w[ROWS][NV];
  auto load_w = [&](int base) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = base + j * kThreads + tid, e = e0 + r;
        w[r][j] = c < H4 && e < p.E ? __ldg(gate + int64_t(e) * H4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
  };
  load_w(0);
  pdl_enter();
  const int nt = min(kTok, p.T - t0);
  float acc[ROWS][kTok];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[r][t] = 0.f;
  for (int base = 0; base < H4; base += NV * kThreads) {
    if (base > 0) load_w(base);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = base + j * kThreads + tid;
      if (c >= H4) break;
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t >= nt) break;
        float4 xv;
        if constexpr (XBF16) {
          const uint2 raw = __ldg(reinterpret_cast<const uint2*>(static_cast<const bf16*>(p.x) + int64_t(t0 + t) * p.H) + c);
          const float2 a = bf16x2_to_f2(raw.x), b = bf16x2_to_f2(raw.y);
          xv = make_float4(a.x, a.y, b.x, b.y);
        } else {
          xv = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + int64_t(t0 + t) * p.H) + c);
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
          acc[r][t] = fmaf(xv.w, w[r][j].w, fmaf(xv.z, w[r][j].z, fmaf(xv.y, w[r][j].y, fmaf(xv.x, w[r][j].x, acc[r][t]))));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0) red[warp][r * kTok + t] = v;
    }
  __syncthreads();
  if (tid < ROWS * kTok) {
    const int r = tid / kTok, t = tid % kTok;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) s += red[i][tid];
    if (t < nt && e0 + r < p.E) p.logits[int64_t(t0 + t) * p.E + e0 + r] = s;
  }
}

// Order-preserving image of a float (NaN as -inf); never 0 (0 = taken / no expert).
__device__ __forceinline__ uint32_t ordered_bits(float c) {
  if (c != c) c = -INFINITY;
  const uint32_t u = __float_as_uint(c);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float logit_at(const GenericRouteParams& p, int t, int e) {
  if (!p.logits_split) return __ldcg(p.logits + int64_t(t) * p.E + e);
  const float* row = p.logits + int64_t(t) * 2 * p.E;  // x . gate_hi + x . gate_lo
  return __ldcg(row + e) + __ldcg(row + p.E + e);
}

template <int kPer>
__global__ void __launch_bounds__(kTopkWarps * 32) grouped_topk_kernel(GenericRouteParams p) {
  const int lane = threadIdx.x & 31, t = blockIdx.x * kTopkWarps + (threadIdx.x >> 5);
  float bias[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    bias[i] = p.bias && e < p.E ? p.bias[e] : 0.f;  // a weight: read before the wait
  }
  pdl_enter();
  if (t >= p.T) return;
  const int E = p.E, K = p.top_k;
  float sc[kPer], ch[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    sc[i] = 0.f, ch[i] = -INFINITY;
    if (e < E) {
      sc[i] = 1.f / (1.f + expf(-logit_at(p, t, e)));
      const float c = sc[i] + bias[i];
      ch[i] = c == c ? c : -INFINITY;
    }
  }
  const int G = p.spec.n_group > 1 ? p.spec.n_group : 1;
  unsigned long long keep = ~0ull;  // bit g: group g competes
  int per = E;
  if (G > 1) {
    per = E / G;
    const bool two = p.bias && per >= 2;
    float gs_lo = -INFINITY, gs_hi = -INFINITY;  // group lane's / lane + 32's score
    for (int g = 0; g < G; ++g) {
      float b1 = -INFINITY, b2 = -INFINITY;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = i * 32 + lane;
        if (e < E && e / per == g) {
          const float c = ch[i];
          if (c > b1) b2 = b1, b1 = c;
          else if (c > b2) b2 = c;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {  // top-2 multiset of the two lanes' pairs
        const float o1 = __shfl_xor_sync(0xffffffffu, b1, o), o2 = __shfl_xor_sync(0xffffffffu, b2, o);
        const float n2 = fmaxf(fminf(b1, o1), fmaxf(b2, o2));
        b1 = fmaxf(b1, o1), b2 = n2;
      }
      const float gs = two ? b1 + b2 : b1;
      if (lane == (g & 31)) (g < 32 ? gs_lo : gs_hi) = gs;
    }
    keep = 0;
    for (int r = 0; r < p.spec.topk_group; ++r) {
      // key: (ordered score, 63 - group) of the groups still out; the largest wins (ties: lower id)
      uint64_t k = 0;
      if (lane < G && !(keep >> lane & 1ull)) k = (uint64_t(ordered_bits(gs_lo)) << 32) | uint32_t(63 - lane);
      if (lane + 32 < G && !(keep >> (lane + 32) & 1ull)) {
        const uint64_t k2 = (uint64_t(ordered_bits(gs_hi)) << 32) | uint32_t(63 - (lane + 32));
        k = k2 > k ? k2 : k;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const uint64_t ok = __shfl_xor_sync(0xffffffffu, k, o);
        k = ok > k ? ok : k;
      }
      keep |= 1ull << (63 - int(uint32_t(k)));
    }
  }
  uint32_t key[kPer];
  const uint32_t masked = ordered_bits(-INFINITY);  // a dropped group's experts: choice -inf
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    key[i] = e >= E ? 0u : (keep >> (e / per) & 1ull) ? ordered_bits(ch[i]) : masked;
  }
  int my_id = 0;
  float my_sc = 0.f, sum = 0.f;
  for (int j = 0; j < K; ++j) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) m = max(m, key[i]);
    const uint32_t M = __reduce_max_sync(0xffffffffu, m);
    uint32_t c = 0xffffffffu;  // this lane's lowest id holding M
#pragma unroll
    for (int i = kPer - 1; i >= 0; --i)
      if (key[i] == M) c = uint32_t(i * 32 + lane);
    const int e = int(__reduce_min_sync(0xffffffffu, c));  // top_k <= E: always an expert left
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
  if (lane < K) {
    const float div = p.spec.renormalize ? sum : 1.f;
    p.ids[int64_t(t) * K + lane] = my_id;
    p.weights[int64_t(t) * K + lane] = my_sc / div * p.spec.routed_scaling_factor;
  }
}

}  // namespace

static_assert(kRouteGroupedMaxExperts == limits::kRouteGroupedMaxExperts, "select_moe.cpp mirrors this limit");

// Mirrored by select_moe.cpp's route_grouped_ok (the selector picks kGrouped on the same shapes).
bool route_grouped_supported(const GenericRouteParams& p) {
  const int G = p.spec.n_group > 1 ? p.spec.n_group : 1;
  return p.spec.scoring == RouteScoring::Sigmoid && !p.gate_bf16 && p.E >= 1 && p.E <= kRouteGroupedMaxExperts &&
         p.top_k >= 1 && p.top_k <= 32 && p.top_k <= p.E && p.H % 4 == 0 && p.H > 0 && G <= 64 && p.E % G == 0 &&
         (G == 1 || (p.spec.topk_group >= 1 && p.spec.topk_group <= G && p.top_k <= p.spec.topk_group * (p.E / G))) &&
         reinterpret_cast<uintptr_t>(p.gate) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % (p.x_bf16 ? 8 : 16) == 0;
}

void launch_route_grouped_logits(const GenericRouteParams& p, cudaStream_t s) {
  CU_REQUIRE(route_grouped_supported(p) && p.logits, "route_grouped_logits: unsupported parameters");
  if (p.T == 0) return;
  const int ty = ceil_div(p.T, kTok);
  if (p.T <= kTok) {  // decode: E / 2 blocks, every row's first 8 x 256 float4 in flight
    auto k = p.x_bf16 ? grouped_logits_kernel<2, 8, true> : grouped_logits_kernel<2, 8, false>;
    launch_pdl(k, dim3(ceil_div(p.E, 2), ty), dim3(kThreads), 0, s, p);
  } else {  // larger batches: 4 rows per block (the activations are read E / 4 times)
    auto k = p.x_bf16 ? grouped_logits_kernel<4, 4, true> : grouped_logits_kernel<4, 4, false>;
    launch_pdl(k, dim3(ceil_div(p.E, 4), ty), dim3(kThreads), 0, s, p);
  }
  CUDA_CHECK_LAUNCH();
}

void launch_route_grouped_topk(const GenericRouteParams& p, cudaStream_t s) {
  CU_REQUIRE(route_grouped_supported(p) && p.logits && p.ids && p.weights, "route_grouped_topk: unsupported parameters");
  if (p.T == 0) return;
  const dim3 grid(ceil_div(p.T, kTopkWarps)), block(kTopkWarps * 32);
  if (p.E <= 256)
    launch_pdl(grouped_topk_kernel<8>, grid, block, 0, s, p);
  else
    launch_pdl(grouped_topk_kernel<12>, grid, block, 0, s, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
