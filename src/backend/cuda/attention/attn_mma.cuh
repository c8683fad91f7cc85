// mma.sync attention fragment helpers beyond those of mma_fp8.cuh (cp.async, ldmatrix) and
// gemv_frag.cuh (f16 mma, e4m3 -> f16, bf16 -> f16): the transposed ldmatrix for V, the bf16
// m16n8k16 mma, and the XOR swizzle of [rows][D] 16-bit tiles (D a multiple of 64) that makes
// the ldmatrix row reads conflict-free. Used by k_attn_verify.cu.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common/common.cuh"

namespace moeserve::cuda {

// Four 8 x 8 16-bit matrices, transposed; lane l addresses row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t* r, const void* addr) {
  const unsigned a = unsigned(__cvta_generic_to_shared(addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// c[16 x 8] += a[16 x 16] . b[16 x 8], bf16 inputs, f32 accumulate.
__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Element offset of (row, col) in a [rows][D] 16-bit tile whose 16-byte chunks are XOR-swizzled
// by row % 8 (8 consecutive rows of one chunk column hit 8 different bank groups).
template <int D>
__device__ __forceinline__ int swz16(int row, int col) {
  static_assert(D % 64 == 0, "the swizzle permutes 8 chunks of 8 elements");
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

}  // namespace moeserve::cuda
