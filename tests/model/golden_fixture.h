// The golden fixtures' location and the normalised error the golden bounds are stated in,
// shared by the model, CUDA and NCCL tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace moeserve::test {

// tests/fixtures/golden/<name> under MOESERVE_SOURCE_DIR (CTest sets it; else the working dir).
inline std::filesystem::path golden_fixture(const std::string& name) {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return std::filesystem::path(src ? src : ".") / "tests" / "fixtures" / "golden" / name;
}

// max |a - b| / max |b|.
inline double max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace moeserve::test
