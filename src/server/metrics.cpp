#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

#include "server/json_text.h"

namespace moeserve::server {

static std::string num(double v) { return py_float_repr(v); }

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  count_++;
  sum_ += v;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  render_counts(out, name, labels, bounds_, counts_, sum_);
}

void Histogram::render_counts(std::string& out, const std::string& name, const std::string& labels,
                              const std::vector<double>& bounds, const std::vector<uint64_t>& counts, double sum) {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cum += counts[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, num(bounds[i]), num(static_cast<double>(cum)));
  }
  cum += counts.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, num(static_cast<double>(cum)));
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, num(static_cast<double>(cum)));
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, num(sum));
}

void set_phase_times(FinishedRequestStats& s, const RequestOutput& o) {
  using TP = std::chrono::steady_clock::time_point;
  auto secs = [](TP a, TP b) { return std::chrono::duration<double>(b - a).count(); };
  if (o.queued_time == TP{} || o.scheduled_time == TP{}) return;  // never scheduled
  s.queue_seconds = secs(o.queued_time, o.scheduled_time);
  if (o.first_token_time == TP{}) return;
  s.prefill_seconds = secs(o.scheduled_time, o.first_token_time);
  s.decode_seconds = secs(o.first_token_time, o.last_token_time);
  s.inference_seconds = secs(o.scheduled_time, o.last_token_time);
}

std::vector<double> buckets_1_2_5(double max_value) {
  std::vector<double> b;
  for (double m = 1;; m *= 10) {
    for (double k : {1.0, 2.0, 5.0}) {
      if (k * m > max_value) return b;
      b.push_back(k * m);
    }
  }
}

static const std::vector<double> kTtft = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const std::vector<double> kItl = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const std::vector<double> kE2e = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,  15.0, 20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

Metrics::Metrics(MetricsConfig cfg)
    : cfg_(std::move(cfg)),
      ttft_(kTtft),
      itl_(kItl),
      tpot_(kItl),
      e2e_(kE2e),
      prompt_len_(buckets_1_2_5(cfg_.max_model_len)),
      gen_len_(buckets_1_2_5(cfg_.max_model_len)),
      max_gen_len_(buckets_1_2_5(cfg_.max_model_len)),
      params_n_({1, 2, 5, 10, 20}),
      params_max_tokens_(buckets_1_2_5(cfg_.max_model_len)),
      queue_(kE2e),
      prefill_(kE2e),
      decode_(kE2e),
      inference_(kE2e) {
  labels_ = "model_name=" + json_string(cfg_.model_name) + ",engine=\"0\"";
  for (const char* r : {"stop", "length", "abort", "error"}) success_[r] = 0;
}

void Metrics::observe_ttft(double s) {
  std::lock_guard lk(mu_);
  ttft_.observe(s);
  ++tokens_produced_;
}

void Metrics::observe_itl(double s, int count) {
  std::lock_guard lk(mu_);
  for (int i = 0; i < count; ++i) itl_.observe(s / count);
  tokens_produced_ += uint64_t(std::max(count, 0));
}

void Metrics::observe_finished(const FinishedRequestStats& s) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += s.prompt_tokens;
  generation_tokens_ += s.generation_tokens;
  std::string reason = s.finished_reason == "tool_calls" ? "stop" : s.finished_reason;
  success_[reason]++;
  e2e_.observe(s.e2e_seconds);
  prompt_len_.observe(s.prompt_tokens);
  gen_len_.observe(s.generation_tokens);
  if (s.generation_tokens > 1 && s.ttft_seconds >= 0)
    tpot_.observe((s.e2e_seconds - s.ttft_seconds) / (s.generation_tokens - 1));
  if (s.queue_seconds >= 0) queue_.observe(s.queue_seconds);
  if (s.prefill_seconds >= 0) prefill_.observe(s.prefill_seconds);
  if (s.decode_seconds >= 0) decode_.observe(s.decode_seconds);
  if (s.inference_seconds >= 0) inference_.observe(s.inference_seconds);
}

