// cuBLASLt plans for the prefill GEMMs (see cublaslt.h).
#include "backend/cuda/linear/cublaslt.h"

#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/common/cuda_check.h"

namespace moeserve::cuda {

namespace {
void lt_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw_error(std::string("cuBLASLt ") + what + " failed: status " + std::to_string(int(st)));
}
enum Kind { kFp8Block = 0, kF32 = 1, kBf16F32 = 2 };
}  // namespace

struct LtGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  ~Plan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

LtGemm::LtGemm() {
  cublasLtHandle_t h = nullptr;
  lt_check(cublasLtCreate(&h), "create");
  handle_ = h;
}
LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

LtGemm::Plan* LtGemm::plan(int kind, int T, int N, int K, bool capturing, const void* sa, const void* sb) {
  const auto key = std::make_tuple(kind, T, N, K);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  // Building a plan is host-only work (no allocation, no sync), so it is allowed in capture.
  (void)capturing;
  auto p = std::make_unique<Plan>();
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  // Column-major view: C [N x T] (ld N) = op(A) [N x K] x B [K x T]; A = W [N, K] row-major
  // = col-major K x N (ld K), B = x [T, K] row-major = col-major K x T (ld K).
  if (kind == kFp8Block) {
    lt_check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const int32_t amode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof(amode)), "A scale mode");
    lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof(bmode)), "B scale mode");
    // The heuristic sees a complete descriptor (the pointers are reset at every launch).
    lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), "A scale");
    lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), "B scale");
    lt_check(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, K, N, K), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, K, T, K), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16BF, N, T, N), "layout C");
  } else if (kind == kBf16F32) {
    // bf16 x bf16 products (exact in f32) accumulated in f32, f32 out (split-bf16 router).
    lt_check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    lt_check(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, K, N, K), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, K, T, K), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, N, T, N), "layout C");
  } else {
    lt_check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    lt_check(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_32F, K, N, K), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_32F, K, T, K), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, N, T, N), "layout C");
  }
  lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  size_t wsb = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
  // Operands may be row slices of larger buffers: promise 16-byte alignment only.
  const uint32_t align = 16;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  // The scale pointers are per call: set on the descriptor right before each launch.
  // The heuristic's first algorithm (timing its other candidates per shape, the former
  // LT_TUNE switch, found one candidate for the FP8 shapes and 5% on the router GEMM).
  cublasLtMatmulHeuristicResult_t res[1] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->la, p->lb,
                                                           p->lc, p->lc, pref, 1, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p->ok) p->algo = res[0].algo;
  Plan* raw = p.get();
  plans_[key] = std::move(p);
  return raw;
}

bool LtGemm::fp8_block(const LtFp8Args& a, void* workspace, size_t ws_bytes, cudaStream_t s, bool capturing) {
  Plan* p = plan(kFp8Block, a.T, a.N, a.K, capturing, a.ws, a.xs);
  if (!p->ok) return false;
  lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.ws, sizeof(a.ws)), "A scale");
  lt_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.xs, sizeof(a.xs)), "B scale");
  const float alpha = 1.f, beta = 0.f;
  lt_check(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p->op, &alpha, a.w, p->la, a.xq, p->lb, &beta, a.out,
                          p->lc, a.out, p->lc, &p->algo, workspace, ws_bytes, s),
           "fp8 block matmul");
  return true;
}

// The two non-FP8 kinds (f32 x f32, bf16 x bf16 -> f32): out [T, N] = x [T, K] @ w [N, K]^T.
bool LtGemm::run_nt(int kind, int T, int N, int K, const void* x, const void* w, float* out, void* workspace,
                    size_t ws_bytes, cudaStream_t s, bool capturing, const char* what) {
  Plan* p = plan(kind, T, N, K, capturing, nullptr, nullptr);
  if (!p->ok) return false;
  const float alpha = 1.f, beta = 0.f;
  lt_check(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p->op, &alpha, w, p->la, x, p->lb, &beta, out, p->lc,
                          out, p->lc, &p->algo, workspace, ws_bytes, s),
           what);
  return true;
}

bool LtGemm::f32_nt(int T, int N, int K, const float* x, const float* w, float* out, void* workspace, size_t ws_bytes,
                    cudaStream_t s, bool capturing) {
  return run_nt(kF32, T, N, K, x, w, out, workspace, ws_bytes, s, capturing, "f32 matmul");
}

bool LtGemm::bf16_nt_f32(int T, int N, int K, const void* x, const void* w, float* out, void* workspace,
                         size_t ws_bytes, cudaStream_t s, bool capturing) {
  return run_nt(kBf16F32, T, N, K, x, w, out, workspace, ws_bytes, s, capturing, "bf16 matmul");
}

}  // namespace moeserve::cuda
