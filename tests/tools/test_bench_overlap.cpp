// bench-model --measure-routing-overlap on the trained demo model (assets/demo-model, 8 experts
// top-2): the router's overlap between consecutive tokens, measured on the CPU reference.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tools/bench_model.h"

using namespace moeserve;
using namespace moeserve::tools;

namespace {

std::string source_dir() {
  const char* s = std::getenv("MOESERVE_SOURCE_DIR");
  return s ? s : ".";
}

nlohmann::json run(const std::string& prompts, int decode_tokens) {
  BenchModelOptions o;
  o.device = "cpu";
  o.checkpoint = source_dir() + "/assets/demo-model";
  o.measure_routing_overlap = prompts;
  o.overlap_decode_tokens = decode_tokens;
  o.json_out = ::testing::TempDir() + "bench_overlap.json";
  EXPECT_EQ(run_bench_model_cpu(o), 0);
  std::ifstream f(o.json_out);
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(BenchOverlap, DemoModelConsecutiveTokens) {
  // The first 4 prompts of the spec-acceptance fixture, 12 greedy tokens each.
  std::ifstream in(source_dir() + "/tests/fixtures/spec_acceptance/prompts.json");
  nlohmann::json all = nlohmann::json::parse(in);
  nlohmann::json few = {{"prompts", nlohmann::json::array()}};
  for (int i = 0; i < 4; ++i) few["prompts"].push_back(all["prompts"][i]);
  const std::string path = ::testing::TempDir() + "overlap_prompts.json";
  std::ofstream(path) << few.dump();
  const nlohmann::json r = run(path, 12)["routing_overlap"];
  EXPECT_EQ(r["model_experts"], 8);
  EXPECT_EQ(r["top_k"], 2);
  EXPECT_EQ(r["moe_layers"], 6);
  EXPECT_DOUBLE_EQ(r["chance_overlap"].get<double>(), 0.25);
  const auto& g = r["generated"];
  EXPECT_GT(g["pairs"].get<int>(), 0);
  EXPECT_LE(g["pairs"].get<int>(), 4 * 11);
  EXPECT_EQ(r["prompt"]["pairs"].get<int>(), 4 * (96 - 1));
  for (const auto& p : {g["overlap"], r["prompt"]["overlap"]}) {
    EXPECT_GE(p.get<double>(), 0.0);
    EXPECT_LE(p.get<double>(), 1.0);
  }
  EXPECT_EQ(g["overlap_per_layer"].size(), 6u);
  // Distinct experts of w consecutive tokens lie between top-k and min(E, w * top-k).
  for (int w = 2; w <= 5; ++w) {
    const double d = g["distinct_per_layer_of_window"][std::to_string(w)].get<double>();
    EXPECT_GE(d, 2.0);
    EXPECT_LE(d, std::min(8.0, 2.0 * w));
  }
}

TEST(BenchOverlap, BadPromptFilesAreClearErrors) {
  const std::string bad = ::testing::TempDir() + "overlap_bad.json";
  std::ofstream(bad) << R"({"prompts": [[1, 2, 99999]]})";
  EXPECT_THROW(run(bad, 4), Error);
  std::ofstream(bad) << "not json";
  EXPECT_THROW(run(bad, 4), Error);
  EXPECT_THROW(run(::testing::TempDir() + "no_such_file.json", 4), Error);
}
