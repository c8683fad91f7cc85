// The MoE family's kernel selectors: the router (moe_route, add_rms_norm_route) and the routed
// experts (moe_experts: FP8, BF16 or INT4 W4A16 weights). Pure host code
// (common/select_common.h); cuda_moe.cpp and cuda_prefill.cpp launch what they name.
#pragma once
#include <string>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/linear/select_linear.h"

namespace moeserve::cuda {

struct MoeRouteOpDesc {
  int T = 0, H = 0, E = 0, top_k = 0;
  bool x_bf16 = true;
  bool gate_f32 = true;        // else bf16
  bool sigmoid_renorm = true;  // RoutingSpec::sigmoid_renorm(); else grouped or generic
  // The DeepSeek-V3 family's routing (k_route_grouped.cu): sigmoid scores, n_group / topk_group.
  bool sigmoid = true;
  int n_group = 1, topk_group = 1;
  bool x_aligned = true;  // x 16-byte (f32) / 8-byte (bf16) aligned
  // add_rms_norm_route: residual += x and out = rmsnorm(residual) requested with the router.
  bool with_norm = false;
  bool norm_ok = true;   // the norm's tensors BF16 on the device with matching shapes
  bool aligned = true;       // the norm's tensors (residual, x, weight, out) 16-byte aligned
  bool gate_aligned = true;  // the gate 16-byte aligned
  bool experts_fp8 = true;     // the experts' weights are FP8 (the norm may quantise for them)
  WorkspaceView ws;
};

struct MoeRouteKernel {
  enum Id : uint8_t {
    kGeneric,       // k_generic.cu: softmax / grouped / unnormalised routing
    kRouteNormDense,  // k_route_dense.cu: add + RMSNorm in every logits block, top-k in the last
    kRouteDecode,   // k_moe.cu route_decode_kernel: logits + top-k in one kernel (T <= 8)
    kLogitsLast,    // k_moe.cu route_logits_kernel, top-k in its last block (T <= 8)
    kLogitsTopk,    // k_moe.cu route_logits_kernel, then route_kernel
    kGemmSplit,     // cuBLASLt split-bf16 GEMM (gate hi/lo halves), then a top-k kernel
    kGemmF32,       // cuBLASLt f32 GEMM on an f32 copy of x, then a top-k kernel
    kGrouped,       // k_route_grouped.cu: sigmoid + bias, grouped top-k, scaling (DeepSeek-V3 family)
  };
  enum Topk : uint8_t { kTopkNone, kTopkRedux, kTopkShfl, kTopkGeneric };
  enum Norm : uint8_t { kNormNone, kNormFused, kNormQuant, kNormSeparate };
  Id id = kLogitsTopk;
  Topk topk = kTopkNone;  // after kGemmSplit / kGemmF32
  Norm norm = kNormNone;  // with_norm: inside the route kernel, the FP8 norm + quantisation, or rms_norm first
  bool one_token_tail = false;  // kRouteNormDense: last_block_tail_t1
  bool capture_fallback = false;
  // kGrouped: its logits by its own GEMV (kGrouped) or the prefill router GEMM (kGemmSplit / kGemmF32).
  Id grouped_logits = kGrouped;
  const char* name() const { return id_name(id); }
  static const char* id_name(Id id);
  std::string describe() const;
  bool operator==(Id o) const { return id == o; }
};

MoeRouteKernel select_moe_route(const MoeRouteOpDesc& d, const DeviceCaps& caps, const CudaTuning& t);

struct MoeExpertsOpDesc {
  int T = 0, top_k = 0, H = 0, I = 0, E_local = 0;
  bool fp8 = true;   // e4m3 with bo x bi block scales
  bool int4 = false;  // packed W4A16, bi = group size
  int bo = 128, bi = 128;
  bool prequant = false;  // x's FP8 form from add_rms_norm_route
  bool aligned = true;      // x 16-byte aligned (its FP8 quantisation's 16-byte loads)
  bool out_aligned = true;  // out 16-byte aligned (the 4-columns-per-thread combine)
  WorkspaceView ws;
};

struct MoeExpertsKernel {
  enum Id : uint8_t {
    kNone,         // T = 0
    kUnsupported,  // INT4 shapes the W4A16 kernels refuse (moe_experts throws)
    kDirect,       // no align: pair tiles on k_gemv_tc.cu, the combine in the down GEMV
    kGemv,         // align, GEMV tiles of <= 8 pairs (up / down: gemv_tc or gemv), combine
    kInt4Gemv,     // k_moe_int4.cu on 8-pair tiles
    kInt4Gemm,     // k_moe_int4.cu on 64-pair tiles
    kFp8Wide,      // FP8 activations, k_gemm_fp8_wgmma.cu 128 x 256 tiles
    kFp8,          // FP8 activations, 64-row tiles (up / down: fp8_wgmma or fp8_mma)
    kGemm,         // k_gemm.cu bf16 grouped GEMM
  };
  Id id = kGemm;
  int tile_rows = 0;  // the align's tile height
  LinearKernel::Id up = LinearKernel::kGemm, down = LinearKernel::kGemm;
  QuantKernel quant = QuantKernel::kNone;  // FP8 paths: x and the SiLU * up rows
  bool prequant = false;
  bool combine4 = true;  // the 4-columns-per-thread combine (else scalar)
  bool capture_fallback = false;
  const char* name() const { return id_name(id); }
  static const char* id_name(Id id);
  std::string describe() const;
  bool operator==(Id o) const { return id == o; }
};

MoeExpertsKernel select_moe_experts(const MoeExpertsOpDesc& d, const DeviceCaps& caps, const CudaTuning& t);
// The FP8 experts' quantisation workspaces fit for T tokens and P pairs (a capture cannot grow them).
bool fp8_experts_ws_fit(const WorkspaceView& ws, int T, int P, int H, int I);
// "" when moe_experts runs these INT4 experts (W4A16: group % 32, H and I multiples of the group).
std::string moe_int4_problem(int H, int I, int group);

}  // namespace moeserve::cuda
