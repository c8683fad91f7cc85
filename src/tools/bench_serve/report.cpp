#include "tools/bench_serve/report.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <ctime>

#include "core/python_repr.h"

namespace moeserve::bench {

namespace {

const MetricStats& stats_of(const BenchmarkMetrics& m, const std::string& name) {
  if (name == "ttft") return m.ttft;
  if (name == "tpot") return m.tpot;
  if (name == "itl") return m.itl;
  return m.e2el;
}

struct MetricLabel {
  const char* key;
  const char* name;
  const char* header;
};
constexpr MetricLabel kMetrics[] = {{"ttft", "TTFT", "Time to First Token"},
                                    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
                                    {"itl", "ITL", "Inter-token Latency"},
                                    {"e2el", "E2EL", "End-to-end Latency"}};

bool selected(const RunInfo& info, const std::string& key) {
  for (const auto& k : info.percentile_metrics)
    if (k == key) return true;
  return false;
}

// Python's "{:<40} {:<10}" / "{:<40} {:<10.2f}" lines.
void row(std::string& s, const std::string& label, int64_t v) { s += fmt::format("{:<40} {:<10}\n", label, v); }
void rowf(std::string& s, const std::string& label, double v) { s += fmt::format("{:<40} {:<10.2f}\n", label, v); }

}  // namespace

std::string percentile_word(double p) {
  if (std::floor(p) == p) return fmt::format("{}", static_cast<int64_t>(p));
  return python_float_repr(p);
}

std::string format_report(const RunInfo& info, const BenchmarkMetrics& m, const std::optional<SpecDecodeStats>& spec) {
  std::string s;
  s += fmt::format("{:=^50}\n", " Serving Benchmark Result ");
  row(s, "Successful requests:", m.completed);
  row(s, "Failed requests:", m.failed);
  if (info.max_concurrency > 0) row(s, "Maximum request concurrency:", info.max_concurrency);
  if (!std::isinf(info.request_rate)) rowf(s, "Request rate configured (RPS):", info.request_rate);
  rowf(s, "Benchmark duration (s):", info.duration_s);
  row(s, "Total input tokens:", m.total_input);
  row(s, "Total generated tokens:", m.total_output);
  rowf(s, "Request throughput (req/s):", m.request_throughput);
  if (info.goodput) rowf(s, "Request goodput (req/s):", m.request_goodput);
  rowf(s, "Output token throughput (tok/s):", m.output_throughput);
  rowf(s, "Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  rowf(s, "Peak concurrent requests:", static_cast<double>(m.max_concurrent_requests));
  rowf(s, "Total token throughput (tok/s):", m.total_token_throughput);
  for (const auto& ml : kMetrics) {
    if (!selected(info, ml.key)) continue;
    const auto& st = stats_of(m, ml.key);
    s += fmt::format("{:-^50}\n", ml.header);
    rowf(s, fmt::format("Mean {} (ms):", ml.name), st.mean_ms);
    rowf(s, fmt::format("Median {} (ms):", ml.name), st.median_ms);
    for (const auto& [p, v] : st.percentiles_ms) rowf(s, fmt::format("P{} {} (ms):", percentile_word(p), ml.name), v);
  }
  if (spec) {
    s += fmt::format("{:-^50}\n", "Speculative Decoding");
    rowf(s, "Acceptance rate (%):", spec->acceptance_rate);
    rowf(s, "Acceptance length:", spec->acceptance_length);
    row(s, "Drafts:", spec->num_drafts);
    row(s, "Draft tokens:", spec->draft_tokens);
    row(s, "Accepted tokens:", spec->accepted_tokens);
    if (!spec->per_position_acceptance_rates.empty()) {
      s += "Per-position acceptance (%):\n";
      for (size_t i = 0; i < spec->per_position_acceptance_rates.size(); ++i)
        rowf(s, fmt::format("  Position {}:", i), spec->per_position_acceptance_rates[i] * 100.0);
    }
  }
  s.append(50, '=');
  s += '\n';
  return s;
}

std::string metric_glossary() {
  return "Metric definitions (vllm bench serve) and their names in other tools:\n"
         "  TTFT  first chunk with choices - send   | AIPerf TTFT | GuideLLM TTFT (TTFOT: first content) | llmperf TTFT "
         "(first non-empty content)\n"
         "  TPOT  (E2EL - TTFT) / (tokens - 1)      | AIPerf ITL  | GuideLLM ITL                          | llmperf "
         "~inter_token_latency (E2EL / tokens)\n"
         "  ITL   gaps between chunks (per chunk)   | AIPerf ICL  | -                                     | -\n"
         "  E2EL  last token chunk - send           | request latency | request latency                   | end-to-end "
         "latency\n"
         "  Output tok/s  usage tokens / duration   | output token throughput | output tok/s              | overall "
         "output throughput\n";
}

nlohmann::json result_json(const RunInfo& info, const BenchmarkMetrics& m, const std::vector<RequestOutput>& outputs,
                           const std::optional<SpecDecodeStats>& spec) {
  using nlohmann::json;
  json r;
  std::time_t t = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&t));
  r["date"] = date;
  r["endpoint_type"] = info.backend;
  r["backend"] = info.backend;
  r["label"] = nullptr;
  r["model_id"] = info.model_id;
  r["tokenizer_id"] = info.tokenizer_id;
  r["num_prompts"] = info.num_prompts;
  r["request_rate"] = std::isinf(info.request_rate) ? json("inf") : json(info.request_rate);
  r["burstiness"] = info.burstiness;
  r["max_concurrency"] = info.max_concurrency > 0 ? json(info.max_concurrency) : json(nullptr);
  r["ignore_eos"] = info.ignore_eos;
  r["duration"] = info.duration_s;
  r["completed"] = m.completed;
  r["failed"] = m.failed;
  r["total_input_tokens"] = m.total_input;
  r["total_output_tokens"] = m.total_output;
  r["request_throughput"] = m.request_throughput;
  r["request_goodput"] = info.goodput ? json(m.request_goodput) : json(nullptr);
  r["output_throughput"] = m.output_throughput;
  r["total_token_throughput"] = m.total_token_throughput;
  json input_lens = json::array(), ttfts = json::array(), itls = json::array(), lats = json::array(),
       starts = json::array(), queues = json::array(), texts = json::array(), errors = json::array();
  for (const auto& o : outputs) {
    input_lens.push_back(o.prompt_len);
    ttfts.push_back(o.ttft);
    itls.push_back(o.itl);
    lats.push_back(o.latency);
    starts.push_back(o.start_time);
    queues.push_back(o.queue_time);
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  r["input_lens"] = input_lens;
  r["output_lens"] = m.output_lens;
  r["ttfts"] = ttfts;
  r["itls"] = itls;
  r["latencies"] = lats;
  r["start_times"] = starts;
  r["queue_times"] = queues;
  r["generated_texts"] = texts;
  r["errors"] = errors;
  r["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  r["max_concurrent_requests"] = m.max_concurrent_requests;
  for (const auto& ml : kMetrics) {
    if (!selected(info, ml.key)) continue;
    const auto& st = stats_of(m, ml.key);
    r[fmt::format("mean_{}_ms", ml.key)] = st.mean_ms;
    r[fmt::format("median_{}_ms", ml.key)] = st.median_ms;
    r[fmt::format("std_{}_ms", ml.key)] = st.std_ms;
    for (const auto& [p, v] : st.percentiles_ms) r[fmt::format("p{}_{}_ms", percentile_word(p), ml.key)] = v;
  }
  if (spec) {
    r["spec_decode_acceptance_rate"] = spec->acceptance_rate;
    r["spec_decode_acceptance_length"] = spec->acceptance_length;
    r["spec_decode_num_drafts"] = spec->num_drafts;
    r["spec_decode_draft_tokens"] = spec->draft_tokens;
    r["spec_decode_accepted_tokens"] = spec->accepted_tokens;
    r["spec_decode_per_position_acceptance_rates"] = spec->per_position_acceptance_rates;
  }
  return r;
}

}  // namespace moeserve::bench
