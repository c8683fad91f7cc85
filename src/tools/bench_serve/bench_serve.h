// `moeserve bench`: an HTTP load generator for any OpenAI-compatible server with the
// metric definitions and defaults of `vllm bench serve` (see metrics.h for the formulas,
// dataset.h for the workloads, client.h for the transport, report.h for the output).
// Flow: resolve the model (--model, else the first of GET /v1/models) and a tokenizer
// (--tokenizer, else --model or the served model's `root` when it is a local directory with
// tokenizer.json, else none), sample the requests, send the first one alone as a ready check,
// scrape /metrics, run the load with arrivals from --request-rate/--burstiness, scrape
// /metrics again, print the results table and write --result-json.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tools/bench_serve/dataset.h"

namespace moeserve::bench {

struct BenchOptions {
  std::string base_url;  // empty: http://host:port
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";
  std::string backend;  // openai | openai-chat; empty: from the endpoint
  std::string model;    // empty: first model of /v1/models
  std::string served_model_name;  // sent as "model" when set (vLLM's --served-model-name)
  std::string tokenizer;          // directory with tokenizer.json
  DatasetOptions dataset;
  int max_concurrency = 0;  // 0: unlimited
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  bool ignore_eos = false;
  std::string extra_body;  // JSON object merged into every request body
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  std::vector<std::string> goodput;  // "ttft:500" ...
  std::string result_json;           // file to write; empty: none
  double ready_check_timeout_sec = 600;
  int num_warmups = 0;  // copies of the first request sent (and discarded) before the run
  bool disable_tqdm = false;
  bool explain_metrics = false;  // print metric_glossary() after the results
  std::string api_key;  // default: env OPENAI_API_KEY
};

// Inter-arrival times as vLLM: gamma(shape=burstiness, scale=1/(rate*burstiness)) (burstiness 1 =
// Poisson), cumulated and rescaled so the last release is at n/rate; all zeros for an infinite rate.
std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed);

// Runs the benchmark, prints to stdout (progress on stderr); returns the exit code (0: at
// least one request completed). Throws moeserve::Error on bad options or an unreachable server.
int run_bench(const BenchOptions& opts);

}  // namespace moeserve::bench
