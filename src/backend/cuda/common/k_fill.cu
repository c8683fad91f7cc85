// Random fill for synthetic weights and benchmark inputs (generated on the GPU, so a
// full-size synthetic model needs no host memory or download): uniform in [-scale, scale]
// from a counter-based hash, stored as f32, bf16 or fp8 e4m3 (saturating, never NaN).
#include <algorithm>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"

namespace moeserve::cuda {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(void* p, int kind, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(seed ^ mix(uint64_t(i)));
    const float u = (float(h >> 40) * (1.f / 16777216.f)) * 2.f - 1.f;  // [-1, 1)
    const float v = u * scale;
    if (kind == 0)
      static_cast<float*>(p)[i] = v;
    else if (kind == 1)
      static_cast<bf16*>(p)[i] = f2bf(v);
    else
      static_cast<uint8_t*>(p)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

void launch_fill_random(void* p, int kind, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n == 0) return;
  const int blocks = int(std::min<int64_t>((n + 255) / 256, 8192));
  fill_kernel<<<blocks, 256, 0, s>>>(p, kind, n, seed, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
