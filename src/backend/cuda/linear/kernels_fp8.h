// Host launchers of the prefill path (k_quant.cu, k_gemm_fp8.cu, k_attn_prefill.cu): dynamic
// per-token, per-128-column FP8 quantisation of bf16 activations, and a grouped tensor-core
// GEMM that multiplies FP8 activations by FP8 128x128-block weights (mma.sync e4m3, sm_89+).
// Same conventions as kernels.h: asynchronous on `s`, no allocation, capture-safe.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/kernels.h"

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
// build on a 9.0 device and N % 64 == 0. Tile tables of 64 rows and plain row ranges on 64 x
// 256-weight-row tiles, tables of 128 rows (p.tile_rows == kFp8PairTileM, what the MoE align
// builds for the FP8 prefill experts) on 128 x 256 tiles (two N halves per consumer).
// launch_gemm_fp8 takes it where supported while p.fp8_wgmma is set (the backend sets it from
// select_fp8_gemm; MOESERVE_PREFILL_OFF=gemm_wgmma clears CudaTuning::fp8_gemm_wgmma).
constexpr int kFp8PairTileM = 128;
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
// Warp-specialised wgmma kernel (k_attn_ws.cu), what launch_attention_wgmma runs: a
// cp.async producer warpgroup, two consumer warpgroups (intra-warpgroup overlap of softmax and
// P V, ping-pong order of the consumers, a 2-deep K/V ring, a persistent grid of one block per
// SM walking the work items, the K/V page loader for block sizes 16 .. 128).
void launch_attention_ws(const AttnParams& p, cudaStream_t s);
}  // namespace moeserve::cuda
