// vLLM's speculative-decoding counters on /metrics and the periodic "SpecDecoding metrics" line.
#include <gtest/gtest.h>

#include "server/metrics.h"

namespace moeserve::server {
namespace {

EngineStats spec_stats(uint64_t drafts, uint64_t drafted, uint64_t accepted, std::vector<uint64_t> per_pos) {
  EngineStats s;
  s.spec_k = int(per_pos.size());
  s.spec_num_drafts = drafts;
  s.spec_num_draft_tokens = drafted;
  s.spec_num_accepted_tokens = accepted;
  s.spec_accepted_per_pos = std::move(per_pos);
  return s;
}

TEST(SpecMetrics, CountersOnlyWithSpeculation) {
  Metrics m({"my-model", 1000, 16, 100, true, 0.9});
  EXPECT_EQ(m.render(EngineStats{}).find("spec_decode"), std::string::npos);
  const std::string out = m.render(spec_stats(10, 30, 17, {9, 5, 3}));
  const std::string labels = "model_name=\"my-model\",engine=\"0\"";
  EXPECT_NE(out.find("# TYPE vllm:spec_decode_num_drafts counter"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:spec_decode_num_drafts_total{" + labels + "} 10"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:spec_decode_num_draft_tokens_total{" + labels + "} 30"), std::string::npos);
  EXPECT_NE(out.find("vllm:spec_decode_num_accepted_tokens_total{" + labels + "} 17"), std::string::npos);
  for (auto [pos, v] : {std::pair{0, 9}, {1, 5}, {2, 3}})
    EXPECT_NE(out.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{" + labels + ",position=\"" +
                       std::to_string(pos) + "\"} " + std::to_string(v)),
              std::string::npos)
        << out;
}

TEST(SpecMetrics, ChosenKCountersAndGauge) {
  Metrics m({"my-model", 1000, 16, 100, true, 0.9});
  EngineStats s = spec_stats(10, 30, 17, {9, 5, 3});
  EXPECT_EQ(m.render(s).find("moeserve:spec_decode"), std::string::npos);  // no choices recorded
  s.spec_adaptive = true;
  s.spec_chosen_k = {40, 1, 2, 7};
  s.spec_k_explorations = 3;
  s.spec_last_k = 3;
  const std::string out = m.render(s);
  const std::string labels = "model_name=\"my-model\",engine=\"0\"";
  EXPECT_NE(out.find("# TYPE moeserve:spec_decode_chosen_k counter"), std::string::npos) << out;
  for (auto [k, v] : {std::pair{0, 40}, {1, 1}, {2, 2}, {3, 7}})
    EXPECT_NE(out.find("moeserve:spec_decode_chosen_k_total{" + labels + ",k=\"" + std::to_string(k) + "\"} " +
                       std::to_string(v)),
              std::string::npos)
        << out;
  EXPECT_NE(out.find("moeserve:spec_decode_k_explorations_total{" + labels + "} 3"), std::string::npos) << out;
  EXPECT_NE(out.find("# TYPE moeserve:spec_decode_k gauge"), std::string::npos) << out;
  EXPECT_NE(out.find("moeserve:spec_decode_k{" + labels + "} 3"), std::string::npos) << out;
}

TEST(SpecMetrics, LogLineAsVllm) {
  const EngineStats prev = spec_stats(10, 30, 17, {9, 5, 3});
  const EngineStats now = spec_stats(110, 330, 245, {95, 85, 65});  // +100 drafts, +300 drafted, +228 accepted
  EXPECT_EQ(spec_decoding_log_line(prev, now, 10.0),
            "SpecDecoding metrics: Mean acceptance length: 3.28, Accepted throughput: 22.80 tokens/s, Drafted "
            "throughput: 30.00 tokens/s, Accepted: 228 tokens, Drafted: 300 tokens, Per-position acceptance rate: "
            "0.860, 0.800, 0.620, Avg Draft acceptance rate: 76.0%");
}

}  // namespace
}  // namespace moeserve::server
