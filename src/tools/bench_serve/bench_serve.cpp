#include "tools/bench_serve/bench_serve.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/python_repr.h"
#include "tokenizer/tokenizer.h"
#include "tools/bench_serve/client.h"
#include "tools/bench_serve/report.h"
#include "core/bounded_json.h"

namespace moeserve::bench {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed) {
  MS_CHECK(rate > 0, "--request-rate must be > 0 (inf: send all at once)");
  MS_CHECK(burstiness > 0, "--burstiness must be > 0, got {}", burstiness);
  std::vector<double> t(n, 0.0);
  if (std::isinf(rate) || n == 0) return t;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gamma(burstiness, 1.0 / (rate * burstiness));
  double acc = 0;
  for (size_t i = 0; i < n; ++i) t[i] = acc += std::isinf(burstiness) ? 1.0 / rate : gamma(rng);
  // vLLM rescales so that the last release lands exactly at n / rate (steadier throughput
  // across seeds than the raw gamma sum, which misses by 1-2%).
  if (t.back() > 0) {
    const double k = (static_cast<double>(n) / rate) / t.back();
    for (double& x : t) x *= k;
  }
  return t;
}

namespace {

std::string fmt_clock(double s) {
  auto v = static_cast<int64_t>(s);
  return fmt::format("{:02}:{:02}", v / 60, v % 60);
}

// tqdm-like bar on a terminal (stderr), a plain line every 10% otherwise.
class Progress {
 public:
  Progress(size_t total, bool enabled) : total_(total), enabled_(enabled), tty_(isatty(2) != 0) {}
  void update(size_t done) {
    if (!enabled_) return;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double rate = el > 0 ? static_cast<double>(done) / el : 0;
    if (tty_) {
      const int width = 30;
      const int fill = static_cast<int>(width * done / std::max<size_t>(total_, 1));
      const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0;
      std::fprintf(stderr, "\r%3d%%|%s%s| %zu/%zu [%s<%s, %.2f req/s]", static_cast<int>(100 * done / total_),
                   std::string(fill, '#').c_str(), std::string(width - fill, ' ').c_str(), done, total_,
                   fmt_clock(el).c_str(), fmt_clock(eta).c_str(), rate);
      if (done == total_) std::fputc('\n', stderr);
    } else {
      const size_t step = std::max<size_t>(1, total_ / 10);
      if (done % step == 0 || done == total_)
        std::fprintf(stderr, "progress: %zu/%zu requests done (%.1f s, %.2f req/s)\n", done, total_, el, rate);
    }
    std::fflush(stderr);
  }

 private:
  size_t total_;
  bool enabled_, tty_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

bool has_tokenizer(const std::string& dir) { return !dir.empty() && fs::exists(fs::path(dir) / "tokenizer.json"); }

std::string request_body(const BenchOptions& o, const std::string& model, bool chat, const SampleRequest& s,
                         const json& extra) {
  json b;
  b["model"] = model;
  if (chat) {
    b["messages"] = json::array({{{"role", "user"}, {"content", s.prompt}}});
    b["max_completion_tokens"] = s.expected_output_len;
  } else {
    b["prompt"] = s.prompt;
    b["max_tokens"] = s.expected_output_len;
  }
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) b["ignore_eos"] = true;
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b.dump();
}

}  // namespace

