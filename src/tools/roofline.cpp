// Measures the two ceilings the benchmark is judged against: device copy bandwidth (a large
// D2D copy, counting bytes read plus written) and the dense FP8 / BF16 matrix rate
// (cuBLASLt, 8192^3 on random data, median of timed runs after warm-up).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/common/kernels.h"
#include "core/error.h"
#include "core/log.h"
#include "tools/bench_model.h"

namespace moeserve::tools {
namespace {

#define CK(expr)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) fail("CUDA error {} in {}", cudaGetErrorString(e_), #expr);        \
  } while (0)

template <typename F>
double median_ms(cudaStream_t s, int warm, int reps, F&& f) {
  for (int i = 0; i < warm; ++i) f();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, s));
    f();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Returns FLOP/s of an M=N=K GEMM with the given input type, or 0 with a note on failure.
double gemm_rate(cudaStream_t s, cudaDataType_t in_type, int n, std::string* note) {
  const size_t in_bytes = size_t(n) * n * (in_type == CUDA_R_16BF ? 2 : 1);
  void *A = nullptr, *B = nullptr, *C = nullptr, *ws = nullptr;
  const size_t ws_bytes = 64 << 20;
  CK(cudaMalloc(&A, in_bytes));
  CK(cudaMalloc(&B, in_bytes));
  CK(cudaMalloc(&C, size_t(n) * n * 2));
  CK(cudaMalloc(&ws, ws_bytes));
  const int kind = in_type == CUDA_R_16BF ? 1 : 2;
  cuda::launch_fill_random(A, kind, int64_t(n) * n, 1, 1.f, s);
  cuda::launch_fill_random(B, kind, int64_t(n) * n, 2, 1.f, s);
  double rate = 0;
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto cleanup = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    if (h) cublasLtDestroy(h);
    cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(ws);
  };
  auto ok = [&](cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS) *note = fmt::format("cuBLASLt {} failed: status {}", what, int(st));
    return st == CUBLAS_STATUS_SUCCESS;
  };
  do {
    if (!ok(cublasLtCreate(&h), "create")) break;
    if (!ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")) break;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // "TN", required for FP8
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (!ok(cublasLtMatrixLayoutCreate(&la, in_type, n, n, n), "layout A")) break;
    if (!ok(cublasLtMatrixLayoutCreate(&lb, in_type, n, n, n), "layout B")) break;
    if (!ok(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n), "layout C")) break;
    if (!ok(cublasLtMatmulPreferenceCreate(&pref), "preference")) break;
    size_t wsb = ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    if (!ok(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found), "heuristic")) break;
    if (found == 0) {
      *note = "cuBLASLt found no algorithm";
      break;
    }
    const float alpha = 1.f, beta = 0.f;
    bool failed = false;
    auto run = [&] {
      if (cublasLtMatmul(h, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo, ws, ws_bytes, s) !=
          CUBLAS_STATUS_SUCCESS)
        failed = true;
    };
    const double ms = median_ms(s, 3, 10, run);
    if (failed) {
      *note = "cuBLASLt matmul failed";
      break;
    }
    rate = 2.0 * n * n * double(n) / (ms * 1e-3);
  } while (false);
  CK(cudaStreamSynchronize(s));
  cleanup();
  return rate;
}

}  // namespace

Roofline measure_roofline(void* stream_ptr) {
  cudaStream_t s = static_cast<cudaStream_t>(stream_ptr);
  Roofline r;
  const size_t bytes = size_t(2) << 30;  // 2 GiB source, well past L2
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  cuda::launch_fill_random(a, 0, int64_t(bytes / 4), 7, 1.f, s);
  const double ms = median_ms(s, 2, 10, [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); });
  r.copy_bytes_per_s = 2.0 * double(bytes) / (ms * 1e-3);
  CK(cudaFree(a));
  CK(cudaFree(b));
  std::string note;
  r.fp8_flops = gemm_rate(s, CUDA_R_8F_E4M3, 8192, &note);
  r.fp8_note = note;
  std::string note2;
  r.bf16_flops = gemm_rate(s, CUDA_R_16BF, 8192, &note2);
  if (!note2.empty()) r.fp8_note += (r.fp8_note.empty() ? "" : "; ") + std::string("bf16: ") + note2;
  spdlog::info("roofline: copy {:.0f} GB/s, FP8 GEMM {:.0f} TFLOP/s, BF16 GEMM {:.0f} TFLOP/s {}",
               r.copy_bytes_per_s / 1e9, r.fp8_flops / 1e12, r.bf16_flops / 1e12, r.fp8_note);
  return r;
}

}  // namespace moeserve::tools
