// select_linear: the kernel choice of linear / linear_multi / add_rms_norm_linear_multi.
#include "backend/cuda/linear/select_linear.h"

#include <algorithm>

#include <fmt/format.h>

namespace moeserve::cuda {

const char* quant_kernel_name(QuantKernel q) {
  switch (q) {
    case QuantKernel::kNone: return "none";
    case QuantKernel::kVec: return "quant_vec";
    case QuantKernel::kWarp: return "quant_warp";
    case QuantKernel::kNormQuant: return "norm_quant";
  }
  return "?";
}

const char* LinearKernel::id_name(Id id) {
  switch (id) {
    case kGemvDense: return "gemv_dense";
    case kGemvDenseNorm: return "gemv_dense_norm";
    case kGemvTc: return "gemv_tc";
    case kGemv: return "gemv";
    case kGemm: return "gemm_bf16";
    case kFp8Lt: return "fp8_lt";
    case kFp8Wgmma: return "fp8_wgmma";
    case kFp8Mma: return "fp8_mma";
    case kQuantLt: return "quant_once+fp8_lt";
    case kNormQuantLt: return "norm_quant+fp8_lt";
    case kPerWeight: return "per_weight";
    case kUnfused: return "rms_norm+linear_multi";
  }
  return "?";
}

std::string LinearKernel::describe(int T) const {
  std::string s = name();
  if (id == kFp8Lt && lt_rows < T) s += fmt::format("({} rows)+{}", lt_rows, id_name(tail));
  if (prequant) s += "[prequant]";
  else if (quant != QuantKernel::kNone) s += fmt::format("[{}]", quant_kernel_name(quant));
  if (capture_fallback) s += "[capture_fallback]";
  return s;
}

bool gemv_tc_shape(bool fp8, int bo, int bi, int N, int K, int ldx) {
  return fp8 && bo == 128 && bi == 128 && K > 0 && K % 128 == 0 && N % 16 == 0 && ldx % 8 == 0;
}

bool fp8_gemm_supported(const Fp8GemmDesc& g, const DeviceCaps& caps) {
  return g.fp8 && g.bo == 128 && g.bi == 128 && g.K > 0 && g.K % 128 == 0 && g.N % 2 == 0 &&
         caps.code_arch >= 890;  // e4m3 mma.sync compiled in
}

LinearKernel::Id select_fp8_gemm(const Fp8GemmDesc& g, const DeviceCaps& caps, const CudaTuning& t) {
  // Hopper: the wgmma kernel for expert tables and linears of >= 128 rows (below that the
  // 256-column tiles leave most SMs idle). Its producer's offsets are 32-bit.
  const bool small = int64_t(g.M) * g.K < (int64_t(1) << 31) && int64_t(g.N) * g.K < (int64_t(1) << 31);
  if (t.fp8_gemm_wgmma && (g.experts || g.M >= 128) && fp8_gemm_supported(g, caps) && caps.fp8_wgmma && small &&
      g.N % 64 == 0 && g.ldo % 2 == 0 && (!g.experts || g.tile_rows == 64 || g.tile_rows == 128))
    return LinearKernel::kFp8Wgmma;
  return LinearKernel::kFp8Mma;
}

QuantKernel select_quant(int K, bool aligned, bool vec_on) {
  return vec_on && K % limits::kQuantGroup == 0 && K > 0 && K <= limits::kQuantVecMaxK && K % 8 == 0 && aligned
             ? QuantKernel::kVec
             : QuantKernel::kWarp;
}

size_t gemv_dense_smem(int R, int M, int K) {
  return std::max(size_t(R) * (K + 16), size_t(limits::kDenseWarps - 1) * 4 * 32 * 4) + size_t(M) * (K + 8) * 2 +
         size_t(K / 128) * 4;
}

namespace {

Fp8GemmDesc fp8_desc(const LinearWeightDesc& w, int M, int K) {
  Fp8GemmDesc g;
  g.M = M, g.N = w.N, g.K = K, g.ldo = w.N, g.fp8 = w.fp8, g.bo = w.bo, g.bi = w.bi;
  return g;
}

bool blocks128(const LinearWeightDesc& w) { return w.fp8 && w.bo == 128 && w.bi == 128; }

// cuBLASLt block scaling is a Hopper feature; K / 128 % 4 keeps the scale rows 16-byte aligned.
bool lt_shape(const LinearWeightDesc& w, int K, const DeviceCaps& caps) {
  return caps.cc == 90 && !w.out_f32 && (K / limits::kQuantGroup) % 4 == 0 && w.N % 128 == 0;
}

bool gemv_tc_ok(const LinearWeightDesc& w, int K, bool tc) { return tc && gemv_tc_shape(w.fp8, w.bo, w.bi, w.N, K, K); }

// Single linear: x's FP8 form from the op before (CudaBackend::linear_prequant).
bool pick_prequant(const LinearOpDesc& d, const DeviceCaps& caps, const CudaTuning& t, LinearKernel* k) {
  const LinearWeightDesc& w = d.w[0];
  const int T = d.T, K = d.K;
  if (!d.ws.prefill_allowed(t) || !t.use_fp8_act_gemm || !blocks128(w) || T < t.fp8_act_min_tokens) return false;
  if (t.use_lt_fp8 && lt_shape(w, K, caps) && T % 8 == 0 && d.prequant_tok && d.ws.lt >= limits::kLtWorkspace &&
      d.ws.lt_handle) {
    k->id = LinearKernel::kFp8Lt, k->lt_rows = T, k->prequant = true;
    return true;
  }
  const Fp8GemmDesc g = fp8_desc(w, T, K);
  if (!fp8_gemm_supported(g, caps)) return false;
  k->id = select_fp8_gemm(g, caps, t), k->prequant = true;
  return true;
}

// Single linear at >= fp8_act_min_tokens rows (CudaBackend::linear_fp8_act).
bool pick_fp8_act(const LinearOpDesc& d, const DeviceCaps& caps, const CudaTuning& t, LinearKernel* k) {
  const LinearWeightDesc& w = d.w[0];
  const int T = d.T, K = d.K, G = K / limits::kQuantGroup;
  if (!d.ws.prefill_allowed(t) || !t.use_fp8_act_gemm || !blocks128(w) || K % limits::kQuantGroup != 0) return false;
  if (d.ws.quant_x < round_up(size_t(T) * K, 256) + size_t(T) * G * 4) {
    k->capture_fallback = true;
    return false;
  }
  const bool lt_ok = t.use_lt_fp8 && lt_shape(w, K, caps);
  const int T0 = T & ~7;  // cuBLASLt found no algorithm for row counts that are not multiples of 8
  const Fp8GemmDesc g = fp8_desc(w, T, K);
  const bool kernel_ok = fp8_gemm_supported(g, caps);
  if (!kernel_ok && !(lt_ok && T0 == T)) return false;
  k->quant = select_quant(K, d.aligned, t.prefill_quant_vec);
  if (lt_ok && T0 > 0 && d.ws.lt >= limits::kLtWorkspace && d.ws.lt_handle) {
    k->id = LinearKernel::kFp8Lt, k->lt_rows = T0;
    if (T0 < T) k->tail = select_fp8_gemm(fp8_desc(w, T - T0, K), caps, t);
    return true;
  }
  if (!kernel_ok) return false;
  k->id = select_fp8_gemm(g, caps, t);
  return true;
}

// k_gemv_dense.cu for q/k/v (several weights or the fused norm); single linears never take it.
bool dense_ok(const LinearOpDesc& d, const DeviceCaps& caps, const CudaTuning& t, bool norm) {
  const LinearWeightDesc& w = d.w[0];
  const int T = d.T, K = d.K;
  if (!(t.use_gemv_tc && T <= t.gemv_dense_max_tokens && T <= t.linear_gemv_tc_max_tokens)) return false;
  if (caps.code_arch < 900) return false;
  if (!blocks128(w) || K <= 0 || K % 128 != 0 || K > limits::kDenseMaxK) return false;
  if (T < 1 || T > limits::kDenseMaxTokens || K % 8 != 0 || !d.aligned || !d.weights_aligned) return false;
  if (gemv_dense_smem(8, T, K) > limits::kDenseSmemMax) return false;
  if (norm && K > limits::kDenseNormMaxK) return false;
  for (int i = 0; i < d.n; ++i)
    if (d.w[i].N <= 0) return false;
  return true;
}

// One tensor-core GEMV over all weights (CudaBackend's multi_params).
bool multi_ok(const LinearOpDesc& d, int max_tokens) {
  if (d.n < 1 || d.n > limits::kMaxSegs) return false;
  for (int i = 0; i < d.n; ++i)
    if (!(d.T <= max_tokens && gemv_tc_ok(d.w[i], d.K, true) && d.w[i].out_f32 == d.w[0].out_f32)) return false;
  return true;
}

// q/k/v at prefill: x (with the fused add + RMSNorm for kNormMulti) quantised once, cuBLASLt
// per weight on all rows (CudaBackend::linear_multi_fp8_act).
bool pick_quant_lt(const LinearOpDesc& d, const DeviceCaps& caps, const CudaTuning& t, bool norm, LinearKernel* k) {
  const int T = d.T, K = d.K, G = K / limits::kQuantGroup;
  if (!d.ws.prefill_allowed(t) || !t.prefill_norm_quant || !t.use_fp8_act_gemm || !t.use_lt_fp8 || caps.cc != 90 ||
      d.n < 1 || d.n > limits::kMaxSegs)
    return false;
  if (T < t.fp8_act_min_tokens || T % 8 != 0 || K % limits::kQuantGroup != 0 || G % 4 != 0) return false;
  for (int i = 0; i < d.n; ++i) {
    const LinearWeightDesc& w = d.w[i];
    if (!blocks128(w) || w.out_f32 || w.N % 128 != 0) return false;
  }
  if (norm && !(K > 0 && K <= limits::kNormQuantMaxK && d.aligned)) return false;
  if (d.ws.quant_x < round_up(size_t(T) * K, 256) + size_t(T) * G * 4 || d.ws.lt < limits::kLtWorkspace) {
    k->capture_fallback = true;
    return false;
  }
  if (!d.ws.lt_handle) return false;  // in a capture with no eager warm-up: the unfused path
  k->id = norm ? LinearKernel::kNormQuantLt : LinearKernel::kQuantLt;
  k->lt_rows = T;
  k->quant = norm ? QuantKernel::kNormQuant : select_quant(K, d.aligned, t.prefill_quant_vec);
  return true;
}

LinearKernel select_single(const LinearOpDesc& d, const DeviceCaps& caps, const CudaTuning& t) {
  LinearKernel k;
  const int T = d.T, N = d.w[0].N;
  if (d.prequant && pick_prequant(d, caps, t, &k)) return k;
  if (T >= t.fp8_act_min_tokens && pick_fp8_act(d, caps, t, &k)) return k;
  // Narrow outputs (k/v projections: N = 1024) give the 64 x 128 GEMM tiles too few blocks at
  // decode batch sizes; FP8 linears the tensor-core GEMV supports take it up to
  // linear_gemv_tc_max_tokens rows.
  const bool tc = gemv_tc_ok(d.w[0], d.K, t.use_gemv_tc);
  if (T <= t.linear_gemv_max_tokens || (T <= 64 && N <= t.linear_gemv_narrow_n) ||
      (T <= t.linear_gemv_tc_max_tokens && tc))
    k.id = tc ? LinearKernel::kGemvTc : LinearKernel::kGemv;
  else
    k.id = LinearKernel::kGemm;
  return k;
}

}  // namespace

LinearKernel select_linear(const LinearOpDesc& d, const DeviceCaps& caps, const CudaTuning& t) {
  switch (d.op) {
    case LinearOp::kLinear: return select_single(d, caps, t);
    case LinearOp::kMulti: {
      LinearKernel k;
      if (d.T >= t.fp8_act_min_tokens && pick_quant_lt(d, caps, t, false, &k)) return k;
      const bool fallback = k.capture_fallback;
      k = LinearKernel{};
      k.capture_fallback = fallback;
      if (t.fuse_linear_multi && d.n > 1 && t.use_gemv_tc && multi_ok(d, t.linear_gemv_tc_max_tokens)) {
        k.id = dense_ok(d, caps, t, false) ? LinearKernel::kGemvDense : LinearKernel::kGemvTc;
        return k;
      }
      k.id = LinearKernel::kPerWeight;
      return k;
    }
    case LinearOp::kNormMulti: {
      LinearKernel k;
      if (t.fuse_norm_dense && t.gemv_dense_max_tokens > 0 && t.use_gemv_tc && d.norm_ok && d.aligned &&
          multi_ok(d, t.linear_gemv_tc_max_tokens) && dense_ok(d, caps, t, true)) {
        k.id = LinearKernel::kGemvDenseNorm;
        return k;
      }
      if (d.norm_ok && d.T >= t.fp8_act_min_tokens && pick_quant_lt(d, caps, t, true, &k)) return k;
      const bool fallback = k.capture_fallback;
      k = LinearKernel{};
      k.capture_fallback = fallback;
      k.id = LinearKernel::kUnfused;
      return k;
    }
  }
  return {};
}

}  // namespace moeserve::cuda
