// Streaming expert GEMVs for MoE decode at very few tokens (k_moe_gemv.cu): the direct-pair
// gate/up (kSwiglu) and down (kDown + fused combine) of run_moe_direct on a grid of one
// block per SM that streams its share of the weights through a shared-memory ring
// (cp.async.bulk + mbarriers). Same LinParams fields and results as launch_gemv_tc's direct
// pair path (k_gemv_tc.cu), which stays the fallback.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace moeserve::cuda {

// Which expert-GEMV kernels run_moe_direct uses: 2 (default) the streaming kernels where
// moe_gemv_stream_supported, 1 k_gemv_tc.cu's direct-pair kernels. Read once from
// MOESERVE_MOE_GEMV_V; tests set it directly (A/B).
extern int g_moe_gemv_v;
// Kernels launched by launch_moe_gemv_stream (tests check the path ran).
extern uint64_t g_moe_gemv_stream_launches;

// p: a direct-pair LinParams (pair_ids set) of mode kSwiglu or kDown, as built by
// run_moe_direct. True where the streaming kernel takes it: sm_90+ code, FP8 128x128 block
// scales, K % 128 == 0, N % 16 (kSwiglu) / % 32 (kDown) == 0, bf16 x with ldx % 8 == 0.
bool moe_gemv_stream_supported(const LinParams& p);
void launch_moe_gemv_stream(const LinParams& p, cudaStream_t s);

}  // namespace moeserve::cuda
