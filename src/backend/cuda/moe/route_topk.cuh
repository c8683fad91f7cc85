// The decode routers' top-k (route_decode_kernel in k_moe.cu, route_norm_decode_kernel in
// k_route_dense.cu): run by the grid's last block after the threadfence handoff.
#pragma once
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"

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

}  // namespace moeserve::cuda
