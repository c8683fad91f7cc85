// Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2) kernels of the CUDA backend
// (k_mla.cu: norm / RoPE / cache write and the per-head absorption GEMMs; k_mla_flash.cu:
// attention over the latent cache), launched by cuda_attention.cpp. Shapes (T tokens, H local
// heads, C = kv_lora_rank, R = qk_rope_head_dim, L = C + R, N = qk_nope_head_dim, V = v_head_dim):
//   q       [T, H * (N + R)] bf16: per head [q_nope | q_rope]
//   latent  [T, L] bf16: kv_a_proj_with_mqa's output [c | k_rope]
//   cache   [blocks, block_size, 1, L] bf16, or e4m3 with one per-tensor k_scale
//   kv_b    [H * (N + V), C] bf16, or e4m3 with 128x128-style block scales (scale_inv)
//   out     [T, H * V] bf16
// Attention runs in the absorbed form for every step shape (decode, 1 + k verify rows, prefill
// chunks):  q_abs [T, H, L] = scale * [W_kb(h)^T q_nope | q_rope]  (mla_proj, kQAbsorb)
//           o_lat [T, H, C] = softmax(q_abs . cache_j) . c_j      (mla_flash (+ combine))
//           out   [T, H, V] = W_vb(h) o_lat                         (mla_proj, kVOut)
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

// The per-head projections around the latent attention, as batched tensor-core GEMMs
// (mma.sync bf16, f32 accumulation; FP8 kv_b dequantised with its block scale when staged):
//   kQAbsorb: q_abs[t, h, :C] = alpha W_kb(h)^T q_nope[t, h]   (K = N, n < C; B(k, n) = kv_b[h(N+V) + k, n])
//             q_abs[t, h, C:] = alpha q_rope[t, h]
//   kVOut:    out[t, h, :V]   = W_vb(h) o_lat[t, h]            (K = C, n < V; B(k, n) = kv_b[h(N+V) + N + n, k])
// over tokens [t0, t0 + T) of q / out; q_abs and o_lat hold only those tokens.
enum class MlaProj { kQAbsorb, kVOut };
struct MlaProjParams {
  MlaProj mode = MlaProj::kQAbsorb;
  const void* q = nullptr;  // [*, H * (N + R)] (kQAbsorb)
  void* q_abs = nullptr;    // [T, H, L] bf16 (kQAbsorb)
  const void* o_lat = nullptr;  // [T, H, C] bf16 (kVOut)
  void* out = nullptr;          // [*, H * V] (kVOut)
  const void* kv_b = nullptr;
  bool kv_b_fp8 = false;
  const float* kv_b_scale_inv = nullptr;  // [ceil(rows / block_out), scale_cols]
  int block_out = 0, block_in = 0, scale_cols = 0;
  float alpha = 1.f;
  // kVOut: tokens at or past query_start[num_seqs] (a graph bucket's padding) get zeros.
  const int32_t* query_start = nullptr;
  int num_seqs = 0;
  int t0 = 0, T = 0, H = 0, N = 0, R = 0, C = 0, V = 0;
};

// Flash attention over the latent cache (FlashMLA-style). A CTA owns a tile of 64 rows of one
// sequence (row = (query token, head), heads fastest: decode's 64 heads are one tile, 1 + k
// verify rows or a prefill chunk of H < 64 heads pack several tokens) and one KV split; it
// streams the sequence's latent pages through the block table once for all its rows: S = Q K^T
// over L dims and O += P C over the C latent dims on tensor cores, online softmax in base 2.
// Causal per row (key j <= the row token's position). Rows of queries [t_lo, t_hi) only.
struct MlaFlashParams {
  const void* q_abs = nullptr;  // [t_hi - t_lo, H, L] bf16 (scale folded in)
  const void* cache = nullptr;
  bool cache_fp8 = false;
  float k_scale = 1.f;
  const int32_t* positions = nullptr;     // [T]
  const int32_t* query_start = nullptr;   // [S + 1]
  const int32_t* block_tables = nullptr;  // [S, max_blocks_per_seq]
  int num_seqs = 0, max_blocks_per_seq = 0, block_size = 0;
  int t_lo = 0, t_hi = 0;
  int row_tiles = 0;  // per sequence (grid.y)
  int splits = 1;     // grid.x; > 1: partials to part_o / part_ml, merged by the combine kernel
  void* o_lat = nullptr;    // [t_hi - t_lo, H, C] bf16 (splits == 1)
  float* part_o = nullptr;  // [splits, rows, C] f32, normalised per split
  float* part_ml = nullptr; // [splits, rows, 2]: max (base 2), sum
  int H = 0, R = 0, C = 0;
};

// In place: RMSNorm of latent[:, :C] (kv_a_layernorm), RoPE of latent[:, C:] and of every
// head's q_rope (YaRN's attention factor on cos/sin); then each token's latent row to its slot.
void launch_mla_rope_write_kv(const MlaRopeKvParams& p, cudaStream_t s);
void launch_mla_proj(const MlaProjParams& p, cudaStream_t s);
// The flash kernel and, for splits > 1, the combine (rows whose sequence has no query in
// [t_lo, t_hi) are not written: a graph bucket's padding rows, zeroed by kVOut's row guard).
// Needs C <= 512, R <= 64 (every MLA checkpoint has 512 / 64).
void launch_mla_flash(const MlaFlashParams& p, cudaStream_t s);
constexpr int kMlaRowTile = 64;
constexpr int kMlaMaxC = 512, kMlaMaxR = 64;

}  // namespace moeserve::cuda
