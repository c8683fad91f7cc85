// Which compiled code the current device actually runs. Run-time dispatch must ask this, not
// the device's compute capability: with the default archs "80;90a" an sm_89 card (L40S) runs
// the sm_80 SASS and an sm_100/sm_120 card JIT-compiles the compute_80 PTX, so every
// `#if __CUDA_ARCH__ >= 890/900` path (FP8 mma.sync, griddepcontrol, clusters, wgmma) is
// absent there even though the device would support it.
#include <atomic>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/kernels.h"

namespace moeserve::cuda {
namespace {

__global__ void code_arch_kernel(int* out) {
#if defined(__CUDA_ARCH__)
  int v = __CUDA_ARCH__;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  v += 1;  // sm_90a: wgmma, setmaxnreg and the other arch-specific features are compiled in
#endif
  *out = v;
#endif
}

int probe() {
  int* d = nullptr;
  int h = 0;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return 0;
  code_arch_kernel<<<1, 1>>>(d);
  if (cudaGetLastError() == cudaSuccess && cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess) {
    cudaFree(d);
    return h;
  }
  cudaGetLastError();  // no usable code for this device: clear the error, report 0
  cudaFree(d);
  return 0;
}

}  // namespace

int code_arch_raw() {
  // Per device ordinal: probe result + 1, 0 = not yet probed (benign race: every writer
  // stores the same value).
  static std::atomic<int> cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = probe() + 1;
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v - 1;
}

int code_arch() { return code_arch_raw() / 10 * 10; }
bool code_has_sm90a() { return code_arch_raw() % 10 == 1; }

}  // namespace moeserve::cuda
