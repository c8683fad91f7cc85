// Device helpers shared by the Hopper wgmma prefill attention kernels (k_attn_wgmma.cu: the
// two-warpgroup kernel; k_attn_ws.cu: the warp-specialised one): 128-byte swizzle, cp.async,
// mbarriers, wgmma m64n128k16 bf16 (A from shared memory or registers), the online-softmax
// tile step and the descriptors of Q / K (K-major) and V (MN-major) tiles.
// Tile shape: 64 query rows per warpgroup (kRows), 128 keys per tile (kN), head_dim 128 (kD).
#pragma once
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/norm_rope/row_vec.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MS_WGMMA_ATTN 1
#endif

namespace moeserve::cuda::attn_wg {

constexpr int kD = 128, kRows = 64, kN = 128;
constexpr int kQBytes = kRows * kD * 2;  // 16 KB per warpgroup
constexpr int kKVBytes = kN * kD * 2;    // 32 KB per K or V tile

#ifdef MS_WGMMA_ATTN
// Byte offset of 16-byte chunk `c` (0..7) of row `r` inside a 128-byte-swizzled region.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }


__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 2^x in one MUFU op (exp2f adds denormal handling; flushing tiny probabilities to 0 is harmless).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// mbarriers (kMode 2): init, arrive, parity wait, and an arrive that fires when all of this
// thread's earlier cp.async copies have landed.
__device__ __forceinline__ void mbar_init(uint32_t a, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cp(uint32_t a) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT_%=;\n}\n" ::"r"(a),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void named_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
__device__ __forceinline__ void named_arrive() { asm volatile("bar.arrive 1, 256;\n" ::: "memory"); }

// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma.
__device__ __forceinline__ void fence_acc(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

#define MS_ACC64                                                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define MS_D64                                                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// D[64 x 128] (+)= A[64 x 16] B[16 x 128]; A and B from shared memory, both K-major.
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MS_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : MS_ACC64
      : "l"(da), "l"(db), "r"(accumulate));
}
// D[64 x 128] += A[64 x 16] B[16 x 128]; A from registers (mma.m16n8k16 A layout per warp),
// B from shared memory MN-major (transposed).
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MS_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : MS_ACC64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#endif  // MS_WGMMA_ATTN

#ifdef MS_WGMMA_ATTN
// Row state of the online softmax for the two rows (r_lo, r_hi) a thread holds.
struct RowState {
  float m_lo = -INFINITY, m_hi = -INFINITY;  // running max, raw score units
  float l_lo = 0.f, l_hi = 0.f;              // per-thread partial sums (the quad is summed at the end)
  float c_lo = 1.f, c_hi = 1.f;              // factor O still has to be multiplied by
};

// Masks s (S accumulators of keys k0 .. k0 + 127), updates the row state and turns s into
// exp2(s * sl2 - m * sl2). s[4 i + e]: row r_lo (e < 2) / r_hi, key k0 + 8 i + 2 tig + (e & 1).
__device__ __forceinline__ void softmax_tile(float (&s)[64], RowState& st, bool need_mask, int k0, int tig,
                                             int pos_lo, int pos_hi, float sl2) {
  if (need_mask) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = k0 + 8 * i + 2 * tig + e;
        if (key > pos_lo) s[4 * i + e] = -INFINITY;
        if (key > pos_hi) s[4 * i + 2 + e] = -INFINITY;
      }
  }
  float mx_lo = st.m_lo, mx_hi = st.m_hi;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    mx_lo = fmaxf(mx_lo, fmaxf(s[4 * i], s[4 * i + 1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, x));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, x));
  }
  const float ref_lo = mx_lo == -INFINITY ? 0.f : mx_lo * sl2, ref_hi = mx_hi == -INFINITY ? 0.f : mx_hi * sl2;
  st.c_lo = ex2(st.m_lo * sl2 - ref_lo);
  st.c_hi = ex2(st.m_hi * sl2 - ref_hi);
  st.m_lo = mx_lo, st.m_hi = mx_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    s[4 * i] = ex2(fmaf(s[4 * i], sl2, -ref_lo));
    s[4 * i + 1] = ex2(fmaf(s[4 * i + 1], sl2, -ref_lo));
    s[4 * i + 2] = ex2(fmaf(s[4 * i + 2], sl2, -ref_hi));
    s[4 * i + 3] = ex2(fmaf(s[4 * i + 3], sl2, -ref_hi));
    sum_lo += s[4 * i] + s[4 * i + 1];
    sum_hi += s[4 * i + 2] + s[4 * i + 3];
  }
  st.l_lo = st.l_lo * st.c_lo + sum_lo;
  st.l_hi = st.l_hi * st.c_hi + sum_hi;
}

__device__ __forceinline__ void rescale_o(float (&o)[64], const RowState& st) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    o[4 * i] *= st.c_lo, o[4 * i + 1] *= st.c_lo;
    o[4 * i + 2] *= st.c_hi, o[4 * i + 3] *= st.c_hi;
  }
}

