// Generic spec-driven kernels (kernels_generic.h): routing of any RoutingSpec, QK-norm of any
// mode with any RopeSpec, and silu(gate) * up. One block per token row; the math follows the
// CPU reference (backend/cpu/cpu_moe.cpp, cpu_attention.cpp) step by step.
#include <cfloat>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels_generic.h"

namespace moeserve::cuda {
namespace {

__device__ __forceinline__ float load_f(const void* p, bool is_bf16, int64_t i) {
  return is_bf16 ? bf2f(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_f(void* p, bool is_bf16, int64_t i, float v) {
  if (is_bf16)
    static_cast<bf16*>(p)[i] = f2bf(v);
  else
    static_cast<float*>(p)[i] = v;
}

// Block per token: logits by warps (one expert per warp at a time), then thread 0 scores,
// selects (grouped top-k when asked) and weights, as the CPU reference.
__global__ void route_generic_kernel(GenericRouteParams p) {
  extern __shared__ float sm[];
  float* s = sm;             // [E] scores
  float* choice = sm + p.E;  // [E]
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t xo = int64_t(t) * p.H;
  for (int e = warp; e < p.E; e += nw) {
    float acc = 0.f;
    for (int h = lane; h < p.H; h += 32)
      acc += load_f(p.x, p.x_bf16, xo + h) * load_f(p.gate, p.gate_bf16, int64_t(e) * p.H + h);
    acc = warp_sum(acc);
    if (lane == 0) s[e] = acc;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int E = p.E, K = p.top_k;
  if (p.spec.scoring == RouteScoring::Softmax) {
    float mx = -FLT_MAX;
    for (int i = 0; i < E; ++i) mx = fmaxf(mx, s[i]);
    double sum = 0;
    for (int i = 0; i < E; ++i) sum += double(s[i] = expf(s[i] - mx));
    for (int i = 0; i < E; ++i) s[i] = float(double(s[i]) / sum);
  } else {
    for (int i = 0; i < E; ++i) s[i] = 1.f / (1.f + expf(-s[i]));
  }
  for (int i = 0; i < E; ++i) choice[i] = s[i] + (p.bias ? p.bias[i] : 0.f);
  const int G = p.spec.n_group > 1 ? p.spec.n_group : 1;
  if (G > 1) {
    const int per = E / G, TG = p.spec.topk_group;
    unsigned long long keep = 0;  // bit g: group g competes (G <= 64)
    for (int r = 0; r < TG; ++r) {
      int best = -1;
      float bs = -FLT_MAX;
      for (int g = 0; g < G; ++g) {
        if (keep >> g & 1ull) continue;
        float b1 = -FLT_MAX, b2 = -FLT_MAX;
        for (int i = g * per; i < (g + 1) * per; ++i) {
          const float c = choice[i];
          if (c > b1) b2 = b1, b1 = c;
          else if (c > b2) b2 = c;
        }
        const float gs = p.bias && per >= 2 ? b1 + b2 : b1;
        if (best < 0 || gs > bs) best = g, bs = gs;
      }
      keep |= 1ull << best;
    }
    for (int i = 0; i < E; ++i)
      if (!(keep >> (i / per) & 1ull)) choice[i] = -INFINITY;
  }
  float sum = 0.f;
  int32_t* ids = p.ids + int64_t(t) * K;
  float* w = p.weights + int64_t(t) * K;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int i = 0; i < E; ++i) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= ids[j] == i;
      if (taken) continue;
      if (best < 0 || choice[i] > choice[best]) best = i;  // ties: lower id (strict >)
    }
    ids[k] = best;
    w[k] = s[best];
    sum += s[best];
  }
  const float div = p.spec.renormalize ? sum : 1.f;
  for (int k = 0; k < K; ++k) w[k] = w[k] / div * p.spec.routed_scaling_factor;
}

// Block per (token, q or k). The row is staged in shared memory as f32: norm (mode), then
// RoPE per head from the normed copy.
__global__ void qk_norm_rope_generic_kernel(GenericQkNormRopeParams p) {
  extern __shared__ float row[];  // [width]
  __shared__ float scratch[32];
  __shared__ float inv_s[512];    // per-head inverse RMS (PerHead), heads <= 512
  const int t = blockIdx.x;
  const bool is_q = blockIdx.y == 0;
  void* x = is_q ? p.q : p.k;
  const void* w = is_q ? p.q_w : p.k_w;
  const int W = is_q ? p.q_width : p.k_width, D = p.rope.head_dim;
  const int64_t base = int64_t(t) * W;
  for (int j = threadIdx.x; j < W; j += blockDim.x) row[j] = load_f(x, p.act_bf16, base + j);
  __syncthreads();
  if (p.norm == QkNormMode::FullWidth) {
    const float* pre = is_q ? p.q_sumsq : p.k_sumsq;
    float ss;
    double div;
    if (pre) {
      ss = pre[t];
      div = double(is_q ? p.q_full : p.k_full);
    } else {
      float a = 0.f;
      for (int j = threadIdx.x; j < W; j += blockDim.x) a += row[j] * row[j];
      ss = block_sum(a, scratch);
      div = double(W);
    }
    const float inv = rsqrtf(float(double(ss) / div) + p.eps);
    __syncthreads();
    for (int j = threadIdx.x; j < W; j += blockDim.x) row[j] = load_f(w, p.w_bf16, j) * (row[j] * inv);
  } else if (p.norm == QkNormMode::PerHead) {
    const int heads = W / D;
    for (int h = 0; h < heads; ++h) {
      float a = 0.f;
      for (int j = threadIdx.x; j < D; j += blockDim.x) a += row[h * D + j] * row[h * D + j];
      a = block_sum(a, scratch);
      if (threadIdx.x == 0) inv_s[h] = rsqrtf(a / float(D) + p.eps);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < W; j += blockDim.x) row[j] = load_f(w, p.w_bf16, j % D) * (row[j] * inv_s[j / D]);
  }
  __syncthreads();
  const int rd = p.rope.rotary_dim;
  const float pos = float(p.positions[t]);
  const float ms = p.rope.scaling == RopeScaling::Yarn ? p.rope.attention_factor : 1.f;
  for (int j = threadIdx.x; j < W; j += blockDim.x) {
    const int d = j % D;
    float v = row[j];
    if (d < rd) {
      int partner, f;
      float sign;
      rope_pair(p.rope.style, rd, d, &partner, &sign, &f);
      const float angle = pos * rope_inv_freq(p.rope, f);
      const float c = float(cos(double(angle))) * ms, sn = float(sin(double(angle))) * ms;
      v = row[j] * c + sign * row[j - d + partner] * sn;
    }
    store_f(x, p.act_bf16, base + j, v);
  }
}

__global__ void silu_mul_kernel(const void* g, const void* u, void* o, bool is_bf16, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = load_f(g, is_bf16, i), b = load_f(u, is_bf16, i);
    store_f(o, is_bf16, i, a / (1.f + expf(-a)) * b);
  }
}

}  // namespace

