// CudaBackend prefill paths: FP8-activation GEMMs for FP8 128x128-block linears and MoE
// experts, and the router logits as one f32 GEMM.
//
// Activations are quantised per (token, 128 columns) to e4m3 with an f32 scale (k_quant.cu),
// then
// - linears: cuBLASLt block-scaled FP8 (sm_90: wgmma kernels; weights' scale_inv used as is)
//   or, where cuBLASLt is unavailable or has no algorithm, k_gemm_fp8.cu (mma.sync e4m3);
// - experts: gate/up grouped GEMM with fused SiLU * up (bf16 out), that output quantised
//   the same way, down grouped GEMM scaled by the routing weight (k_gemm_fp8.cu; on sm_90a
//   the wgmma kernel of k_gemm_fp8_wgmma.cu).
// Capture: these paths also run inside captured decode graphs (buckets of >= fp8_act_min_tokens rows). Nothing here needs the host to know the
// data: the MoE tile table comes from the device-side align (fixed worst-case buffers, tiles
// past the device count exit), the quantisation and GEMM shapes depend only on the row count
// (fixed per bucket), and the cuBLASLt handle and per-shape plan (heuristic algorithm, fixed
// 32 MiB workspace) exist from the bucket's eager warm-up. In a capture nothing is allocated:
// a workspace that is too small, or a missing handle, makes the op take its previous kernel
// (graph_fallbacks_), never an allocation inside the capture.
#include <algorithm>

#include "backend/cuda/linear/cublaslt.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/common/kernels_prefill.h"
#include "core/error.h"