void Metrics::observe_request_params(int n, int max_tokens, int max_generation_tokens) {
  std::lock_guard lk(mu_);
  params_n_.observe(n);
  params_max_tokens_.observe(max_tokens);
  max_gen_len_.observe(max_generation_tokens);
}

std::string Metrics::render(const EngineStats& es) const {
  std::string out;
  out.reserve(16384);
  auto head = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto sample = [&](const std::string& name, double v, const std::string& extra = "") {
    out += fmt::format("{}{{{}{}}} {}\n", name, labels_, extra, num(v));
  };
  head("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
  sample("vllm:num_requests_running", es.num_running);
  head("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  sample("vllm:num_requests_waiting", es.num_waiting);
  head("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  sample("vllm:kv_cache_usage_perc", es.kv_cache_usage);
  head("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens.");
  sample("vllm:prefix_cache_queries_total", static_cast<double>(es.prefix_cache_queries));
  head("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.");
  sample("vllm:prefix_cache_hits_total", static_cast<double>(es.prefix_cache_hits));
  head("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.");
  sample("vllm:num_preemptions_total", static_cast<double>(es.num_preemptions));
  if (es.spec_k > 0) {  // registered only with a speculative config, as vLLM
    head("vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.");
    sample("vllm:spec_decode_num_drafts_total", static_cast<double>(es.spec_num_drafts));
    head("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.");
    sample("vllm:spec_decode_num_draft_tokens_total", static_cast<double>(es.spec_num_draft_tokens));
    head("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.");
    sample("vllm:spec_decode_num_accepted_tokens_total", static_cast<double>(es.spec_num_accepted_tokens));
    head("vllm:spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.");
    for (size_t i = 0; i < es.spec_accepted_per_pos.size(); ++i)
      sample("vllm:spec_decode_num_accepted_tokens_per_pos_total", static_cast<double>(es.spec_accepted_per_pos[i]),
             fmt::format(",position=\"{}\"", i));
  }
  head("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  out += fmt::format(
      "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"{}\","
      "gpu_memory_utilization=\"{}\",num_gpu_blocks=\"{}\",engine=\"0\"}} 1.0\n",
      cfg_.block_size, cfg_.enable_prefix_caching ? "True" : "False", num(cfg_.gpu_memory_utilization),
      cfg_.num_kv_blocks);

  std::lock_guard lk(mu_);
  head("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.");
  sample("vllm:prompt_tokens_total", static_cast<double>(prompt_tokens_));
  head("vllm:generation_tokens", "counter", "Number of generation tokens processed.");
  sample("vllm:generation_tokens_total", static_cast<double>(generation_tokens_));
  head("vllm:request_success", "counter", "Count of successfully processed requests.");
  for (auto& [reason, count] : success_)
    sample("vllm:request_success_total", static_cast<double>(count), ",finished_reason=\"" + reason + "\"");
  auto hist = [&](const char* name, const char* help, const Histogram& h) {
    head(name, "histogram", help);
    h.render(out, name, labels_);
  };
  hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
  hist("vllm:request_generation_tokens", "Number of generation tokens processed.", gen_len_);
  hist("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
       max_gen_len_);
  hist("vllm:request_params_n", "Histogram of the n request parameter.", params_n_);
  hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", params_max_tokens_);
  hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
  hist("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", tpot_);
  hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_);
  hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", queue_);
  hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", inference_);
  hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", prefill_);
  hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", decode_);
  head("vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.");
  const auto& ib = EngineStats::kIterationTokenBuckets;
  Histogram::render_counts(out, "vllm:iteration_tokens_total", labels_, std::vector<double>(ib.begin(), ib.end()),
                           std::vector<uint64_t>(es.iteration_tokens.begin(), es.iteration_tokens.end()),
                           static_cast<double>(es.iteration_tokens_sum));
  // moeserve's own (no vLLM equivalent): where the engine thread's time goes, for the serving
  // overhead over the forward pass (host overhead per step = step - execute + loop gap).
  head("moeserve:engine_steps", "counter", "Engine steps run.");
  sample("moeserve:engine_steps_total", static_cast<double>(es.num_steps));
  head("moeserve:engine_step_seconds", "counter", "Wall time of engine steps (schedule to delivery).");
  sample("moeserve:engine_step_seconds_total", static_cast<double>(es.step_ns) * 1e-9);
  head("moeserve:engine_execute_seconds", "counter",
       "Wall time inside the model executor (forward, device sampling, downloads).");
  sample("moeserve:engine_execute_seconds_total", static_cast<double>(es.execute_ns) * 1e-9);
  head("moeserve:engine_loop_gap_seconds", "counter",
       "Engine loop time between a step and the next one while work was waiting.");
  sample("moeserve:engine_loop_gap_seconds_total", static_cast<double>(es.loop_gap_ns) * 1e-9);
  if (es.spec_k > 0 && !es.spec_chosen_k.empty()) {  // the per-step k (engine/spec_policy.h)
    head("moeserve:spec_decode_chosen_k", "counter",
         "Engine steps whose drafts were proposed with k drafts per sequence (0: a plain decode step).");
    for (size_t k = 0; k < es.spec_chosen_k.size(); ++k)
      sample("moeserve:spec_decode_chosen_k_total", static_cast<double>(es.spec_chosen_k[k]),
             fmt::format(",k=\"{}\"", k));
    head("moeserve:spec_decode_k_explorations", "counter",
         "Of those choices, the ones made to measure a k's step cost rather than by prediction.");
    sample("moeserve:spec_decode_k_explorations_total", static_cast<double>(es.spec_k_explorations));
    head("moeserve:spec_decode_k", "gauge", "The k chosen last (drafts per sequence for the next step).");
    sample("moeserve:spec_decode_k", es.spec_last_k);
  }
  return out;
}

uint64_t Metrics::tokens_produced() const {
  std::lock_guard<std::mutex> lk(mu_);
  return tokens_produced_;
}

}  // namespace moeserve::server

namespace moeserve::server {

std::string spec_decoding_log_line(const EngineStats& prev, const EngineStats& now, double dt) {
  const auto delta = [](uint64_t a, uint64_t b) { return a >= b ? a - b : 0; };
  const uint64_t drafts = delta(now.spec_num_drafts, prev.spec_num_drafts);
  const uint64_t drafted = delta(now.spec_num_draft_tokens, prev.spec_num_draft_tokens);
  const uint64_t accepted = delta(now.spec_num_accepted_tokens, prev.spec_num_accepted_tokens);
  const double secs = dt > 0 ? dt : 1.0;
  std::string per_pos;
  for (size_t i = 0; i < now.spec_accepted_per_pos.size(); ++i) {
    const uint64_t before = i < prev.spec_accepted_per_pos.size() ? prev.spec_accepted_per_pos[i] : 0;
    const double rate = drafts ? double(delta(now.spec_accepted_per_pos[i], before)) / double(drafts) : 0.0;
    per_pos += fmt::format("{}{:.3f}", i ? ", " : "", rate);
  }
  return fmt::format(
      "SpecDecoding metrics: Mean acceptance length: {:.2f}, Accepted throughput: {:.2f} tokens/s, Drafted "
      "throughput: {:.2f} tokens/s, Accepted: {} tokens, Drafted: {} tokens, Per-position acceptance rate: {}, Avg "
      "Draft acceptance rate: {:.1f}%",
      drafts ? 1.0 + double(accepted) / double(drafts) : 1.0, double(accepted) / secs, double(drafted) / secs,
      accepted, drafted, per_pos, drafted ? 100.0 * double(accepted) / double(drafted) : 0.0);
}

}  // namespace moeserve::server
