// CudaBackend linears: linear, linear_multi (q/k/v sharing x), add_rms_norm_linear_multi.
// Each fills a LinearOpDesc, asks select_linear (linear/select_linear.h) and launches what it
// names: the GEMVs (k_gemv.cu, k_gemv_tc.cu, k_gemv_dense.cu), the bf16 GEMM (k_gemm.cu) or the
// FP8-activation paths of cuda_prefill.cpp (cuBLASLt, k_gemm_fp8*.cu).
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/linear/kernels_fp8.h"
#include "core/error.h"

namespace moeserve {
using namespace cuda;

namespace {

void check_dev(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.defined(), "{}: {} is empty", op, what);
  MS_CHECK(t.device == Device::CUDA, "{}: {} is not a CUDA tensor", op, what);
}
bool is_bf16(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32, "{}: {} must be BF16 or F32, got {}", op, what,
           dtype_name(t.dtype));
  return t.dtype == DType::BF16;
}
int rows_of(const Tensor& t) { return t.rank() == 1 ? 1 : int(t.numel() / t.dim(-1)); }

}  // namespace

// Checks one linear and fills its GEMV/GEMM parameters (single-matrix fields). Not file-local:
// cuda_prefill.cpp uses it too.
LinParams linear_params(const Tensor& x, const LinearWeight& w, Tensor& out, bool tc) {
  check_dev(x, "linear", "x");
  check_dev(w.weight, "linear", "weight");
  check_dev(out, "linear", "out");
  MS_CHECK(x.dtype == DType::BF16, "linear: activations must be BF16, got {}", dtype_name(x.dtype));
  MS_CHECK(w.weight.rank() == 2, "linear: weight must be 2-D, got {}", shape_str(w.weight.shape));
  const int N = int(w.out_features()), K = int(w.in_features()), T = rows_of(x);
  MS_CHECK(x.dim(-1) == K && out.numel() == int64_t(T) * N, "linear: x {} weight {} out {}", shape_str(x.shape),
           shape_str(w.weight.shape), shape_str(out.shape));
  LinParams p;
  p.tc = tc;
  p.mode = LinMode::kStore;
  p.x = x.data, p.ldx = K, p.M = T;
  p.w = w.weight.data, p.N = N, p.K = K;
  if (w.fp8()) {
    check_dev(w.scale_inv, "linear", "scale_inv");
    MS_CHECK(w.scale_inv.dtype == DType::F32 && w.block_out > 0 && w.block_in > 0, "linear: bad FP8 block scales");
    MS_CHECK(w.scale_inv.rank() == 2 && w.scale_inv.dim(0) == ceil_div(N, w.block_out) &&
                 w.scale_inv.dim(1) == ceil_div(K, w.block_in),
             "linear: scale_inv {} does not match weight {} with blocks [{}, {}]", shape_str(w.scale_inv.shape),
             shape_str(w.weight.shape), w.block_out, w.block_in);
    p.fp8 = true, p.s = w.scale_inv.ptr<float>(), p.bo = w.block_out, p.bi = w.block_in;
    p.s_cols = int(w.scale_inv.dim(1));
  } else {
    MS_CHECK(w.weight.dtype == DType::BF16, "linear: weight dtype {} unsupported on CUDA (BF16 or F8_E4M3)",
             dtype_name(w.weight.dtype));
    p.fp8 = false, p.bo = p.bi = 128;
  }
  p.out = out.data, p.ldo = N, p.out_f32 = !is_bf16(out, "linear", "out");
  return p;
}

LinearWeightDesc weight_desc(const LinParams& p) {
  LinearWeightDesc w;
  w.N = p.N, w.fp8 = p.fp8, w.bo = p.bo, w.bi = p.bi, w.out_f32 = p.out_f32;
  return w;
}

Fp8GemmDesc fp8_gemm_desc(const LinParams& p) {
  Fp8GemmDesc g;
  g.M = p.M, g.N = p.N, g.K = p.K, g.ldo = p.ldo, g.fp8 = p.fp8, g.bo = p.bo, g.bi = p.bi;
  g.experts = p.tile_expert != nullptr, g.tile_rows = p.tile_rows;
  return g;
}

void CudaBackend::linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  const LinParams p = linear_params(x, w, out, tuning.use_gemv_tc);
  // x's FP8 form from the op before (the fused post-attention norm), if made.
  const Prequant pq = take_prequant(p.x, p.M, p.K);
  LinearOpDesc d;
  d.op = LinearOp::kLinear, d.T = p.M, d.K = p.K, d.n = 1, d.w[0] = weight_desc(p);
  d.aligned = aligned16({p.x});
  d.prequant = pq.q != nullptr, d.prequant_tok = pq.s_tok != nullptr;
  d.ws = workspace_view();
  LinearKernel k = select(d);
  if (k.prequant) {
    if (linear_prequant(p, pq, k)) {
      ++prequant_uses_;
      return;
    }
    d.prequant = false;  // cuBLASLt found no algorithm and no FP8 kernel takes the weight
    k = select(d);
  }
  if (k.capture_fallback) ++graph_fallbacks_;
  switch (k.id) {
    case LinearKernel::kFp8Lt:
    case LinearKernel::kFp8Wgmma:
    case LinearKernel::kFp8Mma: {
      if (linear_fp8_act(p, k)) return;
      // No cuBLASLt algorithm for this shape and no FP8 kernel: the GEMV / GEMM choice.
      CudaTuning t = tuning;
      t.use_fp8_act_gemm = false;
      k = select_linear(d, caps_, t);
      break;
    }
    default: break;
  }
  LinParams q = p;
  q.tc = k.id == LinearKernel::kGemvTc;
  if (k.id == LinearKernel::kGemvTc || k.id == LinearKernel::kGemv)
    launch_gemv(q, stream_);
  else
    launch_gemm(q, stream_);
}

