// The FP8 (OCP E4M3, "e4m3fn") conversions of the FP8 KV cache, as one header compiled both by
// the host compiler (CPU backend, tests) and by nvcc (the CUDA KV write kernels), so the CPU
// reference and the GPU store exactly the same bytes for the same input.
//
// E4M3: bias 7, no infinities, S.1111.111 is NaN, max finite 448, smallest normal 2^-6,
// subnormals m * 2^-9. Store: saturating round-to-nearest-even (what CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and vLLM's KV cache write do): |x| >= 448
// and +-inf -> +-448, NaN -> 0x7f. Integer arithmetic only (no rint, no rounding mode), C++17
// (nvcc compiles the backend as C++17).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MS_FP8_HD __host__ __device__ __forceinline__
#else
#define MS_FP8_HD inline
#endif

namespace moeserve::fp8 {

MS_FP8_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

MS_FP8_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// f32 -> e4m3 bits: saturating RNE (see the header comment).
MS_FP8_HD uint8_t e4m3_from_f32(float x) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;           // NaN
  if (a >= 0x43e00000u) return sign | 0x7eu;  // >= 448 (and inf): saturate
  if (a >= 0x3c800000u) {                     // >= 2^-6: normal; round the 20 dropped mantissa bits
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    return sign | uint8_t((r >> 20) - (120u << 3));  // rebias 127 -> 7; a carry bumps the exponent
  }
  // Subnormal range: code = RNE(|x| * 2^9) in 0..8 (8 = 2^-6 is the smallest normal code 0x08).
  // |x| = m * 2^(e - 150) with the implicit bit (f32 normals; f32 subnormals round to 0 below).
  const uint32_t e = a >> 23;
  if (e == 0) return sign;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 141u - e;  // >= 21 here (e <= 120)
  if (shift >= 25) return sign;     // |x| * 2^9 < 1/2
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return sign | uint8_t(q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u));
}

// e4m3 bits -> f32 (exact).
MS_FP8_HD float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 0xf && m == 7) return bits_f32(0x7fc00000u | sign);      // NaN
  if (e == 0) return bits_f32(f32_bits(float(m) * 0.001953125f) | sign);  // m * 2^-9 (exact)
  return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

// The KV cache store / load of one element with the layer's per-tensor scale (vLLM's
// k_scale / v_scale): stored = e4m3(x / scale), read = e4m3 * scale.
MS_FP8_HD uint8_t kv_store(float x, float scale) { return e4m3_from_f32(x / scale); }
MS_FP8_HD float kv_load(uint8_t b, float scale) { return e4m3_to_f32(b) * scale; }

}  // namespace moeserve::fp8