// P as the A operand: k-step kk covers keys 16 kk .. 16 kk + 15 = S column blocks 2 kk, 2 kk + 1.
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    pa[kk][0] = pack2(s[8 * kk], s[8 * kk + 1]);
    pa[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// Epilogue: the quad's partial row sums give 1 / l per row; O / l is stored as bf16 into the
// rows' 128 outputs (out_lo / out_hi: rows r_lo / r_hi; nullptr skips a padded row).
__device__ __forceinline__ void row_inv_l(const RowState& st, float& inv_lo, float& inv_hi) {
  float l_lo = st.l_lo, l_hi = st.l_hi;
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, x);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, x);
  }
  inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f, inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
}
__device__ __forceinline__ void store_o_bf16(const float (&o)[64], const RowState& st, int tig, bf16* out_lo,
                                             bf16* out_hi) {
  float inv_lo, inv_hi;
  row_inv_l(st, inv_lo, inv_hi);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int col = 8 * i + 2 * tig;
    if (out_lo) *reinterpret_cast<uint32_t*>(out_lo + col) = pack2(o[4 * i] * inv_lo, o[4 * i + 1] * inv_lo);
    if (out_hi) *reinterpret_cast<uint32_t*>(out_hi + col) = pack2(o[4 * i + 2] * inv_hi, o[4 * i + 3] * inv_hi);
  }
}

// FP8 epilogue (the o_proj input, prefill), after store_o_bf16: each row's 128 outputs are
// one quantisation group of the per-(token, 128 columns) e4m3 activation format (k_quant.cu,
// k_norm_quant.cu), held by one quad (4 threads x 32 columns). Each thread reads back the 32
// bf16 values it has just stored (its own writes: no barrier; O's 64 registers are dead by
// then, which keeps this epilogue out of the main loop's register budget), the quad takes
// the amax by two shuffles, sc = amax / 448, q = rn_e4m3(v / sc): codes and scales
// bit-identical to quantising the bf16 output. row: the bf16 row (nullptr: a padded row,
// nothing stored); q: its 128 codes; the quad's first thread stores sc at *sa and *sb (the
// two scale layouts the o_proj GEMMs read: token-fastest for cuBLASLt, row-major for
// k_gemm_fp8.cu). Every lane must call it.
__device__ __forceinline__ void quant_row_quad(const bf16* row, int tig, uint8_t* q, float* sa, float* sb) {
  uint32_t w[16];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    w[i] = 0u;
    // (an asm load: the compiler must not forward the stored values and keep O live instead)
    if (row) asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(w[i]) : "l"(row + 8 * i + 2 * tig) : "memory");
    const float2 f = bf16x2_to_f2(w[i]);
    amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  if (!row) return;
  const float sc = fp8_group_scale(amax);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float2 f = bf16x2_to_f2(w[i]);
    *reinterpret_cast<__nv_fp8x2_storage_t*>(q + 8 * i + 2 * tig) =
        __nv_cvt_float2_to_fp8x2(make_float2(f.x / sc, f.y / sc), __NV_SATFINITE, __NV_E4M3);
  }
  if (tig == 0) *sa = sc, *sb = sc;
}

// Descriptors are built from two 32-bit words: lo = start >> 4 | LBO >> 4 << 16 (start < 2^18,
// so later adds of small offsets never carry out of the 14-bit field), hi = SBO >> 4 | 128-byte
// swizzle (bit 62). Per k-step only lo changes, by a constant.
constexpr uint32_t kDescHi = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint64_t desc2(uint32_t lo) { return (uint64_t(kDescHi) << 32) | lo; }
__device__ __forceinline__ uint32_t desc_lo(uint32_t saddr, uint32_t lbo) { return (saddr >> 4) | ((lbo >> 4) << 16); }

// S = Q K^T for one 128-key tile: 8 k-steps of 16 dims; Q and K are two 64-dim halves each.
__device__ __forceinline__ void issue_s(float (&s)[64], uint32_t sq, uint32_t ks) {
  const uint32_t lq = desc_lo(sq, 16), lk = desc_lo(ks, 16);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t half = kk >> 2, sub = (kk & 3) * 32;
    wgmma_ss(s, desc2(lq + ((half * (kRows * 128) + sub) >> 4)), desc2(lk + ((half * (kN * 128) + sub) >> 4)), kk > 0);
  }
}
// O += P V: V k-step = 16 keys = two 8-key groups of 1024 B; the two 64-dim halves 16 KB apart.
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[8][4], uint32_t vs) {
  const uint32_t lv = desc_lo(vs, kN * 128);
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) wgmma_rs(o, pa[kk], desc2(lv + kk * (2048 >> 4)));
}
#endif  // MS_WGMMA_ATTN

}  // namespace moeserve::cuda::attn_wg