namespace {
// One tensor-core GEMV launch over all weights (q/k/v at decode: 256 blocks instead of
// 192 + 32 + 32 in three dependent launches); false where a weight does not take that path
// (select_linear checks the same).
bool multi_params(const Tensor& x, const LinearWeight* const* ws, Tensor* const* outs, int n, int max_tokens,
                  LinParams* m) {
  if (n < 1 || n > LinParams::kMaxSegs) return false;
  for (int i = 0; i < n; ++i) {
    const LinParams p = linear_params(x, *ws[i], *outs[i], true);
    if (i == 0) *m = p;
    if (!(p.M <= max_tokens && gemv_tc_supported(p) && p.K == m->K && p.out_f32 == m->out_f32)) return false;
    m->seg[i] = {p.w, p.s, p.out, p.N, p.s_cols, p.ldo};
    m->seg_block[i + 1] = m->seg_block[i] + ceil_div(p.N, 32) * ceil_div(p.M, kGemvTile);
  }
  m->nseg = n;
  return true;
}
}  // namespace

LinearOpDesc CudaBackend::multi_desc(LinearOp op, const Tensor& x, const LinearWeight* const* ws, Tensor* const* outs,
                                     int n) const {
  LinearOpDesc d;
  d.op = op, d.n = n, d.T = rows_of(x), d.K = int(x.dim(-1));
  d.aligned = aligned16({x.data});
  for (int i = 0; i < std::min(n, int(LinParams::kMaxSegs)); ++i) {
    const LinParams p = linear_params(x, *ws[i], *outs[i], true);
    d.w[i] = weight_desc(p);
    d.weights_aligned = d.weights_aligned && aligned16({p.w});
  }
  d.ws = workspace_view();
  return d;
}

void CudaBackend::linear_multi(const Tensor& x, const LinearWeight* const* ws, Tensor* const* outs, int n) {
  const LinearOpDesc d = multi_desc(LinearOp::kMulti, x, ws, outs, n);
  const LinearKernel k = select(d);
  if (d.T >= tuning.fp8_act_min_tokens) prequant_ = {};  // (kQuantX is rewritten by the FP8 path)
  if (k.capture_fallback) ++graph_fallbacks_;
  LinParams m;
  switch (k.id) {
    case LinearKernel::kQuantLt:
      linear_multi_fp8_act(x, nullptr, ws, outs, n, k);
      return;
    case LinearKernel::kGemvDense:
    case LinearKernel::kGemvTc:
      MS_CHECK(multi_params(x, ws, outs, n, tuning.linear_gemv_tc_max_tokens, &m),
               "linear_multi: the fused GEMV refused the shapes its selector took");
      if (k.id == LinearKernel::kGemvDense)
        dense_gemv(m);
      else
        launch_gemv_tc(m, stream_);
      return;
    default:
      for (int i = 0; i < n; ++i) linear(x, *ws[i], *outs[i]);
  }
}

// The dense decode GEMV (k_gemv_dense.cu) for q/k/v (several weights or the fused norm).
// Single linears (o_proj) measured slower on it than on k_gemv_tc.cu inside the batch-1 graph.
void CudaBackend::dense_gemv(const LinParams& p) {
  launch_gemv_dense(p, num_sms_, stream_);
  ++gemv_dense_launches;
}

void CudaBackend::add_rms_norm_linear_multi(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                                            Tensor& out, const LinearWeight* const* ws, Tensor* const* outs, int n) {
  const bool bf = residual.dtype == DType::BF16 && x.dtype == DType::BF16 && weight.dtype == DType::BF16 &&
                  out.dtype == DType::BF16;
  const bool shapes = residual.numel() == x.numel() && out.numel() == x.numel() && out.shape == x.shape &&
                      weight.numel() == x.dim(-1);
  const bool on_device = residual.device == Device::CUDA && x.device == Device::CUDA &&
                         weight.device == Device::CUDA && out.device == Device::CUDA;
  LinearOpDesc d = multi_desc(LinearOp::kNormMulti, out, ws, outs, n);
  d.norm_ok = bf && shapes && on_device;
  d.aligned = d.aligned && aligned16({residual.data, x.data, weight.data, out.data});
  const LinearKernel k = select(d);
  if (k.capture_fallback) ++graph_fallbacks_;
  if (k.id == LinearKernel::kGemvDenseNorm) {
    LinParams m;
    MS_CHECK(multi_params(out, ws, outs, n, tuning.linear_gemv_tc_max_tokens, &m),
             "add_rms_norm_linear_multi: the fused GEMV refused the shapes its selector took");
    m.norm = true;
    m.x = x.data;
    m.norm_res = residual.data, m.norm_w = weight.data, m.norm_out = out.data, m.eps = eps;
    m.norm_counter = counters_ + 1;
    dense_gemv(m);
    return;
  }
  if (d.norm_ok && d.T >= tuning.fp8_act_min_tokens) prequant_ = {};
  if (k.id == LinearKernel::kNormQuantLt) {
    NormFuse nf{&residual, &x, &weight, eps};
    linear_multi_fp8_act(out, &nf, ws, outs, n, k);
    return;
  }
  add_rms_norm(residual, x, weight, eps, out);
  linear_multi(out, ws, outs, n);
}

}  // namespace moeserve
