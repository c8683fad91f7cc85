// `moeserve serve MODEL_DIR`: the OpenAI-compatible HTTP server. Flags follow `vllm serve`.
// SIGTERM/SIGINT drain: stop accepting, let running requests finish for up to
// --shutdown-grace-seconds, abort the rest (their streams end with finish_reason "abort"
// and [DONE]), exit 0.
#include <condition_variable>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/model_source.h"
#include "cli/parallel_cli.h"
#include "cli/serve_args.h"
#include "cli/serve_stack.h"
#include "cli/registry.h"
#include "core/error.h"
#include "core/log.h"
#include "core/parse.h"
#include "core/bounded_json.h"
#include "engine/engine.h"
#include "engine/spec_config.h"
#include "engine/stop.h"
#include "server/gate_handler.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "server/sd_notify.h"
#include "server/parsers/parser.h"
#include "server/tokenizer_frontend.h"
#include "backend/factory.h"
#include "runtime/device_sampler.h"
#include "runtime/model_executor.h"
#include "tools/load_progress.h"
#include "tools/random_weights.h"
#ifdef MOESERVE_WITH_CUDA
#include "tools/synthetic_weights.h"
#endif
#ifdef MOESERVE_HAS_TEST_BACKENDS
#include "engine/testing/replay_executor.h"
#endif

namespace {

namespace fs = std::filesystem;
using namespace moeserve;

using cli::ServeArgs;

// As most servers do: the soft open-file limit up to the hard one, so that the connection
// cap (derived from it) is not the distribution's default of 1024.
void raise_open_file_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rlimit want = rl;
  want.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &want) != 0) spdlog::warn("cannot raise the open-file limit to {}", rl.rlim_max);
}

nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream f(p);
  MS_CHECK(f.good(), "cannot read {}", p.string());
  try {
    return moeserve::parse_json_bounded(std::string(std::istreambuf_iterator<char>(f), {}), p.string());
  } catch (const std::exception& e) {
    fail("{}: {}", p.string(), e.what());
  }
}