namespace moeserve {
using namespace cuda;

// cuda_backend.cpp
LinParams linear_params(const Tensor& x, const LinearWeight& w, Tensor& out, bool tc);
Fp8GemmDesc fp8_gemm_desc(const LinParams& p);


// Activation quantisation (dense linears: prefill_quant_vec; experts: prefill_moe_quant_vec):
// the vectorised kernel where select_quant takes it (quant_vec_supported checks the same).
void CudaBackend::quant_fp8(const QuantParams& q, bool vec_on) {
  const bool aligned = aligned16({q.x}) && reinterpret_cast<uintptr_t>(q.q) % 8 == 0 && q.ldx % 8 == 0;
  if (select_quant(q.K, aligned, vec_on) == QuantKernel::kVec)
    launch_quant_fp8_vec(q, stream_);
  else
    launch_quant_fp8(q, stream_);
}

LtGemm* CudaBackend::lt() {
  if (!lt_) {
    if (capturing_) return nullptr;
    lt_ = std::make_unique<LtGemm>();
  }
  return lt_.get();
}

// select_linear's kFp8Lt (cuBLASLt on lt_rows rows, the FP8 kernel on the rest) or an FP8
// kernel on all rows, from a fresh quantisation of x. False (nothing launched): cuBLASLt found
// no algorithm and no FP8 kernel takes the weight.
bool CudaBackend::linear_fp8_act(const LinParams& p, const LinearKernel& k) {
  const int T = p.M, K = p.K, G = K / kQuantGroup;
  const size_t qbytes = round_up(size_t(T) * K, 256);
  if (capturing_) ++graph_fp8_ops_;
  uint8_t* xq = static_cast<uint8_t*>(workspace(kQuantX, qbytes + size_t(T) * G * 4));
  float* xs = reinterpret_cast<float*>(xq + qbytes);
  QuantParams q;
  q.x = p.x, q.ldx = K, q.R = T, q.K = K, q.q = xq, q.s = xs;
  int done = 0;
  if (k.id == LinearKernel::kFp8Lt) {
    // cuBLASLt found no algorithm for row counts that are not a multiple of 8 (T = 333 fell
    // back in the H200 tests): it takes the first T & ~7 rows and the kernel the rest.
    const int T0 = k.lt_rows;
    LtGemm* g = lt();
    q.R = T0;
    q.s_row = tuning.lt_act_scale_kmajor ? G : 1;
    q.s_grp = tuning.lt_act_scale_kmajor ? 1 : T0;
    quant_fp8(q, tuning.prefill_quant_vec);
    LtFp8Args a;
    a.T = T0, a.N = p.N, a.K = K, a.xq = xq, a.xs = xs;
    a.w = static_cast<const uint8_t*>(p.w), a.ws = p.s, a.out = p.out;
    void* ws = workspace(kLt, LtGemm::kWorkspaceBytes);
    if (g && g->fp8_block(a, ws, LtGemm::kWorkspaceBytes, stream_, capturing_)) done = T0;
  }
  if (done == T) return true;
  // Rows [done, T): row-major scales, the FP8 kernel (the selector's tail, or all rows when
  // cuBLASLt had no algorithm).
  Fp8GemmDesc gd = fp8_gemm_desc(p);
  gd.M = T - done;
  if (!fp8_gemm_supported(gd, caps_)) {
    MS_CHECK(done == 0, "linear: FP8 tail rows without a kernel");
    return false;
  }
  LinParams tail = p;
  tail.M = T - done;
  tail.fp8_wgmma = (k.id == LinearKernel::kFp8Lt ? select_fp8_gemm(gd, caps_, tuning) : k.id) == LinearKernel::kFp8Wgmma;
  tail.out = static_cast<char*>(p.out) + size_t(done) * p.ldo * (p.out_f32 ? 4 : 2);
  q.x = static_cast<const char*>(p.x) + size_t(done) * K * 2;
  q.R = T - done, q.s_row = G, q.s_grp = 1;
  quant_fp8(q, tuning.prefill_quant_vec);
  launch_gemm_fp8(tail, Fp8Act{xq, xs}, stream_);
  return true;
}

// The experts on FP8 activations (select_moe_experts' kFp8Wide / kFp8): up and down on the
// kernels it named.
void CudaBackend::moe_experts_fp8_act(LinParams up, LinParams down, int T, const Prequant& pq,
                                      const MoeExpertsKernel& k) {
  const int H = up.K, I = down.K, P = up.M;
  const size_t xbytes = round_up(size_t(T) * H, 256);
  up.fp8_wgmma = k.up == LinearKernel::kFp8Wgmma;
  down.fp8_wgmma = k.down == LinearKernel::kFp8Wgmma;
  if (capturing_) ++graph_fp8_ops_;
  uint8_t* xq = pq.q;  // made by the fused post-attention norm (row-major scales), or:
  float* xs = pq.s_row;
  if (xq) ++prequant_uses_;
  if (!xq) {
    xq = static_cast<uint8_t*>(workspace(kQuantX, xbytes + size_t(T) * (H / kQuantGroup) * 4));
    xs = reinterpret_cast<float*>(xq + xbytes);
    QuantParams q;
    q.x = up.x, q.ldx = H, q.R = T, q.K = H, q.q = xq, q.s = xs, q.s_row = H / kQuantGroup, q.s_grp = 1;
    quant_fp8(q, tuning.prefill_moe_quant_vec);
  }
  const size_t abytes = round_up(size_t(P) * I, 256);
  uint8_t* aq = static_cast<uint8_t*>(workspace(kQuantAct, abytes + size_t(P) * (I / kQuantGroup) * 4));
  float* as = reinterpret_cast<float*>(aq + abytes);
  // launch_gemm_fp8 picks the kernel (wgmma on sm_90a) and, from up.tile_rows, its tile shape.
  launch_gemm_fp8(up, Fp8Act{xq, xs}, stream_);
  // SiLU(gate) * up rows [P, I] (bf16, in down.x) -> e4m3 + scales for the down GEMM.
  QuantParams qa;
  qa.x = down.x, qa.ldx = I, qa.R = P, qa.K = I, qa.q = aq, qa.s = as, qa.s_row = I / kQuantGroup, qa.s_grp = 1;
  quant_fp8(qa, tuning.prefill_moe_quant_vec);
  launch_gemm_fp8(down, Fp8Act{aq, as}, stream_);
}


// select_linear's kQuantLt / kNormQuantLt: x (with the fused add + RMSNorm) quantised once,
// then one cuBLASLt block-scaled GEMM per weight on all rows.
void CudaBackend::linear_multi_fp8_act(const Tensor& x, const NormFuse* nf, const LinearWeight* const* ws,
                                       Tensor* const* outs, int n, const LinearKernel& k) {
  prequant_ = {};  // kQuantX is rewritten below
  LinParams ps[LinParams::kMaxSegs];
  for (int i = 0; i < n; ++i) ps[i] = linear_params(x, *ws[i], *outs[i], tuning.use_gemv_tc);
  const int T = ps[0].M, K = ps[0].K, G = K / kQuantGroup;
  NormQuantParams nq;
  if (nf) {
    nq.x = nf->addend->data, nq.residual = nf->residual->data, nq.w = nf->weight->data, nq.out = x.data;
    nq.R = T, nq.K = K, nq.eps = nf->eps;
  }
  const size_t qbytes = round_up(size_t(T) * K, 256), need = qbytes + size_t(T) * G * 4;
  LtGemm* g = lt();
  MS_CHECK(g && k.lt_rows == T, "linear_multi: cuBLASLt path without its handle");
  if (capturing_) ++graph_fp8_ops_;
  uint8_t* xq = static_cast<uint8_t*>(workspace(kQuantX, need));
  float* xs = reinterpret_cast<float*>(xq + qbytes);
  const int64_t s_row = tuning.lt_act_scale_kmajor ? G : 1, s_grp = tuning.lt_act_scale_kmajor ? 1 : T;
  if (nf) {
    nq.q = xq, nq.s = xs, nq.s_row = s_row, nq.s_grp = s_grp;
    launch_norm_quant_fp8(nq, stream_);
  } else {
    QuantParams q;
    q.x = x.data, q.ldx = K, q.R = T, q.K = K, q.q = xq, q.s = xs, q.s_row = s_row, q.s_grp = s_grp;
    quant_fp8(q, tuning.prefill_quant_vec);
  }
  void* lws = workspace(kLt, LtGemm::kWorkspaceBytes);
  for (int i = 0; i < n; ++i) {
    LtFp8Args a;
    a.T = T, a.N = ps[i].N, a.K = K, a.xq = xq, a.xs = xs;
    a.w = static_cast<const uint8_t*>(ps[i].w), a.ws = ps[i].s, a.out = ps[i].out;
    // No algorithm for this shape (not seen on the H200): the per-weight path from the stored
    // (normed) x, which requantises into kQuantX, so the later weights requantise too.
    if (!g->fp8_block(a, lws, LtGemm::kWorkspaceBytes, stream_, capturing_)) {
      for (int j = i; j < n; ++j) linear(x, *ws[j], *outs[j]);
      return;
    }
  }
}

const void* CudaBackend::gate_split(const Tensor& gate, int E, int H) {
  if (!gate.owner || !tuning.gate_split_cache) return nullptr;
  auto same_owner = [&](const GateSplit& g) {
    return !g.owner.expired() && !g.owner.owner_before(gate.owner) && !gate.owner.owner_before(g.owner);
  };
  auto it = gate_splits_.find(gate.data);
  if (it != gate_splits_.end() && same_owner(it->second) && it->second.split.numel() == int64_t(2) * E * H)
    return it->second.split.data;
  if (capturing_) return nullptr;  // no allocation inside a capture
  // Drop the splits of gates freed since (their memory may now hold another tensor).
  for (auto g = gate_splits_.begin(); g != gate_splits_.end();)
    g = g->second.owner.expired() ? gate_splits_.erase(g) : std::next(g);
  GateSplit g{gate.owner, alloc(DType::BF16, {2 * E, H})};
  launch_split_gate_bf16(gate.ptr<float>(), g.split.data, E, H, stream_);
  const void* w2 = g.split.data;
  gate_splits_[gate.data] = std::move(g);
  return w2;
}

// select_moe_route's kGemmSplit / kGemmF32. False: cuBLASLt found no algorithm (the caller's
// kernels take over; p.logits points at the kRouter workspace).
bool CudaBackend::route_logits_gemm(const Tensor& gate, RouteParams& p, const MoeRouteKernel& k) {
  const int T = p.T, H = p.H, E = p.E;
  // Split-bf16: the gate's bf16 halves stacked as [2E, H] (3 MB for M2.5; split once per gate
  // tensor and kept, gate_split()), one bf16 tensor-core GEMM x [T, H] @ [2E, H]^T -> [T, 2E]
  // f32, and the top-k adds the halves. x is bf16 already, so the only error next to the f32
  // GEMM is the split's 2^-17 |w| per weight, and the tensor cores' f32 accumulation order
  // (tests/cuda/test_cuda_router_prefill.cpp measures both).
  const bool split = k.id == MoeRouteKernel::kGemmSplit;
  const size_t logit_bytes = size_t(T) * E * 4 * (split ? 2 : 1);
  const size_t xbytes = split ? size_t(2) * E * H * 2 : (p.x_bf16 ? size_t(T) * H * 4 : 0);
  LtGemm* g = lt();
  MS_CHECK(g, "moe_route: cuBLASLt router GEMM without its handle");
  void* ws = workspace(kLt, LtGemm::kWorkspaceBytes);
  float* logits = static_cast<float*>(workspace(kRouter, logit_bytes));
  bool ok = false;
  if (split) {
    const void* w2 = gate_split(gate, E, H);
    if (!w2) {  // split per call into the workspace
      void* buf = workspace(kRouterX, xbytes);
      launch_split_gate_bf16(gate.ptr<float>(), buf, E, H, stream_);
      w2 = buf;
    }
    ok = g->bf16_nt_f32(T, 2 * E, H, p.x, w2, logits, ws, LtGemm::kWorkspaceBytes, stream_, capturing_);
  } else {
    const float* xf = static_cast<const float*>(p.x);
    if (p.x_bf16) {
      float* buf = static_cast<float*>(workspace(kRouterX, xbytes));
      launch_bf16_to_f32(p.x, buf, int64_t(T) * H, stream_);
      xf = buf;
    }
    ok = g->f32_nt(T, E, H, xf, gate.ptr<float>(), logits, ws, LtGemm::kWorkspaceBytes, stream_, capturing_);
  }
  p.logits = logits;  // (the kRouter buffer may have grown: the caller's pointer is stale)
  if (!ok) return false;  // the split kernel's output is unused then; the caller's kernels take over
  if (capturing_) ++graph_fp8_ops_;
  p.logits_split = split;
  return true;
}

// ---- FP8 activations made by the op before (prequant_) ----

// A linear from prequant_ (select_linear's prequant choice): cuBLASLt on all rows (token-fastest
// scales), else the FP8 kernel (row-major scales). False (nothing launched): cuBLASLt found no
// algorithm and no FP8 kernel takes the weight.
bool CudaBackend::linear_prequant(const LinParams& p, const Prequant& pq, const LinearKernel& k) {
  const int T = p.M, K = p.K;
  if (k.id == LinearKernel::kFp8Lt) {
    if (LtGemm* g = lt()) {
      LtFp8Args a;
      a.T = T, a.N = p.N, a.K = K, a.xq = pq.q, a.xs = tuning.lt_act_scale_kmajor ? pq.s_row : pq.s_tok;
      a.w = static_cast<const uint8_t*>(p.w), a.ws = p.s, a.out = p.out;
      if (g->fp8_block(a, workspace(kLt, LtGemm::kWorkspaceBytes), LtGemm::kWorkspaceBytes, stream_, capturing_)) {
        if (capturing_) ++graph_fp8_ops_;
        return true;
      }
    }
  }
  const Fp8GemmDesc gd = fp8_gemm_desc(p);
  if (!fp8_gemm_supported(gd, caps_)) return false;
  LinParams q = p;
  q.fp8_wgmma = (k.id == LinearKernel::kFp8Lt ? select_fp8_gemm(gd, caps_, tuning) : k.id) == LinearKernel::kFp8Wgmma;
  if (capturing_) ++graph_fp8_ops_;
  launch_gemm_fp8(q, Fp8Act{pq.q, pq.s_row}, stream_);
  return true;
}

// The post-attention add + RMSNorm at prefill, quantising its output for the FP8 experts as
// well (k_norm_quant.cu: codes and scales bit-identical to quantising `out`, which is still
// written for the router). The experts' quantisation pass over [T, H] goes away.
void CudaBackend::norm_quant_for_experts(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                                         Tensor& out) {
  const int H = int(x.dim(-1)), T = int(x.numel() / std::max<int64_t>(1, H)), G = H / kQuantGroup;
  NormQuantParams nq;
  nq.x = x.data, nq.residual = residual.data, nq.w = weight.data, nq.out = out.data;
  nq.R = T, nq.K = H, nq.eps = eps;
  const size_t qbytes = round_up(size_t(T) * H, 256), need = qbytes + size_t(T) * G * 4;
  uint8_t* xq = static_cast<uint8_t*>(workspace(kQuantX, need));
  nq.q = xq, nq.s = reinterpret_cast<float*>(xq + qbytes), nq.s_row = G, nq.s_grp = 1;
  launch_norm_quant_fp8(nq, stream_);
  prequant_ = {out.data, T, H, xq, nullptr, nq.s};
}

}  // namespace moeserve
