// MoE glue kernels: the fused router (f32 gate GEMV, sigmoid, biased top-k, renormalise),
// the align step that groups (token, k) pairs by local expert and builds the tile table
// for the expert GEMV/GEMM kernels, and the ordered combine of per-pair outputs.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace moeserve::cuda {
namespace {

constexpr int kMaxExperts = 1024;

// One block per token: 8 warps compute the E router logits (f32 accumulation over H), then
// warp 0 picks top_k by (biased score desc, expert id asc).
__global__ void route_kernel(RouteParams p) {
  __shared__ float score[kMaxExperts];   // sigmoid(logit)
  __shared__ float choice[kMaxExperts];  // score + bias
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int e = warp; e < p.E; e += nw) {
    float acc = 0.f;
    for (int h = lane; h < p.H; h += 32) {
      const int64_t xi = int64_t(t) * p.H + h, wi = int64_t(e) * p.H + h;
      const float xv = p.x_bf16 ? bf2f(static_cast<const bf16*>(p.x)[xi]) : static_cast<const float*>(p.x)[xi];
      const float wv = p.gate_bf16 ? bf2f(static_cast<const bf16*>(p.gate)[wi]) : static_cast<const float*>(p.gate)[wi];
      acc = fmaf(xv, wv, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const float s = 1.f / (1.f + expf(-acc));
      score[e] = s;
      choice[e] = s + (p.bias ? p.bias[e] : 0.f);
    }
  }
  __syncthreads();
  if (warp != 0) return;
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
}

// Single block. Pass 1 counts pairs per local expert (the atomic's return value is the pair's
// rank within its expert), thread 0 scans counts into offsets and tiles, pass 2 scatters.
// The order of pairs inside one expert is not deterministic, but every pair's result is
// computed independently and combined in k order, so outputs are.
__global__ void align_kernel(MoeAlignParams p) {
  __shared__ int count[kMaxExperts];
  __shared__ int offset[kMaxExperts];
  const int P = p.T * p.top_k;
  for (int e = threadIdx.x; e < p.num_local; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int e = p.ids[i] - p.first_local;
    p.pair_pos[i] = (e >= 0 && e < p.num_local) ? atomicAdd(&count[e], 1) : -1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, tiles = 0;
    for (int e = 0; e < p.num_local; ++e) {
      offset[e] = off;
      for (int b = 0; b < count[e]; b += p.tile_rows) {
        p.tile_expert[tiles] = e;
        p.tile_begin[tiles] = off + b;
        p.tile_end[tiles] = off + min(count[e], b + p.tile_rows);
        ++tiles;
      }
      off += count[e];
    }
    *p.num_tiles = tiles;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int e = p.ids[i] - p.first_local;
    if (e >= 0 && e < p.num_local) {
      const int pos = offset[e] + p.pair_pos[i];
      p.pair_pos[i] = pos;
      p.sorted_token[pos] = i / p.top_k;
      p.sorted_weight[pos] = p.weights[i];
    }
  }
}

__global__ void combine_kernel(const float* ypair, const int32_t* pair_pos, int top_k, int H, void* out,
                               bool out_bf16) {
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

}  // namespace

void launch_moe_route(const RouteParams& p, cudaStream_t s) {
  CU_REQUIRE(p.E <= kMaxExperts && p.top_k <= p.E, "moe_route: " + std::to_string(p.E) + " experts, top_k " + std::to_string(p.top_k) + " unsupported");
  if (p.T == 0) return;
  route_kernel<<<p.T, 256, 0, s>>>(p);
  CUDA_CHECK_LAUNCH();
}

void launch_moe_align(const MoeAlignParams& p, cudaStream_t s) {
  CU_REQUIRE(p.num_local <= kMaxExperts, "moe_align: " + std::to_string(p.num_local) + " local experts unsupported");
  align_kernel<<<1, 1024, 0, s>>>(p);
  CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(const float* ypair, const int32_t* pair_pos, int T, int top_k, int H, void* out,
                        bool out_bf16, cudaStream_t s) {
  if (T == 0) return;
  combine_kernel<<<T, 256, 0, s>>>(ypair, pair_pos, top_k, H, out, out_bf16);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