int run_bench(const BenchOptions& o) {
  const BaseUrl url = parse_base_url(o.base_url.empty() ? fmt::format("http://{}:{}", o.host, o.port) : o.base_url);
  MS_CHECK(!o.endpoint.empty() && o.endpoint[0] == '/', "--endpoint must start with '/', got '{}'", o.endpoint);
  std::string backend = o.backend;
  if (backend.empty()) backend = o.endpoint.find("chat/completions") != std::string::npos ? "openai-chat" : "openai";
  MS_CHECK(backend == "openai" || backend == "openai-chat" || backend == "vllm",
           "--backend must be openai, openai-chat or vllm, got '{}'", backend);
  const bool chat = backend == "openai-chat";
  MS_CHECK(chat ? o.endpoint.ends_with("chat/completions") : o.endpoint.ends_with("completions"),
           "--endpoint {} does not fit backend {} (expected .../{})", o.endpoint, backend,
           chat ? "chat/completions" : "completions");
  const auto percentiles = parse_percentiles(o.metric_percentiles);
  const auto pmetrics = parse_percentile_metrics(o.percentile_metrics);
  const auto goodput = parse_goodput(o.goodput);
  json extra = json::object();
  if (!o.extra_body.empty()) {
    extra = moeserve::parse_json_bounded_or_discarded(o.extra_body);
    MS_CHECK(!extra.is_discarded() && extra.is_object(), "--extra-body must be a JSON object, got {}", o.extra_body);
  }
  std::string api_key = o.api_key;
  if (api_key.empty() && std::getenv("OPENAI_API_KEY")) api_key = std::getenv("OPENAI_API_KEY");

  // Model: --model, else the server's first model. The served model's `root` (its path on
  // the server) is a tokenizer candidate when this machine can read it.
  std::string model_id = o.model, root;
  try {
    auto r = http_get(url, "/v1/models", api_key, 30);
    MS_CHECK(r.status == 200, "GET {}/v1/models: HTTP {}: {}", url.str(), r.status, r.body.substr(0, 300));
    auto j = moeserve::parse_json_bounded_or_discarded(r.body);
    MS_CHECK(!j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
                 j["data"][0].contains("id"),
             "GET {}/v1/models: no models in the answer", url.str());
    if (model_id.empty()) model_id = j["data"][0]["id"].get<std::string>();
    if (j["data"][0].contains("root") && j["data"][0]["root"].is_string()) root = j["data"][0]["root"];
  } catch (const Error& e) {
    if (o.model.empty())
      fail("Failed to fetch models from the server at {}/v1/models (is it running, is the URL right?): {}", url.str(),
           e.what());
  }
  const std::string request_model = o.served_model_name.empty() ? model_id : o.served_model_name;
  std::string tok_dir = o.tokenizer;
  MS_CHECK(tok_dir.empty() || has_tokenizer(tok_dir), "--tokenizer {}: no tokenizer.json there", tok_dir);
  if (tok_dir.empty() && has_tokenizer(o.model)) tok_dir = o.model;
  if (tok_dir.empty() && has_tokenizer(root)) tok_dir = root;
  std::shared_ptr<const Tokenizer> tok;
  if (!tok_dir.empty()) tok = Tokenizer::from_dir(tok_dir);
  std::printf("Model: %s   tokenizer: %s\n", model_id.c_str(), tok ? tok_dir.c_str() : "none");

  std::string note;
  const auto samples = sample_requests(o.dataset, tok.get(), &note);
  if (!note.empty()) std::printf("Note: %s\n", note.c_str());

  LoadPlan plan;
  plan.url = url;
  plan.endpoint = o.endpoint;
  plan.chat = chat;
  plan.api_key = api_key;
  plan.max_concurrency = o.max_concurrency;

  // Ready check: the first request alone; connection errors and 503 (a server that binds
  // first answers 503 while its model loads) are retried until the timeout, any other HTTP
  // error fails at once.
  if (o.ready_check_timeout_sec > 0) {
    std::printf("Starting initial single prompt test run...\n");
    std::fflush(stdout);
    LoadPlan one = plan;
    one.bodies = {request_body(o, request_model, chat, samples[0], extra)};
    one.prompt_lens = {samples[0].prompt_len};
    one.arrival_s = {0.0};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.ready_check_timeout_sec);
    for (;;) {
      double d = 0;
      auto out = run_load(one, &d)[0];
      if (out.success) break;
      const bool http_error = out.error.rfind("HTTP ", 0) == 0 && out.error.rfind("HTTP 503", 0) != 0;
      if (http_error || std::chrono::steady_clock::now() >= deadline)
        fail("Initial test run failed - Please make sure benchmark arguments are correctly specified. Error: {} "
             "({}{})", out.error, url.str(), o.endpoint);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    std::printf("Initial test run completed.\n");
  } else {
    std::printf("Skipping endpoint ready check.\n");
  }

  MS_CHECK(o.num_warmups >= 0, "--num-warmups must be >= 0");
  if (o.num_warmups > 0) {
    std::printf("Warming up with %d requests...\n", o.num_warmups);
    std::fflush(stdout);
    LoadPlan warm = plan;
    warm.bodies.assign(o.num_warmups, request_body(o, request_model, chat, samples[0], extra));
    warm.prompt_lens.assign(o.num_warmups, samples[0].prompt_len);
    warm.arrival_s.assign(o.num_warmups, 0.0);
    double d = 0;
    run_load(warm, &d);
    std::printf("Warmup run completed.\n");
  }

  for (const auto& s : samples) {
    plan.bodies.push_back(request_body(o, request_model, chat, s, extra));
    plan.prompt_lens.push_back(s.prompt_len);
  }
  plan.arrival_s = arrival_times(samples.size(), o.request_rate, o.burstiness, o.dataset.seed);
  std::printf("Starting main benchmark run...\n");
  std::printf("Traffic request rate: %s\n", python_float_repr(o.request_rate).c_str());
  std::printf("Burstiness factor: %s (%s)\n", python_float_repr(o.burstiness).c_str(),
              o.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
  std::printf("Maximum request concurrency: %s\n",
              o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "None");
  std::fflush(stdout);

  auto scrape = [&]() -> std::optional<SpecDecodeCounters> {
    try {
      auto r = http_get(url, "/metrics", api_key, 30);
      if (r.status != 200) return std::nullopt;
      return parse_spec_decode_metrics(r.body);
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  const auto spec_before = scrape();
  Progress progress(samples.size(), !o.disable_tqdm);
  plan.on_done = [&](size_t done) { progress.update(done); };
  double duration = 0;
  const auto outputs = run_load(plan, &duration);
  const auto spec = spec_decode_delta(spec_before, scrape());

  size_t shown = 0;
  for (const auto& out : outputs) {
    if (out.success) continue;
    if (shown == 0) std::printf("Failed requests during benchmark run detected (capping to 10):\n");
    if (shown < 10) std::printf("Error %zu: %s\n", shown, out.error.c_str());
    ++shown;
  }
  MetricsInput in;
  in.outputs = &outputs;
  in.duration_s = duration;
  in.percentiles = percentiles;
  in.goodput_ms = goodput;
  if (tok) in.count_tokens = [&](const std::string& t) { return static_cast<int64_t>(tok->encode(t, false).size()); };
  const auto m = compute_metrics(in);
  if (m.completed == 0)
    std::printf("WARNING: All requests failed. This is likely due to a misconfiguration on the benchmark arguments.\n");

  RunInfo info;
  info.backend = backend;
  info.endpoint = o.endpoint;
  info.base_url = url.str();
  info.model_id = model_id;
  info.tokenizer_id = tok ? tok_dir : "";
  info.num_prompts = static_cast<int64_t>(samples.size());
  info.request_rate = o.request_rate;
  info.burstiness = o.burstiness;
  info.max_concurrency = o.max_concurrency;
  info.ignore_eos = o.ignore_eos;
  info.duration_s = duration;
  info.percentile_metrics = pmetrics;
  info.percentiles = percentiles;
  info.goodput = !goodput.empty();
  std::fputs(format_report(info, m, spec).c_str(), stdout);
  if (o.explain_metrics) std::fputs(metric_glossary().c_str(), stdout);
  std::fflush(stdout);
  if (!o.result_json.empty()) {
    std::ofstream f(o.result_json);
    MS_CHECK(f.good(), "cannot write --result-json {}", o.result_json);
    f << result_json(info, m, outputs, spec).dump() << "\n";
    MS_CHECK(f.good(), "error writing --result-json {}", o.result_json);
  }
  return m.completed > 0 ? 0 : 1;
}

}  // namespace moeserve::bench
