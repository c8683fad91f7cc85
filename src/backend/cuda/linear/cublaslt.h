// cuBLASLt wrappers of the CUDA backend's prefill path:
// - FP8 block-scaled GEMM (Hopper, cuBLAS >= 12.9): D [T, N] bf16 = x [T, K] @ W [N, K]^T
//   with W e4m3 in 128x128 blocks (BLK128x128_32F: the checkpoint's scale_inv
//   [N/128, K/128] row-major as is) and x e4m3 with one f32 scale per token and 128
//   columns (VEC128_32F). cuBLAS is column-major, so this is the "TN" call
//   C [N x T] = W^T' (A, transposed) x x' (B): the only layout FP8 supports.
// - f32 GEMM (router logits [T, E] = x [T, H] @ gate [E, H]^T), CUBLAS_COMPUTE_32F without
//   TF32, so selection sees full-f32 logits.
// - bf16 GEMM with f32 output (the split-bf16 router: x bf16 against the gate's bf16 high and
//   low halves stacked as [2E, H]).
// Plans (descriptors + the heuristic's algorithm) are cached per shape, so a call is one
// cublasLtMatmul launch: capture-safe once a shape has run.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace moeserve::cuda {

struct LtFp8Args {
  int T = 0, N = 0, K = 0;
  const uint8_t* xq = nullptr;  // [T, K] e4m3
  const float* xs = nullptr;    // activation scales, token-fastest: xs[g * T + t]
  const uint8_t* w = nullptr;   // [N, K] e4m3
  const float* ws = nullptr;    // [N/128, K/128] row-major
  void* out = nullptr;          // [T, N] bf16
};

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // False (nothing launched) when cuBLASLt has no algorithm for the shape; the caller
  // falls back. Throws on a failing launch.
  bool fp8_block(const LtFp8Args& a, void* workspace, size_t ws_bytes, cudaStream_t s, bool capturing);
  bool f32_nt(int T, int N, int K, const float* x, const float* w, float* out, void* workspace, size_t ws_bytes,
              cudaStream_t s, bool capturing);
  // out [T, N] f32 = x [T, K] bf16 @ w [N, K]^T bf16, f32 accumulation (no rounding of the
  // products: bf16 x bf16 is exact in f32).
  bool bf16_nt_f32(int T, int N, int K, const void* x, const void* w, float* out, void* workspace, size_t ws_bytes,
                   cudaStream_t s, bool capturing);
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

 private:
  struct Plan;
  Plan* plan(int kind, int T, int N, int K, bool capturing, const void* sa, const void* sb);
  bool run_nt(int kind, int T, int N, int K, const void* x, const void* w, float* out, void* workspace, size_t ws_bytes,
              cudaStream_t s, bool capturing, const char* what);
  void* handle_ = nullptr;
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Plan>> plans_;
};

}  // namespace moeserve::cuda
