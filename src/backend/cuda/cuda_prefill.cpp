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

#include "backend/cuda/cublaslt.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_fp8.h"
#include "backend/cuda/kernels_prefill.h"
#include "core/error.h"

namespace moeserve {
using namespace cuda;

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

// Activation quantisation of the dense linears: the vectorised kernel where it applies.
void CudaBackend::quant_dense(const QuantParams& q) {
  if (prefill_quant_vec && quant_vec_supported(q))
    launch_quant_fp8_vec(q, stream_);
  else
    launch_quant_fp8(q, stream_);
}

// ... and of the FP8 experts (x [T, H], the SiLU * up rows [P, I]).
void CudaBackend::quant_moe(const QuantParams& q) {
  if (prefill_moe_quant_vec && quant_vec_supported(q))
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

bool CudaBackend::linear_fp8_act(const LinParams& p) {
  if (!prefill_path_allowed() || !use_fp8_act_gemm || !p.fp8 || p.bo != 128 || p.bi != 128 || p.K % kQuantGroup != 0 ||
      p.ldx != p.K)
    return false;
  const int T = p.M, K = p.K, G = K / kQuantGroup;
  const size_t qbytes = round_up(size_t(T) * K, 256);
  if (!ws_fits(kQuantX, qbytes + size_t(T) * G * 4)) {
    ++graph_fallbacks_;
    return false;
  }
  if (capturing_) ++graph_fp8_ops_;
  uint8_t* xq = static_cast<uint8_t*>(workspace(kQuantX, qbytes + size_t(T) * G * 4));
  float* xs = reinterpret_cast<float*>(xq + qbytes);
  QuantParams q;
  q.x = p.x, q.ldx = K, q.R = T, q.K = K, q.q = xq, q.s = xs;
  // cuBLASLt block scaling is a Hopper feature; K / 128 % 4 keeps the scale rows 16-byte
  // aligned. cuBLASLt found no algorithm for row counts that are not a multiple of 4 or 8
  // (T = 333 fell back in the H200 tests; 128 and 136 ran), so it takes the first T & ~7
  // rows and the kernel the (< 8) rows left.
  const bool lt_shape = cc_ == 90 && !p.out_f32 && G % 4 == 0 && p.N % 128 == 0 && p.ldo == p.N;
  const int T0 = T & ~7;
  // Rows cuBLASLt cannot take go to the mma.sync kernel; without it (no e4m3 mma.sync code
  // for this device) the whole linear stays on the bf16 path.
  const bool kernel_ok = gemm_fp8_supported(p);
  if (!kernel_ok && !(use_lt_fp8 && lt_shape && !p.experts && T0 == T)) return false;
  int done = 0;
  if (use_lt_fp8 && lt_shape && !p.experts && T0 > 0 && ws_fits(kLt, LtGemm::kWorkspaceBytes)) {
    LtGemm* g = lt();  // null in a capture when no eager step created it: the kernel takes all rows
    if (g) {
      q.R = T0;
      q.s_row = lt_act_scale_kmajor ? G : 1;
      q.s_grp = lt_act_scale_kmajor ? 1 : T0;
      quant_dense(q);
      LtFp8Args a;
      a.T = T0, a.N = p.N, a.K = K, a.xq = xq, a.xs = xs;
      a.w = static_cast<const uint8_t*>(p.w), a.ws = p.s, a.out = p.out;
      void* ws = workspace(kLt, LtGemm::kWorkspaceBytes);
      if (g->fp8_block(a, ws, LtGemm::kWorkspaceBytes, stream_, capturing_)) done = T0;
    }
  }
  if (done == T) return true;
  if (!kernel_ok) {
    MS_CHECK(done == 0, "linear: FP8 tail rows without a kernel");
    return false;
  }
  // Rows [done, T): row-major scales, the mma.sync kernel.
  LinParams tail = p;
  tail.M = T - done;
  tail.out = static_cast<char*>(p.out) + size_t(done) * p.ldo * (p.out_f32 ? 4 : 2);
  q.x = static_cast<const char*>(p.x) + size_t(done) * K * 2;
  q.R = T - done, q.s_row = G, q.s_grp = 1;
  quant_dense(q);
  launch_gemm_fp8(tail, Fp8Act{xq, xs}, stream_);
  return true;
}

bool CudaBackend::fp8_experts_ws_fit(int T, int P, int H, int I) const {
  return ws_fits(kQuantX, round_up(size_t(T) * H, 256) + size_t(T) * (H / kQuantGroup) * 4) &&
         ws_fits(kQuantAct, round_up(size_t(P) * I, 256) + size_t(P) * (I / kQuantGroup) * 4);
}

bool CudaBackend::moe_experts_fp8_act(const LinParams& up, const LinParams& down, int T, const Prequant& pq) {
  if (!prefill_path_allowed() || !use_fp8_act_gemm || T < fp8_act_min_tokens || !gemm_fp8_supported(up) ||
      !gemm_fp8_supported(down) || up.ldx != up.K || down.ldx != down.K)
    return false;
  const int H = up.K, I = down.K, P = up.M;
  // Tokens' rows [T, H] quantised once; the gate/up GEMM gathers them through sorted_token.
  const size_t xbytes = round_up(size_t(T) * H, 256);
  if (!fp8_experts_ws_fit(T, P, H, I)) {
    ++graph_fallbacks_;
    return false;
  }
  if (capturing_) ++graph_fp8_ops_;
  uint8_t* xq = pq.q;  // made by the fused post-attention norm (row-major scales), or:
  float* xs = pq.s_row;
  if (xq) ++prequant_uses_;
  if (!xq) {
    xq = static_cast<uint8_t*>(workspace(kQuantX, xbytes + size_t(T) * (H / kQuantGroup) * 4));
    xs = reinterpret_cast<float*>(xq + xbytes);
    QuantParams q;
    q.x = up.x, q.ldx = H, q.R = T, q.K = H, q.q = xq, q.s = xs, q.s_row = H / kQuantGroup, q.s_grp = 1;
    quant_moe(q);
  }
  const size_t abytes = round_up(size_t(P) * I, 256);
  uint8_t* aq = static_cast<uint8_t*>(workspace(kQuantAct, abytes + size_t(P) * (I / kQuantGroup) * 4));
  float* as = reinterpret_cast<float*>(aq + abytes);
  // launch_gemm_fp8 picks the kernel (wgmma on sm_90a) and, from up.tile_rows, its tile shape.
  launch_gemm_fp8(up, Fp8Act{xq, xs}, stream_);
  // SiLU(gate) * up rows [P, I] (bf16, in down.x) -> e4m3 + scales for the down GEMM.
  QuantParams qa;
  qa.x = down.x, qa.ldx = I, qa.R = P, qa.K = I, qa.q = aq, qa.s = as, qa.s_row = I / kQuantGroup, qa.s_grp = 1;
  quant_moe(qa);
  launch_gemm_fp8(down, Fp8Act{aq, as}, stream_);
  return true;
}

LinParams linear_params(const Tensor& x, const LinearWeight& w, Tensor& out, bool tc);  // cuda_backend.cpp

bool CudaBackend::linear_multi_fp8_act(const Tensor& x, const NormFuse* nf, const LinearWeight* const* ws,
                                       Tensor* const* outs, int n) {
  prequant_ = {};  // kQuantX is rewritten below
  if (!prefill_path_allowed() || !prefill_norm_quant || !use_fp8_act_gemm || !use_lt_fp8 || cc_ != 90 || n < 1 ||
      n > LinParams::kMaxSegs)
    return false;
  LinParams ps[LinParams::kMaxSegs];
  for (int i = 0; i < n; ++i) ps[i] = linear_params(x, *ws[i], *outs[i], use_gemv_tc);
  const int T = ps[0].M, K = ps[0].K, G = K / kQuantGroup;
  // Every weight on cuBLASLt's block-scaled path with all T rows (T % 8: see linear_fp8_act).
  if (T < fp8_act_min_tokens || T % 8 != 0 || K % kQuantGroup != 0 || G % 4 != 0) return false;
  for (int i = 0; i < n; ++i) {
    const LinParams& p = ps[i];
    if (!p.fp8 || p.bo != 128 || p.bi != 128 || p.K != K || p.ldx != K || p.out_f32 || p.N % 128 != 0 || p.ldo != p.N)
      return false;
  }
  NormQuantParams nq;
  if (nf) {
    nq.x = nf->addend->data, nq.residual = nf->residual->data, nq.w = nf->weight->data, nq.out = x.data;
    nq.R = T, nq.K = K, nq.eps = nf->eps;
    if (!norm_quant_supported(nq)) return false;
  }
  const size_t qbytes = round_up(size_t(T) * K, 256), need = qbytes + size_t(T) * G * 4;
  if (!ws_fits(kQuantX, need) || !ws_fits(kLt, LtGemm::kWorkspaceBytes)) {
    ++graph_fallbacks_;
    return false;
  }
  LtGemm* g = lt();
  if (!g) return false;  // in a capture with no eager warm-up: the unfused path
  if (capturing_) ++graph_fp8_ops_;
  uint8_t* xq = static_cast<uint8_t*>(workspace(kQuantX, need));
  float* xs = reinterpret_cast<float*>(xq + qbytes);
  const int64_t s_row = lt_act_scale_kmajor ? G : 1, s_grp = lt_act_scale_kmajor ? 1 : T;
  if (nf) {
    nq.q = xq, nq.s = xs, nq.s_row = s_row, nq.s_grp = s_grp;
    launch_norm_quant_fp8(nq, stream_);
  } else {
    QuantParams q;
    q.x = x.data, q.ldx = K, q.R = T, q.K = K, q.q = xq, q.s = xs, q.s_row = s_row, q.s_grp = s_grp;
    quant_dense(q);
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
      return true;
    }
  }
  return true;
}

const void* CudaBackend::gate_split(const Tensor& gate, int E, int H) {
  if (!gate.owner || !gate_split_cache) return nullptr;
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

bool CudaBackend::route_logits_gemm(const Tensor& gate, RouteParams& p) {
  const int T = p.T, H = p.H, E = p.E;
  if (!prefill_path_allowed() || router_gemm_min_tokens <= 0 || T < router_gemm_min_tokens || gate.dtype != DType::F32 ||
      H % 4 != 0)
    return false;
  // In a graph only from fp8_act_min_tokens rows: smaller buckets keep the fused router kernel.
  if (capturing_ && T < fp8_act_min_tokens) return false;
  // Split-bf16 (default for bf16 x, H % 8 == 0): the gate's bf16 halves stacked as [2E, H]
  // (3 MB for M2.5; split once per gate tensor and kept, gate_split()), one bf16 tensor-core GEMM x [T, H] @ [2E, H]^T
  // -> [T, 2E] f32, and the top-k adds the halves. x is bf16 already, so the only error next
  // to the f32 GEMM is the split's 2^-17 |w| per weight, and the tensor cores' f32
  // accumulation order (tests/cuda/test_cuda_router_prefill.cpp measures both).
  const bool split = router_split_bf16 && p.x_bf16 && H % 8 == 0;
  const size_t logit_bytes = size_t(T) * E * 4 * (split ? 2 : 1);
  const size_t xbytes = split ? size_t(2) * E * H * 2 : (p.x_bf16 ? size_t(T) * H * 4 : 0);
  if (!ws_fits(kLt, LtGemm::kWorkspaceBytes) || !ws_fits(kRouter, logit_bytes) || (xbytes && !ws_fits(kRouterX, xbytes))) {
    ++graph_fallbacks_;
    return false;
  }
  LtGemm* g = lt();
  if (!g) {
    if (capturing_) ++graph_fallbacks_;
    return false;
  }
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

// A linear from prequant_ (linear_fp8_act's conditions): cuBLASLt on all rows (token-fastest
// scales), else the mma.sync kernel (row-major scales). False: not an FP8-activation linear.
bool CudaBackend::linear_prequant(const LinParams& p, const Prequant& pq) {
  if (!prefill_path_allowed() || !use_fp8_act_gemm || !p.fp8 || p.bo != 128 || p.bi != 128 || p.ldx != p.K ||
      p.M < fp8_act_min_tokens)
    return false;
  const int T = p.M, K = p.K, G = K / kQuantGroup;
  const bool lt_shape = cc_ == 90 && !p.out_f32 && G % 4 == 0 && p.N % 128 == 0 && p.ldo == p.N;
  if (use_lt_fp8 && lt_shape && T % 8 == 0 && pq.s_tok && ws_fits(kLt, LtGemm::kWorkspaceBytes)) {
    if (LtGemm* g = lt()) {
      LtFp8Args a;
      a.T = T, a.N = p.N, a.K = K, a.xq = pq.q, a.xs = lt_act_scale_kmajor ? pq.s_row : pq.s_tok;
      a.w = static_cast<const uint8_t*>(p.w), a.ws = p.s, a.out = p.out;
      if (g->fp8_block(a, workspace(kLt, LtGemm::kWorkspaceBytes), LtGemm::kWorkspaceBytes, stream_, capturing_)) {
        if (capturing_) ++graph_fp8_ops_;
        return true;
      }
    }
  }
  if (!gemm_fp8_supported(p)) return false;
  if (capturing_) ++graph_fp8_ops_;
  launch_gemm_fp8(p, Fp8Act{pq.q, pq.s_row}, stream_);
  return true;
}

// The post-attention add + RMSNorm at prefill, quantising its output for the FP8 experts as
// well (k_norm_quant.cu: codes and scales bit-identical to quantising `out`, which is still
// written for the router). The experts' quantisation pass over [T, H] goes away.
bool CudaBackend::norm_quant_for_experts(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                                         Tensor& out, const MoeWeights& moe) {
  if (!prefill_moe_norm_quant || !prefill_path_allowed() || !use_fp8_act_gemm || moe.experts.empty() ||
      !moe.experts[0].w1.fp8() || x.rank() < 1)
    return false;
  const int H = int(x.dim(-1)), T = int(x.numel() / std::max<int64_t>(1, H)), G = H / kQuantGroup;
  const bool bf = residual.dtype == DType::BF16 && x.dtype == DType::BF16 && weight.dtype == DType::BF16 &&
                  out.dtype == DType::BF16;
  // (Up to moe_gemv_max_tokens the experts run the GEMVs on bf16 x: nothing would read the codes.)
  if (T < fp8_act_min_tokens || T <= moe_gemv_max_tokens || !bf || residual.device != Device::CUDA || x.device != Device::CUDA ||
      weight.device != Device::CUDA || out.device != Device::CUDA || residual.numel() != x.numel() ||
      out.numel() != x.numel() || weight.numel() != H)
    return false;
  NormQuantParams nq;
  nq.x = x.data, nq.residual = residual.data, nq.w = weight.data, nq.out = out.data;
  nq.R = T, nq.K = H, nq.eps = eps;
  const size_t qbytes = round_up(size_t(T) * H, 256), need = qbytes + size_t(T) * G * 4;
  if (!norm_quant_supported(nq) || !ws_fits(kQuantX, need)) return false;
  uint8_t* xq = static_cast<uint8_t*>(workspace(kQuantX, need));
  nq.q = xq, nq.s = reinterpret_cast<float*>(xq + qbytes), nq.s_row = G, nq.s_grp = 1;
  launch_norm_quant_fp8(nq, stream_);
  prequant_ = {out.data, T, H, xq, nullptr, nq.s};
  return true;
}

}  // namespace moeserve
