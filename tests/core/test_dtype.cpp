// Dtype conversions against independent double-precision formulas.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

using namespace moeserve;

// E4M3 ("fn") decoded from first principles in double.
static double fp8_reference(int code) {
  int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  double v = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -v : v;
}

TEST(DType, AllFp8E4M3Codes) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    double ref = fp8_reference(c);
    float got = fp8_e4m3_to_f32(uint8_t(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(double(got), ref) << "code " << c;
    // Round trip: every finite code encodes back to itself (+0/-0 keep their sign).
    EXPECT_EQ(f32_to_fp8_e4m3(got), uint8_t(c)) << "code " << c;
  }
  EXPECT_EQ(nans, 2);  // 0x7F and 0xFF
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(DType, Fp8EncodeRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(f32_to_fp8_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(NAN), 0x7f);
  // 1.0 = 0x38, next 1.125 = 0x39. 1.0625 is the midpoint: ties to even -> 0x38.
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);
  // 1.125..1.25 midpoint 1.1875 -> even code 0x3a (1.25).
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3a);
  EXPECT_EQ(f32_to_fp8_e4m3(1.07f), 0x39);
  // Exhaustive nearest check on a grid.
  for (double xd = -460; xd <= 460; xd += 0.37) {
    double x = double(float(xd));  // the value actually encoded
    uint8_t c = f32_to_fp8_e4m3(float(x));
    double got = fp8_reference(c);
    double best = 1e9;
    for (int k = 0; k < 256; ++k) {
      double r = fp8_reference(k);
      if (!std::isnan(r)) best = std::min(best, std::fabs(r - std::clamp(x, -448.0, 448.0)));
    }
    ASSERT_EQ(std::fabs(got - std::clamp(x, -448.0, 448.0)), best) << x;
  }
}

TEST(DType, Bf16RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even -> 1.0
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> up
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(f32_to_bf16(3.4e38f), 0x7f80);  // rounds past the max finite bf16 to Inf
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every finite bf16 round-trips
    float f = bf16_to_f32(uint16_t(b));
    if (std::isnan(f)) { EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f)))); continue; }
    ASSERT_EQ(f32_to_bf16(f), b) << b;
  }
}

TEST(DType, F16AllCodesRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    uint16_t h = uint16_t(b);
    int e = (h >> 10) & 31, m = h & 1023;
    double ref = e == 0 ? std::ldexp(double(m), -24) : e == 31 ? (m ? NAN : INFINITY)
                                                              : std::ldexp(1.0 + m / 1024.0, e - 15);
    if (h & 0x8000) ref = -ref;
    float got = f16_to_f32(h);
    if (std::isnan(ref)) { ASSERT_TRUE(std::isnan(got)); continue; }
    ASSERT_EQ(double(got), ref) << b;
    ASSERT_EQ(f32_to_f16(got), h) << b;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
}

TEST(DType, ParseNames) {
  DType t;
  for (const char* n : {"F32", "F16", "BF16", "F8_E4M3", "I32", "I64", "U8", "BOOL"}) {
    ASSERT_TRUE(parse_dtype(n, &t)) << n;
    EXPECT_EQ(dtype_name(t), n);
  }
  EXPECT_FALSE(parse_dtype("F8_E5M2X", &t));
}
