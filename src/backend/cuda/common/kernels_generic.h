// Generic (spec-driven) CUDA kernels: every RoutingSpec, QK-norm mode and RoPE spec of
// backend/op_specs.h, for the architectures the fast MiniMax-M2 kernels do not cover. Correct
// first (one block per token, serial top-k); tests/cuda checks them against the CPU backend.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_specs.h"

namespace moeserve::cuda {

struct GenericRouteParams {
  const void* x = nullptr;  // [T, H] bf16 or f32
  bool x_bf16 = true;
  const void* gate = nullptr;  // [E, H] f32 or bf16
  bool gate_bf16 = false;
  const float* bias = nullptr;  // [E] or null
  int T = 0, H = 0, E = 0, top_k = 0;
  RoutingSpec spec;
  int32_t* ids = nullptr;  // [T, top_k]
  float* weights = nullptr;
  // launch_route_grouped_*: workspace [T, E] f32 (logits_split: [T, 2E], the split-bf16 router
  // GEMM's halves, expert e = row[e] + row[E + e]) between the logits and the selection.
  float* logits = nullptr;
  bool logits_split = false;
};
constexpr int kGenericRouteMaxExperts = 1024;
void launch_moe_route_generic(const GenericRouteParams& p, cudaStream_t s);

// The DeepSeek-V3 family's router (k_route_grouped.cu): sigmoid scoring (any bias, groups,
// renormalisation, scaling), f32 gate, E <= 384, top_k <= 32, H % 4 == 0, n_group <= 64.
// launch_route_grouped_logits: the logits GEMV over E / 2 (T <= 8) or E / 4 blocks per 8
// tokens; launch_route_grouped_topk: one warp per token, the CPU reference's selection. Both
// PDL-launched, no allocation (capture-safe).
constexpr int kRouteGroupedMaxExperts = 384;
bool route_grouped_supported(const GenericRouteParams& p);
void launch_route_grouped_logits(const GenericRouteParams& p, cudaStream_t s);
void launch_route_grouped_topk(const GenericRouteParams& p, cudaStream_t s);

struct GenericQkNormRopeParams {
  void* q = nullptr;  // [T, q_width], in place
  void* k = nullptr;  // [T, k_width]
  bool act_bf16 = true;
  const void* q_w = nullptr;  // FullWidth: [q_width]; PerHead: [head_dim]; None: null
  const void* k_w = nullptr;
  bool w_bf16 = true;
  const int32_t* positions = nullptr;
  int T = 0, q_width = 0, k_width = 0;
  QkNormMode norm = QkNormMode::FullWidth;
  RopeSpec rope;
  float eps = 1e-6f;
  const float* q_sumsq = nullptr;  // FullWidth under TP: pre-reduced sums [T], divisor q_full
  const float* k_sumsq = nullptr;
  int64_t q_full = 0, k_full = 0;
};
void launch_qk_norm_rope_generic(const GenericQkNormRopeParams& p, cudaStream_t s);

// out = silu(gate) * up, n elements, bf16 or f32 (all three the same dtype; out may alias gate).
void launch_silu_mul(const void* gate, const void* up, void* out, bool bf16, int64_t n, cudaStream_t s);

}  // namespace moeserve::cuda
