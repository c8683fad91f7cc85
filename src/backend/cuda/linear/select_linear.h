// The linear family's kernel selector: linear, linear_multi (q/k/v sharing x),
// add_rms_norm_linear_multi, and the FP8 activation quantisation they use. Pure host code
// (common/select_common.h); CudaBackend's linear ops (cuda_linear.cpp, cuda_prefill.cpp) launch
// what select_linear names.
#pragma once
#include <string>

#include "backend/cuda/common/select_common.h"

namespace moeserve::cuda {

struct LinearWeightDesc {
  int N = 0;         // output rows
  bool fp8 = true;   // e4m3 with block scales (else bf16)
  int bo = 128, bi = 128;  // block shape (bf16 weights: 128 x 128, unused)
  bool out_f32 = false;    // the output tensor is f32 (else bf16)
};

enum class LinearOp : uint8_t {
  kLinear,     // one weight
  kMulti,      // linear_multi: n weights over the same x
  kNormMulti,  // add_rms_norm_linear_multi: residual += x, out = rmsnorm(residual), then kMulti on out
};

struct LinearOpDesc {
  LinearOp op = LinearOp::kLinear;
  int T = 0, K = 0;   // rows of x, its width
  int n = 1;          // weights (kMulti / kNormMulti: 1..4 take the fused paths)
  LinearWeightDesc w[limits::kMaxSegs];
  bool aligned = true;          // x (and the norm's tensors) 16-byte aligned
  bool weights_aligned = true;  // every weight 16-byte aligned (the dense GEMV's bulk copies)
  // kNormMulti: residual, x, weight and out BF16 on the device with matching shapes.
  bool norm_ok = true;
  // kLinear: an FP8 form of x made by the op before (with token-fastest scales too).
  bool prequant = false, prequant_tok = false;
  WorkspaceView ws;
};

// The FP8 activation quantisation in front of an FP8 x FP8 GEMM.
enum class QuantKernel : uint8_t { kNone, kVec, kWarp, kNormQuant };
const char* quant_kernel_name(QuantKernel q);

struct LinearKernel {
  enum Id : uint8_t {
    kGemvDense,      // k_gemv_dense.cu (q/k/v: one launch over all weights)
    kGemvDenseNorm,  // k_gemv_dense.cu with the add + RMSNorm inside
    kGemvTc,         // k_gemv_tc.cu (kMulti: one launch over all weights)
    kGemv,           // k_gemv.cu
    kGemm,           // k_gemm.cu (bf16 mma.sync)
    kFp8Lt,          // cuBLASLt block-scaled FP8 on lt_rows rows, the rest on `tail`
    kFp8Wgmma,       // k_gemm_fp8_wgmma.cu
    kFp8Mma,         // k_gemm_fp8.cu
    kQuantLt,        // kMulti at prefill: x quantised once, cuBLASLt per weight
    kNormQuantLt,    // kNormMulti at prefill: add + RMSNorm + quantisation in one kernel, cuBLASLt per weight
    kPerWeight,      // kMulti: one linear per weight (each chosen for kLinear)
    kUnfused,        // kNormMulti: add_rms_norm, then linear_multi
  };
  Id id = kGemm;
  int lt_rows = 0;        // kFp8Lt / kQuantLt / kNormQuantLt: rows on cuBLASLt
  Id tail = kFp8Mma;      // kFp8Lt with lt_rows < T: the FP8 kernel taking the rest
  QuantKernel quant = QuantKernel::kNone;
  bool prequant = false;  // reads the FP8 activation of the op before (no quantisation here)
  // A path before this one did not fit a capture's workspace (CudaBackend counts it).
  bool capture_fallback = false;
  const char* name() const { return id_name(id); }
  static const char* id_name(Id id);
  std::string describe(int T) const;  // name plus the parameters ("fp8_lt(128 rows)+fp8_mma")
  bool operator==(Id o) const { return id == o; }
};

LinearKernel select_linear(const LinearOpDesc& d, const DeviceCaps& caps, const CudaTuning& t);

// The FP8 grouped GEMM's kernel (launch_gemm_fp8): wgmma on Hopper, else mma.sync; kNone
// (as kGemm) where neither applies. rows: M; experts: an expert tile table of tile_rows rows.
struct Fp8GemmDesc {
  int M = 0, N = 0, K = 0, ldo = 0;
  bool fp8 = true;
  int bo = 128, bi = 128;
  bool experts = false;  // tile table over an expert pointer table
  int tile_rows = 64;
};
bool fp8_gemm_supported(const Fp8GemmDesc& g, const DeviceCaps& caps);
// kFp8Wgmma or kFp8Mma (call only where fp8_gemm_supported).
LinearKernel::Id select_fp8_gemm(const Fp8GemmDesc& g, const DeviceCaps& caps, const CudaTuning& t);
// The tensor-core GEMV's shape rule (k_gemv_tc.cu): FP8 128 x 128 blocks, K % 128, N % 16, ldx % 8.
bool gemv_tc_shape(bool fp8, int bo, int bi, int N, int K, int ldx);
// The activation quantisation kernel of the dense linears (vec: prefill_quant_vec) or the experts
// (vec: prefill_moe_quant_vec) for rows of K columns.
QuantKernel select_quant(int K, bool aligned, bool vec_on);
// k_gemv_dense.cu's shared memory for R weight rows, M activation rows of K columns.
size_t gemv_dense_smem(int R, int M, int K);

}  // namespace moeserve::cuda
