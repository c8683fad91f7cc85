// The decode routers' top-k (route_decode_kernel in k_moe.cu, route_norm_decode_kernel in
// k_route_dense.cu): run by the grid's last block after the threadfence handoff.
#pragma once
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace moeserve::cuda {

// Top-k of tokens 0..T-1 from p.logits [T, E] (written by other blocks: read with __ldcg), by
// the whole block (every thread calls it): thread x ranks expert x by counting the experts
// ahead of it (biased score desc, id asc: the order route_token uses), so the k winners are
// known after one pass over E in shared memory instead of k serial argmax rounds. Writes
// p.ids / p.weights (unbiased scores renormalised over the k). Shared arrays: score and
// choice hold E rounded up to 4 floats (choice 16-byte aligned), sel 32 ints; top_k <= 32.
__device__ inline void block_rank_topk(const RouteParams& p, int T, float* score, float* choice, int* sel) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int E4 = (p.E + 3) / 4 * 4;
  for (int t = 0; t < T; ++t) {
    for (int x = tid; x < E4; x += blockDim.x) {
      if (x < p.E) {
        const float sc = 1.f / (1.f + expf(-__ldcg(p.logits + int64_t(t) * p.E + x)));
        const float c = sc + (p.bias ? p.bias[x] : 0.f);
        score[x] = sc;
        choice[x] = c == c ? c : -INFINITY;  // NaN ranks last
      } else {
        choice[x] = -INFINITY;  // padding: behind every real expert (ties: higher id)
      }
    }
    if (tid < 32) sel[tid] = 0;
    __syncthreads();
    for (int x = tid; x < p.E; x += blockDim.x) {
      const float c = choice[x];
      int rank = 0;
      for (int j = 0; j < E4; j += 4) {
        const float4 o = *reinterpret_cast<const float4*>(&choice[j]);
        rank += (o.x > c || (o.x == c && j < x)) + (o.y > c || (o.y == c && j + 1 < x)) +
                (o.z > c || (o.z == c && j + 2 < x)) + (o.w > c || (o.w == c && j + 3 < x));
      }
      if (rank < p.top_k) sel[rank] = x;
    }
    __syncthreads();
    if (warp == 0) {
      const int id = lane < p.top_k ? sel[lane] : 0;
      const float sc = lane < p.top_k ? score[id] : 0.f;
      const float sum = warp_sum(sc);
      if (lane < p.top_k) {
        p.ids[t * p.top_k + lane] = id;
        p.weights[t * p.top_k + lane] = sc * (sum > 0.f ? 1.f / sum : 0.f);
      }
    }
    __syncthreads();  // score / choice / sel reused by the next token
  }
}

// The one-token top-k of the last block (route_norm_decode_kernel's fast tail, the o_proj GEMV's
// fused router tail in k_gemv_tc.cu): thread x holds expert x's logit (x < p.E <= kW * 32) and
// its correction bias. Each warp takes its k best (biased sigmoid score desc, id asc; NaN
// last: k rounds of a shuffle argmax, the winner's lane drops out), warp 0 picks the k best of
// those kW x k candidates the same way and writes p.ids / p.weights (unbiased scores
// renormalised over the k, summed in rank order): the same ids and weights as block_rank_topk.
// Every thread of the block calls it; top_k <= 8. score: E floats, cand: 8 x 8, sel: 8 ints.
template <int kW>
__device__ __forceinline__ void rank_topk_t1(const RouteParams& p, float logit, float bias_x, float* score,
                                             float2* cand, int* sel) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, k = p.top_k;
  // Scores as block_rank_topk forms them.
  float v = -INFINITY;
  if (tid < p.E) {
    const float sc = 1.f / (1.f + expf(-logit));
    const float c = sc + (p.bias ? bias_x : 0.f);
    score[tid] = sc;
    v = c == c ? c : -INFINITY;  // NaN ranks last
  }
  // (value, id) argmax over a warp: larger value, then smaller id.
  auto warp_best = [&](float bv, int bi, float& ov, int& oi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
      if (v2 > bv || (v2 == bv && i2 < bi)) bv = v2, bi = i2;
    }
    ov = bv, oi = bi;
  };
  int my_id = tid;  // tid >= E: padding, behind every expert (as in block_rank_topk)
  for (int r = 0; r < k; ++r) {
    float bv;
    int bi;
    warp_best(v, my_id, bv, bi);
    if (lane == 0) cand[warp * 8 + r] = make_float2(bv, __int_as_float(bi));
    if (bi == my_id) v = -INFINITY, my_id = 1 << 30;  // taken: behind everything
  }
  __syncthreads();
  if (warp != 0) return;
  // Warp 0: the k best of the kW x k candidates (two per lane).
  float cv[2];
  int ci[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int w = (lane + 32 * h) / 8, r = (lane + 32 * h) % 8;
    const bool ok = w < kW && r < k;
    const float2 c = ok ? cand[w * 8 + r] : make_float2(-INFINITY, __int_as_float(1 << 30));
    cv[h] = c.x, ci[h] = __float_as_int(c.y);
  }
  for (int r = 0; r < k; ++r) {
    const int h = (cv[1] > cv[0] || (cv[1] == cv[0] && ci[1] < ci[0])) ? 1 : 0;
    float bv;
    int bi;
    warp_best(cv[h], ci[h], bv, bi);
    if (lane == 0) sel[r] = bi;
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (ci[j] == bi) cv[j] = -INFINITY, ci[j] = 1 << 30;
  }
  __syncwarp();
  const int id = lane < k ? sel[lane] : 0;
  const float sc = lane < k ? score[id] : 0.f;
  const float sum = warp_sum(sc);
  if (lane < k) {
    p.ids[lane] = id;
    p.weights[lane] = sc * (sum > 0.f ? 1.f / sum : 0.f);
  }
}

}  // namespace moeserve::cuda
