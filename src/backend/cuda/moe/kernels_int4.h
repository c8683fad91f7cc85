// Launchers of k_moe_int4.cu (kept out of kernels.h so the other kernels' objects do not depend on them).
#pragma once
#include "backend/cuda/common/kernels.h"

namespace moeserve::cuda {

// W4A16 MoE experts (k_moe_int4.cu): INT4 pack-quantized weights (ExpertPtrs w* = I32 [N, K/8],
// s* = BF16 [N, K/bi] scales cast to const float*; bi = group size, a multiple of 32, K % bi == 0),
// kSwiglu (bf16 out) or kDown (f32 out x row_scale) over an align tile table of kGemvTile rows
// (decode GEMV: moe_int4_decode_kernel) or kGemmTileM rows (prefill grouped GEMM:
// moe_int4_kernel). PDL-launched, capture-safe.
bool moe_int4_supported(const LinParams& p);
void launch_moe_int4(const LinParams& p, cudaStream_t s);

}  // namespace moeserve::cuda
