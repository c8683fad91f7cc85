// Golden test of the shipped demo model (assets/demo-model, bf16, and assets/demo-model/fp8):
// the CPU model against Hugging Face transformers float32 logits on chat prompts
// (tests/fixtures/golden/demo_{bf16,fp8}, written by scripts/demo_ship.py).
// Same bound as the tiny fixtures: max|d| / max|ref| <= 1e-4 over every logit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "golden_fixture.h"
#include "tools/generate.h"
#include "runtime/model_executor.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

constexpr double kTol = 1e-4;

fs::path source_dir() {
  const char* s = std::getenv("MOESERVE_SOURCE_DIR");
  return fs::path(s ? s : ".");
}

struct Variant {
  std::string name;       // fixture folder under tests/fixtures/golden
  std::string model_sub;  // model folder under assets/demo-model
};

// Readable test names in CTest (else gtest prints the struct's bytes).
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class DemoGolden : public ::testing::TestWithParam<Variant> {};

TEST_P(DemoGolden, GreedyLogitsMatchTransformers) {
  const Variant v = GetParam();
  const fs::path ref = source_dir() / "tests" / "fixtures" / "golden" / v.name;
  const fs::path model = source_dir() / "assets" / "demo-model" / v.model_sub;
  std::ifstream f(ref / "golden.json");
  ASSERT_TRUE(f.good()) << ref;
  const auto j = nlohmann::json::parse(f);
  ASSERT_GE(j["cases"].size(), 3u);
  ExecutorOptions eo;
  eo.model_dir = model.string();
  eo.block_size = 16;
  eo.num_kv_blocks = 128;
  auto exec = make_cpu_executor(eo);
  for (size_t k = 0; k < j["cases"].size(); ++k) {
    const auto& c = j["cases"][k];
    GenerateOptions o;
    o.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["generated_ids"].get<std::vector<int32_t>>();
    o.max_tokens = int(want.size());
    o.keep_logits = true;
    const auto res = generate(*exec, o);
    int64_t rows = 0, vocab = 0;
    const auto logits = read_npy_f32((ref / ("ref_logits_" + std::to_string(k) + ".npy")).string(), &rows, &vocab);
    ASSERT_EQ(rows, int64_t(want.size()));
    EXPECT_EQ(res.generated_ids, want) << c["name"];
    const double err = test::max_rel_err(res.logits, logits);
    std::printf("[demo golden] %s %s (%zu prompt tokens): max|d|/max|ref| = %.3g\n", v.name.c_str(),
                c["name"].get<std::string>().c_str(), o.prompt_ids.size(), err);
    EXPECT_LE(err, kTol) << c["name"];
  }
}

// Prefill of prompt 0 + its generated tokens in one forward, chunked in 5-token steps over
// 4-token KV blocks: every position's logits (the causal mask over many rows) against HF.
TEST_P(DemoGolden, ChunkedPrefillMatchesTransformers) {
  const Variant v = GetParam();
  const fs::path ref = source_dir() / "tests" / "fixtures" / "golden" / v.name;
  std::ifstream f(ref / "golden.json");
  ASSERT_TRUE(f.good()) << ref;
  const auto c = nlohmann::json::parse(f)["cases"][0];
  GenerateOptions o;
  o.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = c["generated_ids"].get<std::vector<int32_t>>();
  o.max_tokens = int(want.size());
  o.keep_logits = true;
  o.prefill_chunk = 5;
  ExecutorOptions eo;
  eo.model_dir = (source_dir() / "assets" / "demo-model" / v.model_sub).string();
  eo.block_size = 4;
  eo.num_kv_blocks = 256;
  auto exec = make_cpu_executor(eo);
  const auto res = generate(*exec, o);
  int64_t rows = 0, vocab = 0;
  const auto logits = read_npy_f32((ref / "ref_logits_0.npy").string(), &rows, &vocab);
  EXPECT_EQ(res.generated_ids, want);
  EXPECT_LE(test::max_rel_err(res.logits, logits), kTol);
}

INSTANTIATE_TEST_SUITE_P(DemoModel, DemoGolden,
                         ::testing::Values(Variant{"demo_bf16", ""}, Variant{"demo_fp8", "fp8"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
