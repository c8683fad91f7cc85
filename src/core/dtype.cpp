#include "core/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace moeserve {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::F8_E4M3: case DType::U8: case DType::BOOL: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  static constexpr std::array<DType, 8> all = {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                                               DType::I32, DType::I64, DType::U8, DType::BOOL};
  for (DType t : all) {
    if (dtype_name(t) == name) { *out = t; return true; }
  }
  return false;
}

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

uint16_t f32_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest, ties to even; overflow rounds to Inf correctly
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    float v = std::ldexp(float(man), -24);  // subnormal (or zero): man * 2^-24, exact
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t f32_to_f16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to Inf
  float a = std::bit_cast<float>(abs);
  if (a < 6.103515625e-05f) {  // below the smallest normal: quantise to multiples of 2^-24
    float q = std::nearbyint(a * 16777216.0f);  // default rounding mode is RNE
    return sign | uint16_t(q);
  }
  uint32_t lsb = (abs >> 13) & 1u;
  abs += 0xfffu + lsb;
  uint32_t exp = (abs >> 23) - 112u;
  return sign | uint16_t((exp << 10) | ((abs >> 13) & 0x3ffu));
}

namespace {
std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
    float v;
    if (exp == 0xf && man == 7) v = NAN;
    else if (exp == 0) v = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
    else v = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
    t[b] = sign ? -v : v;
  }
  return t;
}
const std::array<float, 256> kFp8Table = make_fp8_table();
}  // namespace

float fp8_e4m3_to_f32(uint8_t bits) { return kFp8Table[bits]; }

uint8_t f32_to_fp8_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7e;
  // Find the nearest representable magnitude; ties to the even code (lower mantissa bit 0).
  // Magnitudes are monotonic in the code for codes 0..0x7e.
  int lo = 0, hi = 0x7e;
  while (lo < hi) {  // first code whose value >= a
    int mid = (lo + hi) / 2;
    if (kFp8Table[mid] < a) lo = mid + 1; else hi = mid;
  }
  int code = lo;
  if (code > 0) {
    float up = kFp8Table[code], down = kFp8Table[code - 1];
    if (a - down < up - a || (a - down == up - a && ((code - 1) & 1) == 0)) code -= 1;
  }
  return sign | uint8_t(code);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: { auto* s = static_cast<const uint16_t*>(src); for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]); return; }
    case DType::F16: { auto* s = static_cast<const uint16_t*>(src); for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]); return; }
    case DType::F8_E4M3: { auto* s = static_cast<const uint8_t*>(src); for (size_t i = 0; i < n; ++i) dst[i] = kFp8Table[s[i]]; return; }
    case DType::I32: { auto* s = static_cast<const int32_t*>(src); for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]); return; }
    case DType::I64: { auto* s = static_cast<const int64_t*>(src); for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]); return; }
    case DType::U8: case DType::BOOL: { auto* s = static_cast<const uint8_t*>(src); for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]); return; }
  }
  fail("convert_to_f32: unsupported dtype");
}

}  // namespace moeserve
