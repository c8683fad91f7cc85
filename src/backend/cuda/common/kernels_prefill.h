// Host launchers of the small prefill ops (k_moe.cu, k_norm_quant.cu): the split-bf16 router
// GEMM's gate split and warp top-k switch, and add + RMSNorm fused with the FP8 activation
// quantisation of the q/k/v projections. Same conventions as kernels.h: asynchronous on `s`,
// no allocation, capture-safe.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/kernels.h"

namespace moeserve::cuda {

// gate [E, H] f32 -> out [2E, H] bf16: rows [0, E) = bf16(gate), rows [E, 2E) = bf16(gate -
// bf16(gate)). x [T, H] bf16 @ out^T (f32 accumulation) gives logits [T, 2E] whose halves sum
// to the f32 logits within ~2^-17 sum |x w| (RouteParams::logits_split reads them).
void launch_split_gate_bf16(const float* gate, void* out, int E, int H, cudaStream_t s);
// launch_moe_route_topk: the top-k kernel named by p.topk_warp (kernels.h).

// The warp-specialised prefill attention kernel's FP8-output operand (k_attn_ws.cu). Its
// FP8 epilogue (o_proj's input written by the attention) measured slower and is not built;
// the kernel keeps the operand, always empty.
struct AttnQ8Out {
  uint8_t* q = nullptr;
  float* s_tok = nullptr;
  float* s_row = nullptr;
};

// Fused (add +) RMSNorm + FP8 quantisation of bf16 rows [R, K] (K % 128 == 0, K <= 4096):
// residual != null: residual += x (stored bf16), v = residual; else v = x. out = bf16(rmsnorm(v)
// * w) (stored when out != null), q / s = the e4m3 quantisation of out per (row, 128 columns)
// exactly as launch_quant_fp8 computes it from the stored out (same bits), scale (r, g) at
// s[r * s_row + g * s_grp]. Bit-identical to launch_rms_norm followed by launch_quant_fp8.
struct NormQuantParams {
  const void* x = nullptr;   // bf16 [R, K]
  void* residual = nullptr;  // bf16 [R, K] or null
  const void* w = nullptr;   // bf16 [K]
  void* out = nullptr;       // bf16 [R, K] or null
  uint8_t* q = nullptr;      // e4m3 [R, K]
  float* s = nullptr;
  int64_t s_row = 0, s_grp = 0;
  int R = 0, K = 0;
  float eps = 1e-6f;
};
bool norm_quant_supported(const NormQuantParams& p);
// launch_quant_fp8 (kernels_fp8.h) with 16-byte loads, a block per row (K <= 8192, ldx % 8 ==
// 0, x 16-byte aligned): same bits. Used by the dense prefill linears (cuda_prefill.cpp).
struct QuantParams;
bool quant_vec_supported(const QuantParams& p);
void launch_quant_fp8_vec(const QuantParams& p, cudaStream_t s);
void launch_norm_quant_fp8(const NormQuantParams& p, cudaStream_t s);

// Vectorised QK-norm + NeoX RoPE (+ KV write) for many tokens (k_rope_prefill.cu): same
// contract as launch_qk_norm_rope, which takes it for p.T >= kQkRopeVecMinTokens (decode
// batches stay on the generic / cluster kernel) where supported: bf16 activations, weights
// and cache, head_dim / 8 a power of two <= 32, rotary_dim / 16 a power of two, q width <=
// 8192, k width <= 2048, 16-byte aligned rows. p.rope_vec off: never
// (CudaTuning::qk_rope_vec, MOESERVE_PREFILL_OFF=qk_rope).
constexpr int kQkRopeVecMinTokens = 512;
bool qk_rope_vec_supported(const QkNormRopeParams& p);
void launch_qk_rope_vec(const QkNormRopeParams& p, cudaStream_t s);

}  // namespace moeserve::cuda
