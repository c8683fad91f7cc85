// Shared pieces of the kernel selectors (one per op family: attention/, linear/, moe/,
// norm_rope/, sampling/ select_*.h): what the workspaces hold (a capture cannot grow them) and
// the kernels' shape limits. Pure host code: no CUDA header, no device query.
//
// Every selector is a pure function select_<family>(const <Family>OpDesc&, const DeviceCaps&,
// const CudaTuning&) -> <Family>Kernel. The op description holds exactly what dispatch decides
// on; CudaBackend fills it from the op's tensors, calls the selector and launches what it
// names; `supports_*` and `bench-model --explain-dispatch` call the same function.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>

#include "backend/cuda/common/tuning.h"

namespace moeserve::cuda {

// Bytes available per workspace slot. Outside a capture every slot grows on demand (SIZE_MAX);
// inside one the op must fit what is there, or take its previous kernel (counted by
// CudaBackend::graph_fallbacks() where the selector sets capture_fallback).
struct WorkspaceView {
  static constexpr size_t kAny = std::numeric_limits<size_t>::max();
  bool capturing = false;
  size_t quant_x = kAny, quant_act = kAny, lt = kAny, router = kAny, router_x = kAny, attn_part = kAny;
  bool lt_handle = true;  // the cuBLASLt handle exists (or can be made: not capturing)
  // A prefill path may run now: eagerly, or in a capture when prefill_paths_in_graphs.
  bool prefill_allowed(const CudaTuning& t) const { return !capturing || t.prefill_paths_in_graphs; }
};

// Kernel limits the selectors check; the kernels' own constants are static_asserted equal to
// these in their .cu files.
namespace limits {
constexpr int kQuantGroup = 128;          // activation columns per FP8 scale (kernels_fp8.h)
constexpr size_t kLtWorkspace = size_t(32) << 20;  // LtGemm::kWorkspaceBytes
constexpr int kMaxSegs = 4;               // LinParams::kMaxSegs
constexpr int kGemvTile = 8, kGemmTileM = 64, kFp8PairTileM = 128;
constexpr int kDenseMaxTokens = 8, kDenseMaxK = 8192, kDenseNormMaxK = 4096, kDenseWarps = 4;
constexpr size_t kDenseSmemMax = 112 * 1024;
constexpr int kQuantVecMaxK = 8 * 256 * 4, kNormQuantMaxK = 8 * 256 * 2;
constexpr int kRouteTok = 8, kRoutePre = 24;                            // k_moe.cu
constexpr int kRouteDenseTok = 4, kRouteDenseMaxH = 4096, kRouteDenseMaxE = 1024;  // k_route_dense.cu
constexpr int kRouteGroupedMaxExperts = 384;  // k_route_grouped.cu
constexpr int kMoeCounterSlots = 1 << 15;  // CudaBackend's fused-combine counters
constexpr int kAttnGenericRows = 16;       // k_attention.cu rows per block (query tile)
constexpr int kAttnVerifyMaxRows = 32, kAttnVerifyChunk = 16;  // k_attn_verify.cu
constexpr int kAttnTcQuery = 64;           // k_attn_tc.cu / k_attn_prefill.cu query tile (D = 128)
constexpr int kAttnWgmmaRows = 64;         // attn_wgmma.cuh
constexpr int kDecodeRows = 8, kDecode1MaxSplits = 8, kDecode2MaxSplits = 16, kDecode2Chunk = 16,
              kDecode2Warps = 8, kDecode2MaxQWidth = 64 * 128;
constexpr int kMlaRowTile = 64, kMlaMaxC = 512, kMlaMaxR = 64;
constexpr int kQkRopeVecMinTokens = 512;   // kernels_prefill.h
constexpr int kSampleChunk = 4096, kSampleRowsPerLaunch = 256;
}  // namespace limits

inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
inline int ceil_div_i(int64_t a, int64_t b) { return int((a + b - 1) / b); }

}  // namespace moeserve::cuda