void launch_moe_route_generic(const GenericRouteParams& p, cudaStream_t s) {
  CU_REQUIRE(p.E <= kGenericRouteMaxExperts && p.top_k >= 1 && p.top_k <= p.E, "moe_route (generic): bad E / top_k");
  CU_REQUIRE(p.spec.n_group <= 1 || (p.spec.n_group <= 64 && p.E % p.spec.n_group == 0 &&
                                     p.spec.topk_group >= 1 && p.spec.topk_group <= p.spec.n_group),
             "moe_route (generic): bad n_group / topk_group");
  if (p.T == 0) return;
  route_generic_kernel<<<p.T, 256, size_t(2 * p.E) * sizeof(float), s>>>(p);
  CUDA_CHECK_LAUNCH();
}

void launch_qk_norm_rope_generic(const GenericQkNormRopeParams& p, cudaStream_t s) {
  CU_REQUIRE(p.rope.head_dim > 0 && p.q_width % p.rope.head_dim == 0 && p.k_width % p.rope.head_dim == 0 &&
                 p.q_width / p.rope.head_dim <= 512 && p.k_width / p.rope.head_dim <= 512,
             "qk_norm_rope (generic): bad widths");
  CU_REQUIRE(p.q && p.k && p.positions && (p.norm == QkNormMode::None || (p.q_w && p.k_w)),
             "qk_norm_rope (generic): null q / k / positions / norm weight");
  if (p.T == 0) return;
  const int W = p.q_width > p.k_width ? p.q_width : p.k_width;
  const size_t smem = size_t(W) * sizeof(float);
  if (smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(qk_norm_rope_generic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  qk_norm_rope_generic_kernel<<<dim3(p.T, 2), 256, smem, s>>>(p);
  CUDA_CHECK_LAUNCH();
}

void launch_silu_mul(const void* gate, const void* up, void* out, bool bf16, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int blocks = int((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
  silu_mul_kernel<<<blocks, 256, 0, s>>>(gate, up, out, bf16, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
