// `moeserve bench` metric math: pure functions over per-request measurements, with the
// definitions of `vllm bench serve` (vllm/benchmarks/serve.py, calculate_metrics):
//   TTFT  = first SSE message with non-empty `choices` minus send time;
//   ITL   = gaps between successive such messages (per chunk, not per token);
//   E2EL  = last such message minus send time (the trailing usage chunk is excluded);
//   TPOT  = (E2EL - TTFT) / (output_tokens - 1), only for requests with > 1 output token;
//   mean / median / std (population) / percentiles as numpy does (linear interpolation);
//   goodput = requests meeting every SLO given (ttft, tpot, e2el in ms) per second, where a
//   request with <= 1 output token counts TPOT as 0;
//   peak output tok/s = most tokens whose arrival falls in one 1-second bucket from the
//   first request's start; peak concurrency = sweep over half-open [start, start+E2EL).
// Times are seconds here; the *_ms fields are milliseconds.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::bench {

struct RequestOutput {
  bool success = false;
  std::string error;
  int64_t prompt_len = 0;     // usage.prompt_tokens when the server sent it, else the dataset's
  int64_t output_tokens = 0;  // usage.completion_tokens; 0 = absent
  double ttft = 0;            // s
  std::vector<double> itl;    // s, one gap per chunk after the first
  double latency = 0;         // s (E2EL)
  double start_time = 0;      // s since the benchmark started
  double queue_time = 0;      // s spent waiting for the client-side concurrency slot
  std::string generated_text;
};

struct MetricStats {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

struct BenchmarkMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  double request_throughput = 0, request_goodput = 0, output_throughput = 0, total_token_throughput = 0;
  MetricStats ttft, tpot, itl, e2el;
  double max_output_tokens_per_s = 0;
  int64_t max_concurrent_requests = 0;
  std::vector<int64_t> output_lens;  // per request; 0 for failed ones
};

// numpy.percentile(values, p) with the default linear method; p in [0, 100]. Empty -> 0
// (vLLM passes `values or 0`).
double percentile(std::vector<double> values, double p);
double mean(const std::vector<double>& values);
double stddev(const std::vector<double>& values);  // population (numpy default ddof=0)
MetricStats summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles);

// "50,90,99" -> {50, 90, 99}; each in [0, 100]. Throws moeserve::Error otherwise.
std::vector<double> parse_percentiles(const std::string& csv);
// "ttft,tpot,itl" -> names; each one of ttft, tpot, itl, e2el.
std::vector<std::string> parse_percentile_metrics(const std::string& csv);
// {"ttft:500", "tpot:50"} -> {ttft: 500, tpot: 50} (ms). Names ttft, tpot, e2el; values >= 0.
std::map<std::string, double> parse_goodput(const std::vector<std::string>& pairs);

struct MetricsInput {
  const std::vector<RequestOutput>* outputs = nullptr;
  double duration_s = 0;
  std::vector<double> percentiles;
  std::map<std::string, double> goodput_ms;  // empty: no goodput
  // Output length when the server sent no usage: tokenizer count of the generated text
  // (vLLM does this), or, without one, the number of token-bearing chunks.
  std::function<int64_t(const std::string&)> count_tokens;
};
BenchmarkMetrics compute_metrics(const MetricsInput& in);

// Speculative-decoding counters read from a Prometheus /metrics page: sums of the
// vllm:spec_decode_*_total series (over all label sets). nullopt when none is present.
struct SpecDecodeCounters {
  int64_t num_drafts = 0, num_draft_tokens = 0, num_accepted_tokens = 0;
  std::map<int, int64_t> accepted_per_pos;
};
std::optional<SpecDecodeCounters> parse_spec_decode_metrics(const std::string& prometheus_text);

struct SpecDecodeStats {
  int64_t num_drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  double acceptance_rate = 0;    // percent
  double acceptance_length = 0;  // 1 + accepted / drafts
  std::vector<double> per_position_acceptance_rates;  // fraction of drafts accepting position i
};
// The run's deltas; nullopt when either scrape is missing or no draft token was proposed.
std::optional<SpecDecodeStats> spec_decode_delta(const std::optional<SpecDecodeCounters>& before,
                                                 const std::optional<SpecDecodeCounters>& after);

}  // namespace moeserve::bench
