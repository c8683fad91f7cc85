// bench-model --verify-tokens (tools/bench_verify.h): the synthetic routing's overlap and
// distinctness, the distinct-expert count, the speedup formula, and a whole CPU run of the
// tiny synthetic MiniMax-M2 (bench-model --device cpu) with its JSON rows.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "tools/bench_model.h"
#include "tools/bench_verify.h"

using namespace moeserve;
using namespace moeserve::tools;

namespace {

// Mean |S_t n S_(t-1)| / K over consecutive tokens of each sequence; checks every row's K ids
// are distinct and in range.
double mean_overlap(const std::vector<std::vector<int32_t>>& ids, const std::vector<int>& qlens, int E, int K) {
  double sum = 0;
  int64_t pairs = 0;
  for (const auto& L : ids) {
    size_t t = 0;
    for (int q : qlens)
      for (int i = 0; i < q; ++i, ++t) {
        std::set<int32_t> row(L.begin() + t * K, L.begin() + (t + 1) * K);
        EXPECT_EQ(int(row.size()), K) << "ids of one token must be distinct";
        EXPECT_GE(*row.begin(), 0);
        EXPECT_LT(*row.rbegin(), E);
        if (i == 0) continue;
        std::set<int32_t> prev(L.begin() + (t - 1) * K, L.begin() + t * K);
        int same = 0;
        for (int32_t e : row) same += int(prev.count(e));
        sum += double(same) / K;
        ++pairs;
      }
  }
  return pairs ? sum / pairs : 0;
}

nlohmann::json run_cpu(BenchModelOptions o) {
  const std::string path = ::testing::TempDir() + "bench_verify_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
  o.json_out = path;
  EXPECT_EQ(run_bench_model_cpu(o), 0);
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

BenchModelOptions tiny() {
  BenchModelOptions o;
  o.device = "cpu";
  o.synthetic = "minimax-m2-tiny";  // 32 experts top-4
  o.layers = 2;
  o.batches = {1, 3};
  o.contexts = {40};
  o.verify_tokens = {0, 2};
  o.iters = 2;
  return o;
}

const nlohmann::json& row(const nlohmann::json& r, int B, int k) {
  for (const auto& x : r["verify"]["rows"])
    if (x["batch"] == B && x["k"] == k) return x;
  throw std::runtime_error("no row");
}

}  // namespace

TEST(BenchVerifyRouting, OverlapOneRepeatsTheFirstTokensExperts) {
  const std::vector<int> qlens = {4, 4, 1};
  const auto ids = synth_verify_routing({3, 32, 4, 1.0, 7}, qlens);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_DOUBLE_EQ(mean_overlap(ids, qlens, 32, 4), 1.0);
  const DistinctExperts d = count_distinct_experts(ids, 4, qlens);
  EXPECT_DOUBLE_EQ(d.per_layer_per_seq, 4.0);
  EXPECT_GE(d.per_layer, 4.0);  // the three sequences' first tokens are independent
}

TEST(BenchVerifyRouting, OverlapZeroSharesNothingWithThePreviousToken) {
  const std::vector<int> qlens = {5, 5};
  const auto ids = synth_verify_routing({4, 32, 4, 0.0, 3}, qlens);
  EXPECT_DOUBLE_EQ(mean_overlap(ids, qlens, 32, 4), 0.0);
  // Each token is disjoint from the one before: at least 2K distinct per sequence.
  EXPECT_GE(count_distinct_experts(ids, 4, qlens).per_layer_per_seq, 8.0);
}

TEST(BenchVerifyRouting, FractionalOverlapHasThatMean) {
  // P * K = 8 * 0.3 = 2.4: 2 kept, a third with probability 0.4; over many pairs the mean is P.
  const std::vector<int> qlens(64, 9);
  const auto ids = synth_verify_routing({16, 256, 8, 0.3, 11}, qlens);
  EXPECT_NEAR(mean_overlap(ids, qlens, 256, 8), 0.3, 0.01);
  // Deterministic in the seed, different across seeds.
  EXPECT_EQ(ids, synth_verify_routing({16, 256, 8, 0.3, 11}, qlens));
  EXPECT_NE(ids, synth_verify_routing({16, 256, 8, 0.3, 12}, qlens));
}

TEST(BenchVerifyRouting, RefusesImpossibleSpecs) {
  EXPECT_THROW(synth_verify_routing({1, 8, 4, 1.5, 1}, {2}), Error);
  EXPECT_THROW(synth_verify_routing({1, 6, 4, 0.0, 1}, {2}), Error);  // two disjoint top-4 of 6
  EXPECT_NO_THROW(synth_verify_routing({1, 6, 4, 0.5, 1}, {2}));       // keeps 2: needs 6
}

TEST(BenchVerifyRouting, CountsDistinctPerStepAndPerSequence) {
  // K = 2; sequence 0: {0,1},{1,2}; sequence 1: {5,6}. Layer 1 the same but sequence 1 {0,1}.
  const std::vector<std::vector<int32_t>> ids = {{0, 1, 1, 2, 5, 6}, {0, 1, 1, 2, 0, 1}};
  const DistinctExperts d = count_distinct_experts(ids, 2, {2, 1});
  EXPECT_DOUBLE_EQ(d.per_layer, (5.0 + 3.0) / 2);
  EXPECT_DOUBLE_EQ(d.per_layer_per_seq, ((3.0 + 2.0) / 2 + (3.0 + 2.0) / 2) / 2);
  EXPECT_NEAR(expected_distinct_uniform(256, 8, 4), 256.0 * (1 - 923521.0 / 1048576.0), 1e-9);  // (31/32)^4
}

TEST(BenchVerifyRouting, SpeedupIsAcceptLengthTimesTheTimeRatio) {
  EXPECT_DOUBLE_EQ(spec_speedup(2.5, 3, 10.0, 12.5).get<double>(), 2.0);
  EXPECT_TRUE(spec_speedup(2.5, 1, 10.0, 12.5).is_null());  // 1 + k = 2 tokens at most
  EXPECT_DOUBLE_EQ(spec_speedup(2.0, 1, 10.0, 10.0).get<double>(), 2.0);
}

TEST(BenchVerifyCpu, RowsFieldsAndRouterRouting) {
  const nlohmann::json r = run_cpu(tiny());
  EXPECT_EQ(r["device"], "cpu");
  const auto& v = r["verify"];
  EXPECT_EQ(v["rows"].size(), 4u);  // batches {1, 3} x k {0, 2}
  EXPECT_EQ(v["top_k"], 4);
  EXPECT_NE(v["note"].get<std::string>().find("draft"), std::string::npos);
  for (int B : {1, 3}) {
    const auto& d = row(r, B, 0);
    const auto& s = row(r, B, 2);
    EXPECT_GT(d["step_ms"].get<double>(), 0);
    EXPECT_DOUBLE_EQ(d["ratio_vs_decode"].get<double>(), 1.0);
    EXPECT_EQ(s["query_tokens_per_seq"], 3);
    EXPECT_EQ(s["tokens"], 3 * B);
    EXPECT_NEAR(s["ratio_vs_decode"].get<double>(), s["step_ms"].get<double>() / d["step_ms"].get<double>(), 1e-9);
    for (const char* a : {"2.2", "2.5", "3.0"})
      EXPECT_NEAR(s["speedup_at_accept_len"][a].get<double>(),
                  std::stod(a) * d["step_ms"].get<double>() / s["step_ms"].get<double>(), 1e-9);
    // The router's picks (random weights): one token reads exactly top-k; three tokens of a
    // sequence more than that.
    EXPECT_DOUBLE_EQ(d["distinct_experts_per_layer_per_seq"].get<double>(), 4.0);
    EXPECT_GT(s["distinct_experts_per_layer_per_seq"].get<double>(), 4.0);
    EXPECT_LE(s["distinct_experts_per_layer_per_seq"].get<double>(), 12.0);
    EXPECT_GE(s["distinct_experts_per_layer"].get<double>(), s["distinct_experts_per_layer_per_seq"].get<double>());
    EXPECT_EQ(s["routing"], "router");
  }
  EXPECT_TRUE(v["eagle3_k3"].empty());  // no k = 3 rows asked
}

TEST(BenchVerifyCpu, FullOverlapReadsExactlyTopKPerSequence) {
  BenchModelOptions o = tiny();
  o.verify_tokens = {0, 2, 3};
  o.routing_overlap = 1.0;
  const nlohmann::json r = run_cpu(o);
  EXPECT_EQ(r["verify"]["routing"]["overlap"], 1.0);
  for (int B : {1, 3}) {
    for (int k : {2, 3}) {
      const auto& s = row(r, B, k);
      EXPECT_EQ(s["routing"], "synthetic");
      EXPECT_DOUBLE_EQ(s["distinct_experts_per_layer_per_seq"].get<double>(), 4.0);
      if (B == 1) {
        EXPECT_DOUBLE_EQ(s["distinct_experts_per_layer"].get<double>(), 4.0);
      }
    }
    EXPECT_EQ(row(r, B, 0)["routing"], "router");  // decode rows keep the router
  }
  ASSERT_EQ(r["verify"]["eagle3_k3"].size(), 2u);
  const auto& e = r["verify"]["eagle3_k3"][0];
  EXPECT_NEAR(e["speedup_at_accept_len"]["2.5"].get<double>(), 2.5 * e["decode_ms"].get<double>() / e["verify_ms"].get<double>(), 1e-9);
}

TEST(BenchVerifyCpu, ZeroOverlapReadsMoreThanRandomOfOneToken) {
  BenchModelOptions o = tiny();
  o.routing_overlap = 0.0;
  const nlohmann::json r = run_cpu(o);
  // Token i + 1 shares nothing with token i: at least 2K of the 3 tokens' 3K per sequence.
  EXPECT_GE(row(r, 1, 2)["distinct_experts_per_layer_per_seq"].get<double>(), 8.0);
}

TEST(BenchVerifyCpu, BadOptionsAreClearErrors) {
  BenchModelOptions o = tiny();
  o.routing_overlap = 1.5;
  EXPECT_THROW(run_bench_model_cpu(o), Error);
  o = tiny();
  o.verify_tokens = {-1};
  EXPECT_THROW(run_bench_model_cpu(o), Error);
  o = tiny();
  o.verify_tokens.clear();
  o.routing_overlap = 0.5;
  EXPECT_THROW(run_bench_model_cpu(o), Error);
  o = tiny();
  o.device = "tpu";
  EXPECT_THROW(run_bench_model_cpu(o), Error);
  o = tiny();
  o.synthetic = "no-such-model";
  EXPECT_THROW(run_bench_model_cpu(o), Error);
}
