// The golden fixtures' location and the normalised error the golden bounds are stated in,
// shared by the model, CUDA and NCCL tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tools/generate.h"

namespace moeserve::test {

// tests/fixtures/golden/<name> under MOESERVE_SOURCE_DIR (CTest sets it; else the working dir).
inline std::filesystem::path golden_fixture(const std::string& name) {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return std::filesystem::path(src ? src : ".") / "tests" / "fixtures" / "golden" / name;
}

// A fixture's HF reference: golden.json's prompt and greedy ids, ref_logits.npy [generated, V]
// and, with `full`, ref_full_logits.npy [full_rows, V] (every position of prompt + generated).
struct GoldenRef {
  std::vector<int32_t> prompt, generated;
  std::vector<float> logits, full_logits;
  int64_t vocab = 0, full_rows = 0;
};

inline GoldenRef load_golden(const std::string& name, bool full = false) {
  GoldenRef g;
  const std::filesystem::path d = golden_fixture(name);
  std::ifstream f(d / "golden.json");
  EXPECT_TRUE(f.good()) << d;
  if (!f.good()) return g;
  const auto j = nlohmann::json::parse(f);
  g.prompt = j["prompt_ids"].get<std::vector<int32_t>>();
  g.generated = j["generated_ids"].get<std::vector<int32_t>>();
  int64_t rows = 0;
  g.logits = read_npy_f32((d / "ref_logits.npy").string(), &rows, &g.vocab);
  EXPECT_EQ(rows, int64_t(g.generated.size()));
  if (full) {
    int64_t v2 = 0;
    g.full_logits = read_npy_f32((d / "ref_full_logits.npy").string(), &g.full_rows, &v2);
    EXPECT_EQ(v2, g.vocab);
  }
  return g;
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
