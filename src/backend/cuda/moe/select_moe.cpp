// select_moe_route / select_moe_experts: the kernel choices of the MoE ops.
#include "backend/cuda/moe/select_moe.h"

#include <algorithm>

#include <fmt/format.h>

namespace moeserve::cuda {

const char* MoeRouteKernel::id_name(Id id) {
  switch (id) {
    case kGeneric: return "route_generic";
    case kRouteNormDense: return "route_norm_dense";
    case kRouteDecode: return "route_decode";
    case kLogitsLast: return "route_logits_last_block";
    case kLogitsTopk: return "route_logits+route_topk";
    case kGemmSplit: return "lt_split_bf16";
    case kGemmF32: return "lt_f32";
    case kGrouped: return "route_grouped";
  }
  return "?";
}

std::string MoeRouteKernel::describe() const {
  std::string s;
  if (norm == kNormQuant) s = "norm_quant+";
  else if (norm == kNormSeparate) s = "rms_norm+";
  if (id == kGrouped && grouped_logits != kGrouped) s += std::string(id_name(grouped_logits)) + "+";
  s += name();
  if (id == kRouteNormDense && one_token_tail) s += "[t1_tail]";
  if (topk == kTopkRedux) s += "+topk_warp_redux";
  else if (topk == kTopkShfl) s += "+topk_warp_shfl";
  else if (topk == kTopkGeneric) s += "+topk_generic";
  if (capture_fallback) s += "[capture_fallback]";
  return s;
}

const char* MoeExpertsKernel::id_name(Id id) {
  switch (id) {
    case kNone: return "none";
    case kUnsupported: return "unsupported";
    case kDirect: return "direct_gemv_tc";
    case kGemv: return "gemv";
    case kInt4Gemv: return "int4_gemv";
    case kInt4Gemm: return "int4_gemm";
    case kFp8Wide: return "fp8_wgmma_128x256";
    case kFp8: return "fp8";
    case kGemm: return "gemm_bf16";
  }
  return "?";
}

std::string MoeExpertsKernel::describe() const {
  std::string s = name();
  if (id == kGemv || id == kFp8) s += fmt::format("({}/{})", LinearKernel::id_name(up), LinearKernel::id_name(down));
  if (prequant) s += "[prequant]";
  else if (quant != QuantKernel::kNone) s += fmt::format("[{}]", quant_kernel_name(quant));
  if (capture_fallback) s += "[capture_fallback]";
  return s;
}

namespace {

MoeRouteKernel::Topk pick_topk(const MoeRouteOpDesc& d, const CudaTuning& t) {
  if (t.route_topk_warp && d.top_k <= 32 && d.E <= 256)
    return t.route_topk_warp == 2 ? MoeRouteKernel::kTopkRedux : MoeRouteKernel::kTopkShfl;
  return MoeRouteKernel::kTopkGeneric;
}

// The router without a fused norm (CudaBackend::moe_route_impl with nf = null).
// The shapes k_route_grouped.cu takes (mirrors route_grouped_supported; its static_assert keeps
// the expert limit equal).
bool route_grouped_ok(const MoeRouteOpDesc& d) {
  const int G = d.n_group > 1 ? d.n_group : 1;
  return d.sigmoid && d.gate_f32 && d.E >= 1 && d.E <= limits::kRouteGroupedMaxExperts && d.top_k >= 1 &&
         d.top_k <= 32 && d.top_k <= d.E && d.H > 0 && d.H % 4 == 0 && G <= 64 && d.E % G == 0 &&
         (G == 1 || (d.topk_group >= 1 && d.topk_group <= G && d.top_k <= d.topk_group * (d.E / G))) &&
         d.gate_aligned && d.x_aligned;
}

void pick_route(const MoeRouteOpDesc& d, const DeviceCaps& caps, const CudaTuning& t, MoeRouteKernel* k) {
  (void)caps;
  const bool grouped = !d.sigmoid_renorm && route_grouped_ok(d);
  if (!d.sigmoid_renorm && !grouped) {
    k->id = MoeRouteKernel::kGeneric;
    return;
  }
  const int T = d.T, H = d.H, E = d.E;
  // Prefill (>= router_gemm_min_tokens, f32 gate): the logits as one cuBLASLt GEMM; in a graph
  // only from fp8_act_min_tokens rows (smaller buckets keep the fused router kernel).
  if (d.ws.prefill_allowed(t) && t.router_gemm_min_tokens > 0 && T >= t.router_gemm_min_tokens && d.gate_f32 &&
      H % 4 == 0 && !(d.ws.capturing && T < t.fp8_act_min_tokens)) {
    const bool split = t.router_split_bf16 && d.x_bf16 && H % 8 == 0;
    const size_t logit_bytes = size_t(T) * E * 4 * (split ? 2 : 1);
    const size_t xbytes = split ? size_t(2) * E * H * 2 : (d.x_bf16 ? size_t(T) * H * 4 : 0);
    if (d.ws.lt < limits::kLtWorkspace || d.ws.router < logit_bytes || (xbytes && d.ws.router_x < xbytes)) {
      k->capture_fallback = true;
    } else if (!d.ws.lt_handle) {
      if (d.ws.capturing) k->capture_fallback = true;
    } else {
      const MoeRouteKernel::Id gemm = split ? MoeRouteKernel::kGemmSplit : MoeRouteKernel::kGemmF32;
      if (grouped) {
        k->id = MoeRouteKernel::kGrouped;
        k->grouped_logits = gemm;
        return;
      }
      k->id = gemm;
      k->topk = pick_topk(d, t);
      return;
    }
  }
  if (grouped) {
    k->id = MoeRouteKernel::kGrouped;
    return;
  }
  // launch_moe_route: T <= 8 with the counter (fuse_router) does the top-k in the last block.
  const bool counter = t.fuse_router && T <= limits::kRouteTok;
  if (counter && d.gate_f32 && d.x_bf16 && d.top_k <= 32 && H % 128 == 0 && H / 128 <= limits::kRoutePre)
    k->id = MoeRouteKernel::kRouteDecode;
  else
    k->id = counter ? MoeRouteKernel::kLogitsLast : MoeRouteKernel::kLogitsTopk;
}

}  // namespace

MoeRouteKernel select_moe_route(const MoeRouteOpDesc& d, const DeviceCaps& caps, const CudaTuning& t) {
  MoeRouteKernel k;
  if (d.with_norm) {
    const int T = d.T, H = d.H, E = d.E;
    // k_route_dense.cu: one decode kernel (norm in every logits block, top-k in the last).
    if (t.fuse_router && t.route_norm_dense && d.norm_ok && d.aligned && d.sigmoid_renorm && d.x_bf16 &&
        d.gate_f32 && d.gate_aligned && T >= 1 && T <= limits::kRouteDenseTok && H % 128 == 0 &&
        H <= limits::kRouteDenseMaxH && E <= limits::kRouteDenseMaxE && d.top_k >= 1 && d.top_k <= 32 &&
        d.top_k <= E) {
      k.id = MoeRouteKernel::kRouteNormDense;
      k.norm = MoeRouteKernel::kNormFused;
      k.one_token_tail = t.route_fast_tail && T == 1 && E <= 8 * 32 && d.top_k <= 8;
      return k;
    }
    // Prefill: the add + RMSNorm also quantising for the FP8 experts (k_norm_quant.cu); up to
    // moe_gemv_max_tokens the experts run the GEMVs on bf16 x and nothing would read the codes.
    const size_t need = round_up(size_t(T) * H, 256) + size_t(T) * (H / limits::kQuantGroup) * 4;
    if (t.prefill_moe_norm_quant && d.ws.prefill_allowed(t) && t.use_fp8_act_gemm && d.experts_fp8 &&
        T >= t.fp8_act_min_tokens && T > t.moe_gemv_max_tokens && d.norm_ok && H % limits::kQuantGroup == 0 &&
        H > 0 && H <= limits::kNormQuantMaxK && d.aligned && d.ws.quant_x >= need)
      k.norm = MoeRouteKernel::kNormQuant;
    else
      k.norm = MoeRouteKernel::kNormSeparate;
  }
  pick_route(d, caps, t, &k);
  return k;
}

bool fp8_experts_ws_fit(const WorkspaceView& ws, int T, int P, int H, int I) {
  return ws.quant_x >= round_up(size_t(T) * H, 256) + size_t(T) * (H / limits::kQuantGroup) * 4 &&
         ws.quant_act >= round_up(size_t(P) * I, 256) + size_t(P) * (I / limits::kQuantGroup) * 4;
}

std::string moe_int4_problem(int H, int I, int group) {
  const bool ok = group > 0 && group % 32 == 0 && H % group == 0 && I % group == 0 && H % 8 == 0 && I % 8 == 0;
  if (ok) return {};
  return fmt::format("INT4 experts with H={} I={} group {} are not supported by the W4A16 kernels (group % 32, "
                     "H and I multiples of the group)",
                     H, I, group);
}

MoeExpertsKernel select_moe_experts(const MoeExpertsOpDesc& d, const DeviceCaps& caps, const CudaTuning& t) {
  MoeExpertsKernel k;
  const int T = d.T, H = d.H, I = d.I, P = T * d.top_k;
  if (T == 0) {
    k.id = MoeExpertsKernel::kNone;
    return k;
  }
  const bool up_tc = t.use_gemv_tc && gemv_tc_shape(d.fp8, d.bo, d.bi, I, H, H);
  const bool down_tc = t.use_gemv_tc && gemv_tc_shape(d.fp8, d.bo, d.bi, H, I, I);
  k.combine4 = H % 4 == 0 && d.out_aligned;
  // Very few tokens: no align step and no combine kernel (needs the tensor-core GEMV).
  if (!d.int4 && T <= t.moe_direct_max_tokens && T <= t.moe_gemv_max_tokens &&
      int64_t(T) * ceil_div_i(H, 32) <= limits::kMoeCounterSlots && up_tc && down_tc) {
    k.id = MoeExpertsKernel::kDirect;
    k.up = k.down = LinearKernel::kGemvTc;
    k.tile_rows = 1;
    return k;
  }
  const bool gemv = T <= t.moe_gemv_max_tokens;
  const bool blocks = d.fp8 && d.bo == 128 && d.bi == 128;
  // FP8 prefill on the wgmma kernel's 128 x 256 tiles (the align builds 128-row tiles).
  const bool fp8_pair = !gemv && !d.int4 && d.ws.prefill_allowed(t) && t.use_fp8_act_gemm &&
                        T >= t.fp8_act_min_tokens && blocks && H % 128 == 0 && I % 128 == 0 && t.fp8_gemm_wgmma &&
                        caps.fp8_wgmma && int64_t(P) * std::max(H, I) < (int64_t(1) << 31) &&
                        fp8_experts_ws_fit(d.ws, T, P, H, I);
  k.tile_rows = gemv ? limits::kGemvTile : fp8_pair ? limits::kFp8PairTileM : limits::kGemmTileM;
  const QuantKernel quant = d.prequant ? QuantKernel::kNone : select_quant(H, d.aligned, t.prefill_moe_quant_vec);
  if (d.int4) {
    k.id = !moe_int4_problem(H, I, d.bi).empty() ? MoeExpertsKernel::kUnsupported
           : gemv                               ? MoeExpertsKernel::kInt4Gemv
                                                : MoeExpertsKernel::kInt4Gemm;
    return k;
  }
  if (gemv) {
    k.id = MoeExpertsKernel::kGemv;
    k.up = up_tc ? LinearKernel::kGemvTc : LinearKernel::kGemv;
    k.down = down_tc ? LinearKernel::kGemvTc : LinearKernel::kGemv;
    return k;
  }
  if (fp8_pair) {
    k.id = MoeExpertsKernel::kFp8Wide;
    k.up = k.down = LinearKernel::kFp8Wgmma;
    k.quant = quant, k.prequant = d.prequant;
    return k;
  }
  Fp8GemmDesc gu;
  gu.M = P, gu.N = I, gu.K = H, gu.ldo = I, gu.fp8 = d.fp8, gu.bo = d.bo, gu.bi = d.bi, gu.experts = true;
  gu.tile_rows = k.tile_rows;
  Fp8GemmDesc gd = gu;
  gd.N = H, gd.K = I, gd.ldo = H;
  if (d.ws.prefill_allowed(t) && t.use_fp8_act_gemm && T >= t.fp8_act_min_tokens && fp8_gemm_supported(gu, caps) &&
      fp8_gemm_supported(gd, caps)) {
    if (!fp8_experts_ws_fit(d.ws, T, P, H, I)) {
      k.capture_fallback = true;
    } else {
      k.id = MoeExpertsKernel::kFp8;
      k.up = select_fp8_gemm(gu, caps, t), k.down = select_fp8_gemm(gd, caps, t);
      k.quant = quant, k.prequant = d.prequant;
      return k;
    }
  }
  k.id = MoeExpertsKernel::kGemm;
  return k;
}

}  // namespace moeserve::cuda
