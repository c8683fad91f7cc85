// Prometheus text exposition with vLLM's metric names, types, labels and buckets
// (serving-api.md §8). Request-level metrics are observed by the server as requests finish;
// engine gauges and cache counters are read from Engine::stats() at scrape time.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace moeserve::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  // Renders bucket counts kept elsewhere (per bucket, not cumulative; last = +Inf).
  static void render_counts(std::string& out, const std::string& name, const std::string& labels,
                            const std::vector<double>& bounds, const std::vector<uint64_t>& counts, double sum);
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (non-cumulative); last = +Inf
  uint64_t count_ = 0;
  double sum_ = 0;
};

std::vector<double> buckets_1_2_5(double max_value);

struct FinishedRequestStats {
  std::string finished_reason;  // stop | length | abort | error (tool_calls counts as stop)
  int prompt_tokens = 0;
  int generation_tokens = 0;
  double e2e_seconds = 0;
  double ttft_seconds = -1;  // < 0: no token was produced
  int n = 1;
  int max_tokens = 0;
  int max_generation_tokens = 0;
  // Engine phases (RequestOutput timestamps); < 0: the phase was not reached.
  double queue_seconds = -1;      // queued -> first scheduled
  double prefill_seconds = -1;    // first scheduled -> first token
  double decode_seconds = -1;     // first token -> last token
  double inference_seconds = -1;  // first scheduled -> last token
};

// Fills the phase durations of `s` from an engine output's timestamps.
void set_phase_times(FinishedRequestStats& s, const RequestOutput& out);

struct MetricsConfig {
  std::string model_name;
  int max_model_len = 4096;
  int block_size = 16;
  int num_kv_blocks = 0;
  bool enable_prefix_caching = true;
  double gpu_memory_utilization = 0.9;
};

class Metrics {
 public:
  explicit Metrics(MetricsConfig cfg);
  void observe_ttft(double seconds);
  void observe_itl(double seconds, int count = 1);
  // One per choice (engine request).
  void observe_finished(const FinishedRequestStats& s);
  // One per API request: n and max_tokens histograms.
  void observe_request_params(int n, int max_tokens, int max_generation_tokens);
  std::string render(const EngineStats& engine) const;
  // Tokens delivered to clients so far, counted as they are produced (observe_ttft and
  // observe_itl); the periodic stats line turns it into the generation throughput.
  uint64_t tokens_produced() const;

 private:
  MetricsConfig cfg_;
  std::string labels_;  // model_name="...",engine="0"
  mutable std::mutex mu_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, tokens_produced_ = 0;
  std::map<std::string, uint64_t> success_;
  Histogram ttft_, itl_, tpot_, e2e_, prompt_len_, gen_len_, max_gen_len_, params_n_, params_max_tokens_;
  Histogram queue_, prefill_, decode_, inference_;
};

// vLLM's periodic "SpecDecoding metrics: Mean acceptance length: ..." line over the counters'
// change from `prev` to `now` (dt seconds); speculation must be on (now.spec_k > 0).
std::string spec_decoding_log_line(const EngineStats& prev, const EngineStats& now, double dt);

}  // namespace moeserve::server
