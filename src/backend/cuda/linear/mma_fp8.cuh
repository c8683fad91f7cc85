// cp.async, ldmatrix and FP8 mma.sync helpers shared by the FP8 GEMM kernels.
#pragma once
#include <cstdint>

namespace moeserve::cuda {

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;  // 0: zero-fill (src is still a valid address)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
// 4-byte variant (through L1: .cg takes only 16 bytes), zero-fill when !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// Four 8 x 16-byte matrices; lane l addresses row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* addr) {
  const unsigned a = unsigned(__cvta_generic_to_shared(addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
// c[16 x 8] += a[16 x 32] . b[32 x 8], e4m3 inputs, f32 accumulate (sm_89+).
__device__ __forceinline__ void mma_e4m3(float* c, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the launchers refuse devices below sm_89
#endif
}

}  // namespace moeserve::cuda
