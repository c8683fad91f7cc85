// `moeserve bench`: HTTP load generator against any OpenAI-compatible server, with the flags,
// defaults and metric definitions of `vllm bench serve` (src/tools/bench_serve/).
#include <cmath>
#include <limits>
#include <memory>

#include "cli/registry.h"
#include "core/error.h"
#include "core/parse.h"
#include "tools/bench_serve/bench_serve.h"

namespace {

double parse_rate(const std::string& s, const char* flag) {
  if (s == "inf" || s == "Inf" || s == "infinity") return std::numeric_limits<double>::infinity();
  double v = 0;
  const size_t used = moeserve::parse_number_prefix(s, &v);
  MS_CHECK(used == s.size() && !s.empty() && v > 0 && !std::isnan(v), "{} must be a positive number or inf, got '{}'",
           flag, s);
  return v;
}

moeserve::cli::RegisterSubcommand reg(
    "bench", "Benchmark an OpenAI-compatible server (like `vllm bench serve`)", [](CLI::App* sub) {
      auto o = std::make_shared<moeserve::bench::BenchOptions>();
      auto rate = std::make_shared<std::string>("inf");
      auto burst = std::make_shared<std::string>("1.0");
      auto& d = o->dataset;
      sub->option_defaults()->group("Server");
      sub->add_option("--base-url", o->base_url, "server base URL, e.g. http://127.0.0.1:8000 (default: --host/--port)");
      sub->add_option("--host", o->host, "server host when --base-url is not given")->capture_default_str();
      sub->add_option("--port", o->port, "server port when --base-url is not given")->capture_default_str();
      sub->add_option("--endpoint", o->endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
      sub->add_option("--backend", o->backend, "openai (completions) or openai-chat; default: from --endpoint");
      sub->add_option("--model", o->model, "model name sent in requests (default: first of GET /v1/models)");
      sub->add_option("--served-model-name", o->served_model_name, "name sent as \"model\" when it differs from --model");
      sub->add_option("--tokenizer", o->tokenizer,
                      "directory with tokenizer.json (default: --model or the server's model root if local)");
      sub->option_defaults()->group("Dataset");
      sub->add_option("--dataset-name,--dataset", d.name, "random, sharegpt or jsonl")->capture_default_str();
      sub->add_option("--dataset-path", d.path, "ShareGPT JSON or JSONL ({\"prompt\", \"output_len\"} per line) file");
      sub->add_option("--num-prompts", d.num_prompts, "requests to send")->capture_default_str();
      sub->add_option("--random-input-len", d.random_input_len, "random: prompt tokens")->capture_default_str();
      sub->add_option("--random-output-len", d.random_output_len, "random: output tokens")->capture_default_str();
      sub->add_option("--random-range-ratio", d.random_range_ratio,
                      "random: lengths uniform in [L(1-r), L(1+r)]; 0 = fixed")->capture_default_str();
      sub->add_option("--sharegpt-output-len", d.sharegpt_output_len, "sharegpt: fixed output length");
      sub->add_option("--seed", d.seed, "seed for prompts and arrivals")->capture_default_str();
      sub->option_defaults()->group("Load");
      sub->add_option("--max-concurrency", o->max_concurrency, "client-side limit on requests in flight (default: none)");
      sub->add_option("--request-rate", *rate, "requests/s (inf: all at once)")->capture_default_str();
      sub->add_option("--burstiness", *burst, "gamma shape of inter-arrival times (1 = Poisson)")->capture_default_str();
      sub->add_flag("--ignore-eos", o->ignore_eos, "send ignore_eos so every request generates its full length");
      sub->add_option("--extra-body", o->extra_body, "JSON object merged into every request body");
      sub->option_defaults()->group("Results and output");
      sub->add_option("--percentile-metrics", o->percentile_metrics, "comma list of ttft, tpot, itl, e2el")
          ->capture_default_str();
      sub->add_option("--metric-percentiles", o->metric_percentiles, "comma list, e.g. 50,90,99")
          ->capture_default_str();
      sub->add_option("--goodput", o->goodput, "SLOs as KEY:MS pairs (ttft, tpot, e2el), e.g. --goodput ttft:500 tpot:50");
      sub->add_option("--result-json,--result-filename", o->result_json, "write the results (vLLM's keys) to this file");
      sub->add_option("--ready-check-timeout-sec", o->ready_check_timeout_sec,
                      "retry the first request while the server refuses connections (0: skip the check)")
          ->capture_default_str();
      sub->add_option("--num-warmups", o->num_warmups, "requests sent (and not measured) before the run")
          ->capture_default_str();
      sub->add_flag("--explain-metrics", o->explain_metrics,
                    "after the results, print how TTFT/TPOT/ITL/E2EL map to AIPerf, GuideLLM and llmperf names");
      sub->add_flag("--disable-tqdm", o->disable_tqdm, "no progress output");
      return [o, rate, burst]() {
        o->request_rate = parse_rate(*rate, "--request-rate");
        o->burstiness = parse_rate(*burst, "--burstiness");
        return moeserve::bench::run_bench(*o);
      };
    });

}  // namespace
