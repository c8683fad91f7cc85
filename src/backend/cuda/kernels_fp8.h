// Host launchers of the prefill path (k_quant.cu, k_gemm_fp8.cu, k_attn_prefill.cu): dynamic
// per-token, per-128-column FP8 quantisation of bf16 activations, and a grouped tensor-core
// GEMM that multiplies FP8 activations by FP8 128x128-block weights (mma.sync e4m3, sm_89+).
// Same conventions as kernels.h: asynchronous on `s`, no allocation, capture-safe.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace moeserve::cuda {

constexpr int kQuantGroup = 128;  // activation columns sharing one f32 scale
constexpr float kFp8Max = 448.f;  // largest finite e4m3

// q[r, k] = e4m3(x[r, k] / s[r, k / 128]) with s = max|x[r, group]| / 448 (1 for an all-zero
// group), so x ~= q * s. Scale (r, g) is stored at s[r * s_row + g * s_grp]: row-major
// [R, K/128] for the grouped GEMM (s_row = K/128, s_grp = 1), row-fastest [K/128, R] for
// cuBLASLt's VEC128_32F operand (s_row = 1, s_grp = R). K % 128 == 0.
struct QuantParams {
  const void* x = nullptr;  // bf16 [R, ldx]
  int ldx = 0;
  int R = 0, K = 0;
  uint8_t* q = nullptr;  // [R, K]
  float* s = nullptr;
  int64_t s_row = 0, s_grp = 0;
};
void launch_quant_fp8(const QuantParams& p, cudaStream_t s);
// true (MOESERVE_QUANT_BATCH=1): 4 groups per warp with their loads issued first; false
// (default): one group per warp. Same bytes either way.
extern bool g_quant_fp8_batch;

// out f32 [n] = bf16 in [n] (router input for the f32 GEMM).
void launch_bf16_to_f32(const void* in, float* out, int64_t n, cudaStream_t s);

// Grouped FP8 GEMM. Uses LinParams' geometry, tile table and output fields (mode, x_rows, M,
// w / experts, s, N, K, tiles, out, ldo, out_f32, row_scale); `p.x` is ignored: activations
// are xq [*, K] e4m3 with row-major scales xs [*, K/128] (row r of the problem reads row
// x_rows[r] of both). Requires bo == bi == 128, K % 128 == 0, N % 64 == 0 and sm_89+.
struct Fp8Act {
  const uint8_t* xq = nullptr;
  const float* xs = nullptr;
};
bool gemm_fp8_supported(const LinParams& p);
void launch_gemm_fp8(const LinParams& p, const Fp8Act& a, cudaStream_t s);
// Hopper variant (k_gemm_fp8_wgmma.cu): warp-specialised wgmma, same contract; needs an sm_90a
// build on a 9.0 device and N % 64 == 0. Tile tables of 64 rows (64 x 256-weight-row tiles) or
// of 128 rows (p.tile_rows == 128: 128 x 192 tiles). launch_gemm_fp8 takes it by itself where
// supported while g_fp8_gemm_wgmma is set (default; MOESERVE_FP8_WGMMA=0 clears it).
// g_fp8_wgmma_tile_m (64 or 128) picks the MoE tile height the align step builds for it.
constexpr int kFp8PairTileM = 128;
extern bool g_fp8_gemm_wgmma;
extern int g_fp8_wgmma_tile_m;
// 128-row tiles are 128 x 256 (two N halves per consumer) rather than 128 x 192; the MoE
// align builds 128-row tables when either g_fp8_wgmma_tile_m == 128 or this is set (default:
// set, tile_m 64: experts on 128 x 256, linears on 64 x 256; MOESERVE_FP8_WGMMA_TILE).
extern bool g_fp8_wgmma_wide;
inline int fp8_wgmma_moe_tile_rows() { return g_fp8_wgmma_tile_m == 128 || g_fp8_wgmma_wide ? 128 : 64; }
bool fp8_wgmma_available();
bool gemm_fp8_wgmma_supported(const LinParams& p);
void launch_gemm_fp8_wgmma(const LinParams& p, const Fp8Act& a, cudaStream_t s);

// Router top-k only (k_moe.cu), for logits [T, E] already in p.logits (the f32 GEMM path).
void launch_moe_route_topk(const RouteParams& p, cudaStream_t s);

// Pipelined tensor-core prefill attention (k_attn_prefill.cu): head_dim 128, >= 64 query
// tokens, no splits; same contract as launch_attention_tc.
bool attention_prefill_supported(const AttnParams& p);
void launch_attention_prefill(const AttnParams& p, cudaStream_t s);
// Hopper wgmma prefill attention (k_attn_wgmma.cu), same contract: head_dim 128, >= 64 query
// tokens, no splits. Available only on compute capability 9.x with the sm_90a code loaded
// (checked once, by reading back a per-architecture device constant; not capture-safe on the
// first call, which no decode step makes).
bool attention_wgmma_available();
bool attention_wgmma_supported(const AttnParams& p);
void launch_attention_wgmma(const AttnParams& p, cudaStream_t s);
// Variant of the wgmma kernel: true overlaps each tile's softmax with the previous tile's P V
// product inside a warpgroup; false (default, faster on the H200) runs S, softmax, P V in
// sequence per warpgroup.
extern bool g_attn_wgmma_overlap;
// Ping-pong order of the two warpgroups' products per tile (default true).
extern bool g_attn_wgmma_order;
// Opt-in: 3 K/V buffers with per-buffer mbarriers instead of the per-tile block barrier
// (sequential softmax; takes precedence over g_attn_wgmma_overlap).
extern bool g_attn_wgmma_mbar;
// Warp-specialised wgmma kernel (k_attn_ws.cu): a cp.async producer warpgroup, two consumer
// warpgroups. g_attn_ws (default true) makes launch_attention_wgmma run it instead of the
// two-warpgroup kernel above (whose variant flags then do not apply); its own variants:
// intra-warpgroup overlap of softmax and P V (g_attn_ws_overlap), ping-pong order of the
// consumers (g_attn_ws_pp), K/V ring depth (g_attn_ws_stages, 2 or 3), persistent grid of
// one block per SM walking the work items (g_attn_ws_persistent).
extern bool g_attn_ws;
extern bool g_attn_ws_overlap;
extern bool g_attn_ws_pp;
extern int g_attn_ws_stages;
extern bool g_attn_ws_persistent;
// K/V loader for block sizes 16 .. 128 that reads each block id once per tile for K and V
// (default true; false: the generic loader, one table read per key per K and per V tile).
extern bool g_attn_ws_page_loader;
// With the page loader: groups of 16 keys inside the causal range come by TMA (one 64 x 16
// box per 64-dim half, tensor maps over the cache), the causal edge by cp.async (default false:
// measured slower than cp.async alone).
extern bool g_attn_ws_tma;
void launch_attention_ws(const AttnParams& p, cudaStream_t s);

}  // namespace moeserve::cuda
