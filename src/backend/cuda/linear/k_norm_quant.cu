// (Add +) RMSNorm fused with the per-(token, 128 columns) FP8 quantisation of its output: the
// input side of the prefill q/k/v projections. Unfused, a layer ran the norm (read residual
// and addend, write residual and out), then one quantisation per projection (read out, write
// e4m3 + scales) three times; fused, the normed row is quantised from registers.
//
// Same arithmetic as rms_norm_vec_kernel (k_elementwise.cu: 256 threads, 8 columns per thread
// per step, the same per-thread sum order and block_sum) and quant_fp8_kernel (k_quant.cu:
// amax of the stored bf16 values, s = amax / 448, q = rn_e4m3(v / s)), so q, s, out and the
// residual are bit-identical to the two-kernel path. A 128-column group is 16 consecutive
// threads (half a warp): the group maximum is four xor-shuffles.
#include <cstdlib>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/common/kernels_prefill.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/norm_rope/row_vec.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256, kMaxV = 2;  // K <= 8 * 256 * 2 = 4096

__global__ void __launch_bounds__(kThreads) norm_quant_kernel(NormQuantParams p) {
  __shared__ float scratch[32];
  const int C = p.K;
  const int64_t row = blockIdx.x;
  uint4 wv[kMaxV];
  float v[kMaxV][8];
  const float r = norm_row_begin<kMaxV, kThreads>(p.w, p.x, p.residual, row, C, p.eps, wv, v, scratch);
#pragma unroll
  for (int i = 0; i < kMaxV; ++i) {
    const int c = (i * kThreads + threadIdx.x) * 8;
    const bool ok = c < C;  // uniform over each 16-thread group (C % 128 == 0)
    float o[8];
    float amax = 0.f;
    if (ok) {
      uint32_t packed[4];
      norm_row_pack8(v[i], r, wv[i], packed);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 st = bf16x2_to_f2(packed[e]);  // the stored values, as the quantiser reads them
        o[2 * e] = st.x, o[2 * e + 1] = st.y;
        amax = fmaxf(amax, fmaxf(fabsf(st.x), fabsf(st.y)));
      }
      if (p.out)
        *reinterpret_cast<uint4*>(static_cast<bf16*>(p.out) + row * C + c) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
    quant_group16_store(o, amax, ok, p.q + row * C + c, p.s + row * p.s_row + int64_t(c / kQuantGroup) * p.s_grp);
  }
}

// quant_fp8_kernel's function with the layout above: a block per row, each thread's 16-byte
// vectors (up to kQuantV) all loaded before use (quant_fp8_kernel keeps 8 bytes per thread in
// flight, ~1.1-1.6 TB/s at 8k tokens), a 128-column group per 16 threads.
constexpr int kQuantV = 4;  // K <= 8 * 256 * 4 = 8192
// kRows rows per block (built: 1; 2 measured slower).
template <int kRows>
__global__ void __launch_bounds__(kThreads) quant_vec_kernel(QuantParams p) {
  pdl_enter();
  const int C = p.K;
  uint4 xv[kRows][kQuantV];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = int64_t(blockIdx.x) * kRows + r;
    const bf16* x = static_cast<const bf16*>(p.x) + row * p.ldx;
#pragma unroll
    for (int i = 0; i < kQuantV; ++i) {
      const int c = (i * kThreads + threadIdx.x) * 8;
      if (c < C && row < p.R) xv[r][i] = *reinterpret_cast<const uint4*>(x + c);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = int64_t(blockIdx.x) * kRows + r;
    if (row >= p.R) break;  // uniform over the block
#pragma unroll
    for (int i = 0; i < kQuantV; ++i) {
      if (i * kThreads * 8 >= C) break;  // uniform over the block
      const int c = (i * kThreads + threadIdx.x) * 8;
      const bool ok = c < C;  // uniform over each 16-thread group (C % 128 == 0)
      float o[8];
      float amax = 0.f;
      if (ok) {
        const uint32_t w[4] = {xv[r][i].x, xv[r][i].y, xv[r][i].z, xv[r][i].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 a = bf16x2_to_f2(w[e]);
          o[2 * e] = a.x, o[2 * e + 1] = a.y;
          amax = fmaxf(amax, fmaxf(fabsf(a.x), fabsf(a.y)));
        }
      }
      quant_group16_store(o, amax, ok, p.q + row * C + c, p.s + row * p.s_row + int64_t(c / kQuantGroup) * p.s_grp);
    }
  }
}

}  // namespace


bool quant_vec_supported(const QuantParams& p) {
  return p.K % kQuantGroup == 0 && p.K > 0 && p.K <= 8 * kThreads * kQuantV && p.ldx % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.q) % 8 == 0;
}

void launch_quant_fp8_vec(const QuantParams& p, cudaStream_t s) {
  CU_REQUIRE(quant_vec_supported(p), "quant_fp8_vec: unsupported shape or alignment");
  if (p.R == 0) return;
  // One row per block (2, the former QUANT_VEC_ROWS switch, measured slower: 116 vs 109 us).
  launch_pdl(quant_vec_kernel<1>, dim3(p.R), dim3(kThreads), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

bool norm_quant_supported(const NormQuantParams& p) {
  auto a16 = [](const void* q) { return q == nullptr || (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  return p.K % kQuantGroup == 0 && p.K > 0 && p.K <= 8 * kThreads * kMaxV && a16(p.x) && a16(p.residual) &&
         a16(p.w) && a16(p.out) && reinterpret_cast<uintptr_t>(p.q) % 8 == 0;
}

void launch_norm_quant_fp8(const NormQuantParams& p, cudaStream_t s) {
  CU_REQUIRE(norm_quant_supported(p), "norm_quant_fp8: unsupported shape or alignment");
  if (p.R == 0) return;
  launch_pdl(norm_quant_kernel, dim3(p.R), dim3(kThreads), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(8 * kThreads * kQuantV == limits::kQuantVecMaxK && 8 * kThreads * kMaxV == limits::kNormQuantMaxK);
}  // namespace moeserve::cuda
