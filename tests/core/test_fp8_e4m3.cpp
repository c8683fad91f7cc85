// The FP8 KV cache's e4m3 conversion (core/fp8_e4m3.h; the CUDA KV write kernels compile the
// same header): all 256 codes, the rounding edges and saturation, checked against the table
// decoder and the independent search-based encoder of core/dtype.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/dtype.h"
#include "core/fp8_e4m3.h"

namespace moeserve {
namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST(Fp8E4M3, DecodesAll256CodesLikeTheTable) {
  for (int c = 0; c < 256; ++c) {
    const float got = fp8::e4m3_to_f32(uint8_t(c)), want = fp8_e4m3_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      EXPECT_TRUE((c & 0x7f) == 0x7f) << c;
      continue;
    }
    EXPECT_EQ(bits(got), bits(want)) << "code " << c;  // bitwise: -0 stays -0
  }
  EXPECT_EQ(fp8::e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(fp8::e4m3_to_f32(0xfe), -448.f);
  EXPECT_EQ(fp8::e4m3_to_f32(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(fp8::e4m3_to_f32(0x08), std::ldexp(1.f, -6));
}

TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN codes: encoded back as 0x7f (below)
    EXPECT_EQ(fp8::e4m3_from_f32(fp8::e4m3_to_f32(uint8_t(c))), uint8_t(c)) << "code " << c;
  }
}

TEST(Fp8E4M3, MidpointsRoundToEvenAndNeighboursToNearest) {
  for (int sign = 0; sign < 2; ++sign) {
    for (int c = 0; c < 0x7e; ++c) {
      const float lo = fp8_e4m3_to_f32(uint8_t(c)), hi = fp8_e4m3_to_f32(uint8_t(c + 1));
      const float mid = 0.5f * (lo + hi);  // exact in f32 (e4m3 has 3 mantissa bits)
      const float s = sign ? -1.f : 1.f;
      const uint8_t sb = sign ? 0x80 : 0;
      const uint8_t even = uint8_t((c & 1) == 0 ? c : c + 1);
      EXPECT_EQ(fp8::e4m3_from_f32(s * mid), sb | even) << "midpoint of " << c;
      EXPECT_EQ(fp8::e4m3_from_f32(s * std::nextafter(mid, 0.f)), sb | uint8_t(c)) << "below midpoint of " << c;
      EXPECT_EQ(fp8::e4m3_from_f32(s * std::nextafter(mid, 1e9f)), sb | uint8_t(c + 1)) << "above midpoint of " << c;
    }
  }
}

TEST(Fp8E4M3, SaturatesNanAndSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp8::e4m3_from_f32(448.f), 0x7e);
  EXPECT_EQ(fp8::e4m3_from_f32(463.99f), 0x7e);  // would round to 448 anyway
  EXPECT_EQ(fp8::e4m3_from_f32(464.f), 0x7e);    // RNE would give 512 (no such code): saturate
  EXPECT_EQ(fp8::e4m3_from_f32(1e30f), 0x7e);
  EXPECT_EQ(fp8::e4m3_from_f32(-1000.f), 0xfe);
  EXPECT_EQ(fp8::e4m3_from_f32(inf), 0x7e);  // __NV_SATFINITE: +-inf -> +-max finite
  EXPECT_EQ(fp8::e4m3_from_f32(-inf), 0xfe);
  EXPECT_EQ(fp8::e4m3_from_f32(std::nanf("")), 0x7f);
  EXPECT_EQ(fp8::e4m3_from_f32(-std::nanf("")), 0x7f);
  EXPECT_EQ(fp8::e4m3_from_f32(0.f), 0x00);
  EXPECT_EQ(fp8::e4m3_from_f32(-0.f), 0x80);
  EXPECT_EQ(fp8::e4m3_from_f32(std::ldexp(1.f, -10)), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(fp8::e4m3_from_f32(std::nextafter(std::ldexp(1.f, -10), 1.f)), 0x01);
  EXPECT_EQ(fp8::e4m3_from_f32(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(fp8::e4m3_from_f32(-std::numeric_limits<float>::min()), 0x80);
}

// Every 97th f32 bit pattern (44 million values over all exponents) encodes like the
// search-based f32_to_fp8_e4m3 of core/dtype.cpp.
TEST(Fp8E4M3, MatchesTheSearchEncoderOverAllFloats) {
  int64_t n = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 97) {
    const float x = from_bits(uint32_t(u));
    const uint8_t want = f32_to_fp8_e4m3(x), got = fp8::e4m3_from_f32(x);
    if (std::isnan(x)) {
      ASSERT_EQ(got, 0x7f);
      continue;
    }
    // The table encoder gives -0 for tiny negatives as we do; compare bitwise.
    ASSERT_EQ(got, want) << "x = " << x << " bits " << std::hex << u;
    ++n;
  }
  EXPECT_GT(n, 40000000);
}

TEST(Fp8E4M3, KvStoreAndLoadApplyTheScale) {
  EXPECT_EQ(fp8::kv_store(2.f, 0.5f), fp8::e4m3_from_f32(4.f));
  EXPECT_EQ(fp8::kv_load(fp8::e4m3_from_f32(4.f), 0.5f), 2.f);
  EXPECT_EQ(fp8::kv_store(1000.f, 2.f), 0x7e);  // 500 saturates to 448
  EXPECT_EQ(fp8::kv_load(0x7e, 2.f), 896.f);
}

}  // namespace
}  // namespace moeserve
