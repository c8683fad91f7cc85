// `moeserve bench` output: the results table printed like vllm bench serve's
// "============ Serving Benchmark Result ============" block (same labels, widths and
// 2-decimal formats, so outputs can be compared line by line) and the --result-json
// object with vLLM's key names (request_throughput, mean_ttft_ms, p99_ttft_ms, ttfts, itls, ...).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tools/bench_serve/metrics.h"

namespace moeserve::bench {

struct RunInfo {
  std::string backend;   // "openai" (/v1/completions) or "openai-chat"
  std::string endpoint;  // e.g. /v1/completions
  std::string base_url, model_id, tokenizer_id;
  int64_t num_prompts = 0;
  double request_rate = 0;  // +inf: all at once
  double burstiness = 1.0;
  int max_concurrency = 0;  // 0: none
  bool ignore_eos = false;
  double duration_s = 0;
  std::vector<std::string> percentile_metrics;  // ttft, tpot, itl, e2el
  std::vector<double> percentiles;
  bool goodput = false;
};

// "P99", "P99.9": the percentile's name in labels and keys (Python's str(p) unless integral).
std::string percentile_word(double p);
std::string format_report(const RunInfo& info, const BenchmarkMetrics& m, const std::optional<SpecDecodeStats>& spec);
// How these metrics map onto other tools' names (AIPerf/GenAI-Perf, GuideLLM, llmperf), for
// --explain-metrics.
std::string metric_glossary();
nlohmann::json result_json(const RunInfo& info, const BenchmarkMetrics& m, const std::vector<RequestOutput>& outputs,
                           const std::optional<SpecDecodeStats>& spec);

}  // namespace moeserve::bench
