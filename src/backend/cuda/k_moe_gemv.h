// Streaming expert GEMVs for MoE decode at few tokens (k_moe_gemv.cu): gate/up (kSwiglu) and
// down (kDown) on a grid of one block per SM that streams its share of the weights through a
// shared-memory ring (cp.async.bulk + mbarriers). Used by run_moe_direct (direct pairs, fused
// combine) and by moe_experts' GEMV branch up to kMoeStreamTileMaxTokens tokens (align tile
// table); same LinParams fields and results as the tensor-core GEMV (k_gemv_tc.cu), which
// stays the fallback.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace moeserve::cuda {

// Which expert-GEMV kernels moe_experts uses at decode: 1 k_gemv_tc.cu (launch_gemv /
// launch_gemv_tc), 2 the streaming kernels for the direct pairs (run_moe_direct, batch 1), 3
// also for the align tile table up to kMoeStreamTileMaxTokens tokens. Read once from
// MOESERVE_MOE_GEMV_V (default below); tests set it directly (A/B).
extern int g_moe_gemv_v;
// moe_experts' tile-table (align) path uses the streaming kernels up to this many tokens
// (gate/up stages every token's x row in shared memory).
constexpr int kMoeStreamTileMaxTokens = 8;
// e4m3 -> f16 in the streaming kernels: 0 cvt instruction, 1 integer ops, 2 half each
// (MOESERVE_MOE_GEMV_CVT; A/B, tests cover all three).
extern int g_moe_gemv_cvt;
// Kernels launched by launch_moe_gemv_stream (tests check the path ran).
extern uint64_t g_moe_gemv_stream_launches;

// p: a MoE gate/up (kSwiglu) or down (kDown, f32 pair rows) LinParams as moe_experts builds
// it, either direct pairs (pair_ids; kDown may fuse the combine) or a tile table of <= 8 rows
// per tile (tile_expert ..., max_tiles). x_rows_total: the rows of x when x_rows is set (the
// tokens; every one is staged in shared memory, so keep it small). True where the streaming
// kernel takes it: sm_90+ code, FP8 128x128 block scales, K % 128 == 0, N % 8 (kSwiglu) /
// % 16 (kDown) == 0, bf16 x with ldx % 8 == 0, and the staged x rows fit in shared memory.
// Direct kDown with combine_out uses counters[token * N / 16 + row group] (zero; reset).
bool moe_gemv_stream_supported(const LinParams& p, int x_rows_total = 0);
void launch_moe_gemv_stream(const LinParams& p, cudaStream_t s, int x_rows_total = 0);

}  // namespace moeserve::cuda
