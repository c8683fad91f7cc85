// bf16 mma.sync m16n8k16 and the shared-memory helpers the bf16 tensor-core kernels share
// (attention prefill / decode, MLA); the cp.async and ldmatrix basics are mma_fp8.cuh's.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/linear/mma_fp8.cuh"

namespace moeserve::cuda {

// c[16 x 8] += a[16 x 16] . b[16 x 8], bf16 inputs (a: 4 registers, b: 2), f32 accumulate.
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats as one bf16x2 register (lo in the low half), round to nearest.
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// 8-byte cp.async through L1, zero-fill when !valid.
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 8 : 0));
}
// ldmatrix .trans: the four 8 x 8 matrices transposed (B operands from row-major tiles).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t* r, const void* addr) {
  const unsigned a = unsigned(__cvta_generic_to_shared(addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

}  // namespace moeserve::cuda
