// Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2) kernels of the CUDA backend
// (k_mla.cu), launched by cuda_attention.cpp. Shapes (T tokens, H local heads, C =
// kv_lora_rank, R = qk_rope_head_dim, L = C + R, N = qk_nope_head_dim, V = v_head_dim):
//   q       [T, H * (N + R)] bf16: per head [q_nope | q_rope]
//   latent  [T, L] bf16: kv_a_proj_with_mqa's output [c | k_rope]
//   cache   [blocks, block_size, 1, L] bf16, or e4m3 with one per-tensor k_scale
//   kv_b    [H * (N + V), C] bf16, or e4m3 with 128x128-style block scales (scale_inv)
//   out     [T, H * V] bf16
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_specs.h"

namespace moeserve::cuda {

struct MlaRopeKvParams {
  void* q = nullptr;
  void* latent = nullptr;
  const void* norm_w = nullptr;  // kv_a_layernorm [C], bf16 or f32
  bool norm_w_bf16 = true;
  float eps = 1e-6f;
  const int32_t* positions = nullptr;     // [T]
  const int32_t* slot_mapping = nullptr;  // [T]; < 0: padding, not written
  void* cache = nullptr;
  bool cache_fp8 = false;
  float k_scale = 1.f;
  RopeSpec rope;  // rotary_dim == R
  int T = 0, H = 0, N = 0, R = 0, C = 0;
};

struct MlaAttnParams {
  const void* q = nullptr;  // already rotated (MlaRopeKvParams ran first)
  const void* cache = nullptr;
  bool cache_fp8 = false;
  float k_scale = 1.f;
  const void* kv_b = nullptr;
  bool kv_b_fp8 = false;
  const float* kv_b_scale_inv = nullptr;  // [ceil(rows / block_out), scale_cols]
  int block_out = 0, block_in = 0, scale_cols = 0;
  const int32_t* positions = nullptr;     // [T]: token t reads positions 0..positions[t]
  const int32_t* query_start = nullptr;   // [S + 1]
  const int32_t* block_tables = nullptr;  // [S, max_blocks_per_seq]
  int num_seqs = 0, max_blocks_per_seq = 0, block_size = 0;
  float scale = 1.f;  // softmax scale
  void* out = nullptr;
  int T = 0, H = 0, N = 0, R = 0, C = 0, V = 0;
};

// In place: RMSNorm of latent[:, :C] (kv_a_layernorm), RoPE of latent[:, C:] and of every
// head's q_rope (YaRN's attention factor on cos/sin); then each token's latent row to its slot.
void launch_mla_rope_write_kv(const MlaRopeKvParams& p, cudaStream_t s);
// Absorbed attention over the latent cache, one block per (head, token):
// q_lat = W_kb(h)^T q_nope (W_kb(h) = kv_b rows [h(N+V), h(N+V)+N)), scores = scale (q_lat . c_j
// + q_rope . k_rope_j) for j <= position, online softmax in f32, o = sum_j p_j c_j,
// out = W_vb(h) o (rows [h(N+V)+N, (h+1)(N+V))). Needs C <= 2048, R <= 128.
void launch_mla_attention(const MlaAttnParams& p, cudaStream_t s);

}  // namespace moeserve::cuda