std::unique_ptr<ModelExecutor> make_executor(const ServeArgs& a, int max_model_len) {
#ifdef MOESERVE_HAS_TEST_BACKENDS
  if (!a.replay_script.empty()) {
    auto cfg = testing::replay_config_from_json(read_json_file(a.replay_script));
    if (a.num_kv_blocks > 0) cfg.num_kv_blocks = a.num_kv_blocks;
    cfg.block_size = a.block_size;
    return std::make_unique<testing::ReplayExecutor>(cfg);
  }
#endif
  MS_CHECK(a.device == "cpu" || a.device == "cuda", "--device {}: expected cpu or cuda", a.device);
  ExecutorOptions eo;
  eo.model_dir = a.model;
  eo.hf_overrides = a.hf_overrides;
  eo.block_size = a.block_size;
  eo.kv_cache_dtype = a.kv_cache_dtype;
  eo.max_model_len = max_model_len;
  eo.num_kv_blocks = a.num_kv_blocks;
  eo.max_num_seqs = a.max_num_seqs;
  eo.max_num_batched_tokens = a.max_num_batched_tokens;
  eo.enforce_eager = a.enforce_eager;
  eo.capture_graphs_at_startup = a.capture_graphs_at_startup;
  if (!a.speculative_config.empty())  // eagle3 / mtp: the executor loads the draft
    eo.speculative =
        parse_speculative_config(a.speculative_config, SpecParseContext{.tensor_parallel_size = a.par.tensor_parallel});
  if (a.load_format == "dummy") {
    // Random weights in the config's shapes, no checkpoint read: MiniMax-M2 with FP8 128x128
    // blocks on CUDA by bench-model's GPU generator (M2.5 at full size in seconds), any other
    // architecture / backend from its weight declarations on the host (tools/random_weights.h).
    eo.make_weights = [](Backend& be, Model& m, bool lm_head) {
      const auto t0 = std::chrono::steady_clock::now();
      int64_t bytes = -1;
      const char* where = "on the host";
#ifdef MOESERVE_WITH_CUDA
      bytes = tools::make_device_synthetic_weights(be, m, 1000, lm_head);
      if (bytes >= 0) where = "on the GPU";
#endif
      if (bytes < 0)
        bytes = tools::load_random_weights(m, tools::RandomWeightOptions{1000, lm_head, be.int4_experts_packed()});
      spdlog::log(be.device_index() == 0 ? spdlog::level::info : spdlog::level::debug,
                  "--load-format dummy: {:.2f} GiB of random {} weights made {} for {}:{} in {:.1f} s",
                  bytes / 1073741824.0, m.desc().architecture, where, be.name(), be.device_index(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    };
  }
#ifdef MOESERVE_WITH_CUDA
  MS_CHECK(a.device == "cpu" || (a.gpu_memory_utilization > 0 && a.gpu_memory_utilization <= 1),
           "--gpu-memory-utilization {}: expected a fraction in (0, 1]", a.gpu_memory_utilization);
  const double util = a.gpu_memory_utilization;
  // KV pool = what --gpu-memory-utilization leaves after the weights and the step workspaces
  // (already resident when this runs), less 512 MiB headroom (expert tables, decode graphs,
  // workspaces an unusually long prompt grows). Per GPU; a rank group takes the minimum.
  auto kv_blocks = [util, bs = a.block_size](Backend& be, int64_t per_block) {
    size_t free_b = 0, total_b = 0;
    MS_CHECK(be.memory_info(&free_b, &total_b), "{}: the backend reports no device memory", be.name());
    const double budget = double(total_b) * util - double(total_b - free_b) - double(512 << 20);
    const int64_t blocks = std::min<int64_t>(budget > 0 ? int64_t(budget / double(per_block)) : 0, INT32_MAX / 2);
    // Once per group (rank 0), not once per GPU: the ranks are alike.
    spdlog::log(be.device_index() == 0 ? spdlog::level::info : spdlog::level::debug,
                "{}:{} {} ({:.1f} GiB, {:.1f} GiB in use after the weights); --gpu-memory-utilization {} leaves "
                 "{} KV blocks of {} tokens = {} KV tokens ({:.1f} KiB per block)",
                 be.name(), be.device_index(), be.device_name(), total_b / 1073741824.0, (total_b - free_b) / 1073741824.0,
                 util, blocks, bs, blocks * bs, per_block / 1024.0);
    return int(blocks);
  };
  if (a.par.parallel())
    return cli::make_parallel_executor(a.par, eo, a.device,
                                       a.device == "cuda" ? std::function<int(Backend&, int64_t)>(kv_blocks) : nullptr);
  if (a.device == "cpu") return make_cpu_executor(eo);
  auto backend = make_backend("cuda", 0);
  Backend* cb = backend.get();
  eo.kv_blocks_for_memory = [cb, kv_blocks](int64_t per_block) { return kv_blocks(*cb, per_block); };
  eo.device_sampler = backend_device_sampler(*cb);  // used unless --host-sampling (EngineConfig)
  return std::make_unique<RankExecutor>(std::move(backend), eo);
#else
  if (a.par.parallel()) return cli::make_parallel_executor(a.par, eo, a.device);
  if (a.device == "cpu") return make_cpu_executor(eo);
  fail("--device cuda: this build has no CUDA backend (configure with -DMOESERVE_CUDA=ON)");
#endif
}

// One greedy token through the whole stack (scheduler, executor, sampler) before READY=1, so
// the first client request does not pay for lazy initialisation (and, on CUDA, graph capture).
void warm_up(Engine& engine) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  RequestOutput last;
  Request r;
  r.id = "moeserve-warmup";
  r.prompt_ids = {0};
  r.params.temperature = 0;
  r.params.max_tokens = 1;
  r.params.ignore_eos = true;
  r.on_output = [&](RequestOutput&& o) {
    if (!o.finished) return;
    std::lock_guard<std::mutex> lk(mu);
    last = std::move(o);
    done = true;
    cv.notify_all();
  };
  const auto t0 = std::chrono::steady_clock::now();
  MS_CHECK(engine.submit(std::move(r)), "warm-up: the engine refused the request");
  std::unique_lock<std::mutex> lk(mu);
  MS_CHECK(cv.wait_for(lk, std::chrono::minutes(30), [&] { return done; }), "warm-up: no output after 30 minutes");
  MS_CHECK(last.finish_reason != FinishReason::Error && last.finish_reason != FinishReason::Abort,
           "warm-up generate failed: {}", last.error.empty() ? finish_reason_name(last.finish_reason) : last.error);
  spdlog::info("warm-up: 1 token in {:.1f} ms",
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

// --device's default and the first log line: which device, GPU names and memory.
void resolve_device(ServeArgs& a) {
#ifdef MOESERVE_WITH_CUDA
  const int gpus = backend_device_count("cuda");
  if (a.device.empty()) a.device = gpus > 0 ? "cuda" : "cpu";
  if (a.device == "cuda") {
    MS_CHECK(gpus > 0, "--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver)");
    std::vector<std::string> names;
    for (int i = 0; i < gpus; ++i) {
      const BackendDeviceInfo d = backend_device_info("cuda", i);
      names.push_back(fmt::format("cuda:{} {} ({:.1f} GiB)", i, d.name, d.total_bytes / 1073741824.0));
    }
    spdlog::info("device: cuda, {} GPU{} visible: {}", gpus, gpus == 1 ? "" : "s", fmt::join(names, ", "));
  } else {
    spdlog::info("device: cpu ({})", gpus > 0 ? fmt::format("{} GPU(s) visible; --device cpu chosen", gpus)
                                              : std::string("no GPU visible"));
  }
#else
  if (a.device.empty()) a.device = "cpu";
  MS_CHECK(a.device == "cpu", "--device cuda: this build has no CUDA backend (configure with -DMOESERVE_CUDA=ON)");
  spdlog::info("device: cpu (this build has no CUDA backend)");
#endif
}

// vLLM's API-server defaults (get_batch_defaults): 1024 sequences and 8192 tokens per step on
// GPUs of >= 70 GiB other than A100 (H100, H200, B200), else 256 and 2048; cpu: 256 and 2048.
void resolve_batch_defaults(ServeArgs& a) {
  bool big = false;
#ifdef MOESERVE_WITH_CUDA
  if (a.device == "cuda") {
    const BackendDeviceInfo d = backend_device_info("cuda", 0);
    big = d.total_bytes >= (size_t(70) << 30) && d.name.find("A100") == std::string::npos;
  }
#endif
  if (a.max_num_seqs == 0) a.max_num_seqs = big ? 1024 : 256;
  if (a.max_num_batched_tokens == 0) a.max_num_batched_tokens = big ? 8192 : 2048;
  // vLLM's check (SchedulerConfig): every running sequence's decode token must fit a step.
  MS_CHECK(a.max_num_batched_tokens >= a.max_num_seqs,
           "--max-num-batched-tokens ({}) must be greater than or equal to --max-num-seqs ({})",
           a.max_num_batched_tokens, a.max_num_seqs);
}

std::vector<std::string> json_strings(const std::string& text) {
  return parse_json_bounded(text, "a JSON list flag").get<std::vector<std::string>>();  // checked by check_serve_args
}

// --quantization must agree with the checkpoint (moeserve always reads its quantization_config).
void check_quantization(const ServeArgs& a, const std::string& model_dir) {
  if (a.quantization.empty()) return;
  nlohmann::json cfg = read_json_file(fs::path(model_dir) / "config.json");
  if (!a.hf_overrides.empty()) cfg.merge_patch(parse_json_bounded(a.hf_overrides, "--hf-overrides"));
  std::string method = "none";
  if (cfg.contains("quantization_config") && cfg["quantization_config"].is_object())
    method = cfg["quantization_config"].value("quant_method", std::string("unknown"));
  MS_CHECK(a.quantization == method,
           "not supported yet: --quantization {} (the checkpoint's quantization_config says '{}'; moeserve runs the "
           "checkpoint as it is quantized: drop the flag)",
           a.quantization, method);
}

// vLLM's periodic stats line, every 10 s while there is work (quiet when idle).
class StatsLogger {
 public:
  StatsLogger(const Engine& engine, const server::Metrics& metrics) : engine_(engine), metrics_(metrics) {
    thread_ = std::thread([this] { run(); });
  }
  ~StatsLogger() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void run() {
    EngineStats last = engine_.stats();
    uint64_t last_out = metrics_.tokens_produced();
    auto t_last = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, std::chrono::seconds(10), [this] { return stop_; })) {
      const EngineStats s = engine_.stats();
      const uint64_t out = metrics_.tokens_produced();
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - t_last).count();
      const uint64_t step_tokens = s.iteration_tokens_sum - last.iteration_tokens_sum;
      const uint64_t gen = out - last_out;
      const uint64_t queries = s.prefix_cache_queries - last.prefix_cache_queries;
      const uint64_t hits = s.prefix_cache_hits - last.prefix_cache_hits;
      // Step tokens are prompt tokens, one query token per generated token, and drafts: the
      // drafts verified are not prompt tokens.
      const uint64_t drafted = s.spec_num_draft_tokens - last.spec_num_draft_tokens;
      const uint64_t not_prompt = gen + drafted;
      if (step_tokens > 0 || s.num_running > 0 || s.num_waiting > 0)
        spdlog::info("Engine 000: Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, "
                     "Running: {} reqs, Waiting: {} reqs, KV cache usage: {:.1f}%, Prefix cache hit rate: {:.1f}%",
                     double(step_tokens > not_prompt ? step_tokens - not_prompt : 0) / dt, double(gen) / dt,
                     s.num_running, s.num_waiting, 100.0 * s.kv_cache_usage,
                     queries ? 100.0 * double(hits) / double(queries) : 0.0);
      if (s.spec_k > 0 && s.spec_num_drafts > last.spec_num_drafts) {
        const std::string line = server::spec_decoding_log_line(last, s, dt);
        spdlog::info("{}", line);
      }
      last = s;
      last_out = out;
      t_last = now;
    }
  }
  const Engine& engine_;
  const server::Metrics& metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

namespace moeserve::cli {

ServeStack::~ServeStack() = default;

void check_stack_args(ServeArgs& a) {
  MS_CHECK(!a.model.empty(), "a model is required (a folder or a hub repo id ORG/NAME)");
  if (!a.tool_call_parser.empty())
    MS_CHECK(server::has_tool_parser(a.tool_call_parser), "--tool-call-parser {}: unknown (known: {})",
             a.tool_call_parser, fmt::join(server::tool_parser_names(), ", "));
  if (!a.reasoning_parser.empty())
    MS_CHECK(server::has_reasoning_parser(a.reasoning_parser), "--reasoning-parser {}: unknown (known: {})",
             a.reasoning_parser, fmt::join(server::reasoning_parser_names(), ", "));
  MS_CHECK(!a.enable_auto_tool_choice || !a.tool_call_parser.empty(),
           "--enable-auto-tool-choice requires --tool-call-parser");
  if (a.replay_script.empty()) resolve_device(a);
  else if (a.device.empty()) a.device = "cpu";
  resolve_batch_defaults(a);
}

std::unique_ptr<ServeStack> load_serve_stack(ServeArgs& a, const StackProgress& progress) {
  auto st = std::make_unique<ServeStack>();
  st->model_arg = a.model;
  progress("resolving " + st->model_arg, "");
  cli::ModelSource src;
  src.revision = a.revision;
  src.download_dir = a.download_dir;
  src.weights = a.load_format != "dummy" && a.replay_script.empty();
  src.tokenizer = a.tokenizer.empty();
  if (!src.weights || cli::looks_like_repo_id(a.model)) progress("resolving " + a.model, "STATUS=resolving " + a.model);
  if (cli::looks_like_repo_id(a.model) && !fs::exists(a.model)) progress("downloading " + a.model, "");
  a.model = fs::absolute(cli::resolve_model_path(a.model, src)).lexically_normal().string();
  std::string tokenizer_dir = a.model;
  if (!a.tokenizer.empty()) {
    cli::ModelSource ts;
    ts.revision = a.tokenizer_revision.empty() ? "main" : a.tokenizer_revision;
    ts.download_dir = a.download_dir;
    ts.weights = false;
    tokenizer_dir = cli::resolve_model_path(a.tokenizer, ts);
  }
  check_quantization(a, a.model);

  progress("loading tokenizer", "STATUS=loading tokenizer and chat template from " + tokenizer_dir);
  st->frontend = std::make_unique<server::TokenizerFrontend>(tokenizer_dir, a.chat_template);
  const int64_t max_len = a.max_model_len.empty() ? 0 : parse_human_int(a.max_model_len);
  MS_CHECK(max_len <= INT32_MAX, "--max-model-len {} is too large", a.max_model_len);
  int max_model_len = int(max_len);

  server::SamplingDefaults defaults;
  if (a.generation_config != "vllm") {
    fs::path gdir = a.generation_config == "auto" ? fs::path(a.model) : fs::path(a.generation_config);
    if (fs::exists(gdir / "generation_config.json"))
      defaults = server::SamplingDefaults::from_json(read_json_file(gdir / "generation_config.json"));
  }

  EngineConfig ec;
  ec.max_num_seqs = a.max_num_seqs;
  ec.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.long_prefill_token_threshold = a.long_prefill_token_threshold;
  ec.max_num_partial_prefills = a.max_num_partial_prefills;
  ec.max_model_len = max_model_len;
  ec.enable_prefix_caching = a.enable_prefix_caching;
  ec.max_waiting_requests = a.max_waiting_requests;
  ec.seed = a.seed;
  ec.device_sampling = !a.host_sampling;
  if (!a.speculative_config.empty())
    ec.speculative =
        parse_speculative_config(a.speculative_config, SpecParseContext{.tensor_parallel_size = a.par.tensor_parallel});
  ec.spec_policy.pinned_k = a.speculative_adaptive ? -1 : kMaxSpecTokens;  // engine/spec_policy.h
  ec.eos_token_ids = read_eos_token_ids(a.model);
  for (int32_t id : st->frontend->eos_token_ids())
    if (std::find(ec.eos_token_ids.begin(), ec.eos_token_ids.end(), id) == ec.eos_token_ids.end())
      ec.eos_token_ids.push_back(id);
  progress(a.load_format == "dummy" ? "generating dummy weights" : "loading weights",
           "STATUS=loading model weights from " + a.model);
  const auto t_load = std::chrono::steady_clock::now();
  std::unique_ptr<ModelExecutor> executor;
  {
    // Bytes of the checkpoint in memory while the executor reads it (bar on a terminal, else
    // a line every 5 s), then one line with the time it took.
    std::optional<hub::WeightLoadProgress> load_progress;
    if (a.load_format != "dummy" && a.replay_script.empty())
      load_progress.emplace(a.model, hub::WeightLoadProgress::Options{.tty = ::isatty(STDERR_FILENO) != 0});
    executor = make_executor(a, max_model_len);
  }
  st->engine = make_engine(ec, std::move(executor));
  const EngineConfig& resolved = st->engine->config();
  ExecutorInfo info = st->engine->executor_info();
  spdlog::info("model ready in {:.1f} s: max_model_len {}, {} KV blocks of {} tokens = {} KV tokens, max_num_seqs {}, "
               "max_num_batched_tokens {}",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count(),
               resolved.max_model_len, info.num_kv_blocks, info.block_size,
               int64_t(info.num_kv_blocks) * info.block_size, resolved.max_num_seqs, resolved.max_num_batched_tokens);

  server::ServiceConfig& sc = st->config;
  sc.served_model_names =
      a.served_model_names.empty() ? std::vector<std::string>{st->model_arg} : a.served_model_names;
  sc.model_root = a.model;  // absolute: `bench` finds the tokenizer from any directory
  sc.max_model_len = resolved.max_model_len;
  sc.api_key = a.api_key;
  if (sc.api_key.empty()) {
    if (const char* k = std::getenv("VLLM_API_KEY")) sc.api_key = k;
    if (const char* k = std::getenv("MOESERVE_API_KEY")) sc.api_key = k;
  }
  sc.reasoning_parser = a.reasoning_parser;
  sc.tool_parser = a.tool_call_parser;
  sc.enable_auto_tool_choice = a.enable_auto_tool_choice;
  sc.max_logprobs = a.max_logprobs;
  sc.defaults = defaults;
  sc.version = MOESERVE_VERSION;
  sc.enable_request_id_headers = a.enable_request_id_headers;
  MS_CHECK(a.prep_threads >= 1, "--prep-threads {}: expected at least 1", a.prep_threads);
  sc.prep_threads = a.prep_threads;
  sc.max_body_bytes = a.max_request_body_bytes;
  sc.force_include_usage = a.enable_force_include_usage;
  sc.web_ui = a.web_ui;

  st->metrics = std::make_unique<server::Metrics>(
      server::MetricsConfig{sc.served_model_names[0], resolved.max_model_len, info.block_size, info.num_kv_blocks,
                          resolved.enable_prefix_caching, a.gpu_memory_utilization});
  st->service = std::make_unique<server::OpenAIService>(sc, *st->engine, *st->frontend, *st->metrics);
  progress("warming up", "STATUS=warming up (one greedy token)");
  warm_up(*st->engine);
  return st;
}

}  // namespace moeserve::cli

namespace {

int run_serve(ServeArgs a, const std::string& noop_warning) {
  if (!a.log_level.empty()) init_logging(a.log_level);
  cli::check_stack_args(a);
  if (!noop_warning.empty()) spdlog::warn("{}", noop_warning);

  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  // Bind first: /health answers 503 ("model is loading") while the model downloads and loads,
  // and a port in use fails now, not after minutes of loading.
  server::GateConfig gc;
  gc.cors.origins = json_strings(a.allowed_origins);
  gc.cors.methods = json_strings(a.allowed_methods);
  gc.cors.headers = json_strings(a.allowed_headers);
  gc.cors.credentials = a.allow_credentials;
  gc.root_path = a.root_path;
  gc.access_log = a.enable_log_requests;
  server::GateHandler gate(gc);
  server::HttpServerConfig hc;
  hc.host = a.host;
  hc.port = a.port;
  hc.io_threads = a.io_threads;
  hc.max_body_bytes = a.max_request_body_bytes;
  hc.keep_alive_timeout = a.timeout_keep_alive;
  hc.header_timeout = a.header_timeout;
  hc.body_timeout = a.body_timeout;
  hc.write_timeout = a.write_timeout;
  MS_CHECK(a.max_connections >= 0, "--max-connections {}: expected 0 (auto) or a positive count", a.max_connections);
  hc.max_connections = a.max_connections;
  raise_open_file_limit();
  server::HttpServer http(hc, gate);
  http.start();
  spdlog::info("listening on http://{}:{} (/health answers 503 until the model is ready)", a.host, http.port());

  auto stack = cli::load_serve_stack(a, [&gate](const std::string& phase, const std::string& status) {
    gate.set_phase(phase);
    if (!status.empty()) server::sd_notify(status);
  });
  Engine& engine = *stack->engine;
  server::OpenAIService& service = *stack->service;
  const server::ServiceConfig& sc = stack->config;
  gate.set_ready(&service);
  spdlog::info("http: at most {} connections (then 503), keep-alive {} s, header {} s, body {} s, write {} s",
               http.max_connections(), a.timeout_keep_alive, a.header_timeout, a.body_timeout, a.write_timeout);
  spdlog::info("moeserve {} serving {} as '{}' on http://{}:{}{}{}", MOESERVE_VERSION, stack->model_arg,
               sc.served_model_names[0], a.host, http.port(), a.root_path,
               sc.web_ui ? " (chat page at /)" : "");
  std::optional<StatsLogger> stats;
  if (!a.disable_log_stats) stats.emplace(engine, *stack->metrics);

  // READY=1 only now: weights loaded, warm-up done, /health answering 200.
  server::sd_notify(fmt::format("READY=1\nSTATUS=serving on {}:{}", a.host, http.port()));
  int sig = 0;
  sigwait(&sigs, &sig);
  server::sd_notify(fmt::format("STOPPING=1\nSTATUS=draining (signal {}, grace {} s)", sig, a.shutdown_grace_seconds));
  spdlog::info("signal {}: draining (grace {} s)", sig, a.shutdown_grace_seconds);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(a.shutdown_grace_seconds * 1000));
  service.set_draining(true);
  http.stop_accepting();
  while (service.active_requests() + service.preparing_requests() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // Aborts whatever still runs; the aborted streams then end on the io threads.
  engine.shutdown(std::chrono::milliseconds(0));
  auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (http.busy_sessions() > 0 && std::chrono::steady_clock::now() < flush_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  service.stop_preparation();
  stats.reset();
  http.stop();
  gate.set_ready(nullptr);
  spdlog::info("shut down");
  return 0;
}

moeserve::cli::RegisterSubcommand reg("serve", "Serve a model over the OpenAI-compatible HTTP API", [](CLI::App* sub) {
  auto a = std::make_shared<ServeArgs>();
  cli::add_serve_options(sub, *a);
  return [a, sub] {
    const std::string noop_warning = cli::check_serve_args(sub, *a);
    return run_serve(*a, noop_warning);
  };
});

}  // namespace
