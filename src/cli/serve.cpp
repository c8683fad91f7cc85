// `moeserve serve MODEL_DIR`: the OpenAI-compatible HTTP server. Flags follow `vllm serve`.
// SIGTERM/SIGINT drain: stop accepting, let running requests finish for up to
// --shutdown-grace-seconds, abort the rest (their streams end with finish_reason "abort"
// and [DONE]), exit 0.
#include <condition_variable>
#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/parallel_cli.h"
#include "cli/registry.h"
#include "core/error.h"
#include "core/log.h"
#include "core/parse.h"
#include "core/bounded_json.h"
#include "engine/engine.h"
#include "engine/stop.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "server/sd_notify.h"
#include "server/parsers/parser.h"
#include "server/tokenizer_frontend.h"
#include "model/model_executor.h"
#ifdef MOESERVE_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "model/device_sampler.h"
#endif
#ifdef MOESERVE_HAS_TEST_BACKENDS
#include "engine/testing/replay_executor.h"
#endif

namespace {

namespace fs = std::filesystem;
using namespace moeserve;

struct ServeArgs {
  std::string model;
  std::string host = "0.0.0.0";
  int port = 8000;
  std::vector<std::string> served_model_names;
  std::string max_model_len;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int block_size = 16;
  int num_kv_blocks = 0;
  std::string api_key;
  std::string chat_template;
  std::string generation_config = "auto";
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  std::string reasoning_parser;
  std::string device = "cpu";
  bool enable_prefix_caching = true;
  bool enable_request_id_headers = false;
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;
  bool capture_graphs_at_startup = false;
  int max_logprobs = 20;
  int io_threads = 2;
  int prep_threads = 2;
  double timeout_keep_alive = 5;
  double header_timeout = 10;
  double body_timeout = 60;
  double write_timeout = 30;
  int max_connections = 0;
  int max_waiting_requests = 1024;
  size_t max_request_body_bytes = 32u << 20;
  double shutdown_grace_seconds = 30;
  uint64_t seed = 0;
  bool host_sampling = false;
  std::string replay_script;
  cli::ParallelFlags par;
};


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
  eo.block_size = a.block_size;
  eo.max_model_len = max_model_len;
  eo.num_kv_blocks = a.num_kv_blocks;
  eo.max_num_seqs = a.max_num_seqs;
  eo.max_num_batched_tokens = a.max_num_batched_tokens;
  eo.enforce_eager = a.enforce_eager;
  eo.capture_graphs_at_startup = a.capture_graphs_at_startup;
#ifdef MOESERVE_WITH_CUDA
  MS_CHECK(a.device == "cpu" || (a.gpu_memory_utilization > 0 && a.gpu_memory_utilization <= 1),
           "--gpu-memory-utilization {}: expected a fraction in (0, 1]", a.gpu_memory_utilization);
  const double util = a.gpu_memory_utilization;
  // KV pool = what --gpu-memory-utilization leaves after the weights and the step workspaces
  // (already resident when this runs), less 512 MiB headroom (expert tables, decode graphs,
  // workspaces an unusually long prompt grows). Per GPU; a rank group takes the minimum.
  auto kv_blocks = [util, bs = a.block_size](Backend& be, int64_t per_block) {
    auto* cb = static_cast<CudaBackend*>(&be);
    size_t free_b = 0, total_b = 0;
    cb->mem_info(&free_b, &total_b);
    const double budget = double(total_b) * util - double(total_b - free_b) - double(512 << 20);
    const int64_t blocks = std::min<int64_t>(budget > 0 ? int64_t(budget / double(per_block)) : 0, INT32_MAX / 2);
    spdlog::info("cuda:{} {} ({:.1f} GiB, {:.1f} GiB in use after the weights); --gpu-memory-utilization {} leaves "
                 "{} KV blocks of {} tokens = {} KV tokens ({:.1f} KiB per block)",
                 cb->device_index(), cb->device_name(), total_b / 1073741824.0, (total_b - free_b) / 1073741824.0,
                 util, blocks, bs, blocks * bs, per_block / 1024.0);
    return int(blocks);
  };
  if (a.par.parallel())
    return cli::make_parallel_executor(a.par, eo, a.device,
                                       a.device == "cuda" ? std::function<int(Backend&, int64_t)>(kv_blocks) : nullptr);
  if (a.device == "cpu") return make_cpu_executor(eo);
  auto backend = make_cuda_backend(0);
  CudaBackend* cb = backend.get();
  eo.kv_blocks_for_memory = [cb, kv_blocks](int64_t per_block) { return kv_blocks(*cb, per_block); };
  eo.device_sampler = cuda_device_sampler(cb);  // used unless --host-sampling (EngineConfig)
  return std::make_unique<MiniMaxM2Executor>(std::move(backend), eo);
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

int run_serve(const ServeArgs& a) {
  MS_CHECK(!a.model.empty(), "serve: MODEL_DIR is required");
  MS_CHECK(fs::is_directory(a.model), "serve: {} is not a directory", a.model);
  if (!a.tool_call_parser.empty())
    MS_CHECK(server::has_tool_parser(a.tool_call_parser), "--tool-call-parser {}: unknown (known: {})",
             a.tool_call_parser, fmt::join(server::tool_parser_names(), ", "));
  if (!a.reasoning_parser.empty())
    MS_CHECK(server::has_reasoning_parser(a.reasoning_parser), "--reasoning-parser {}: unknown (known: {})",
             a.reasoning_parser, fmt::join(server::reasoning_parser_names(), ", "));
  MS_CHECK(!a.enable_auto_tool_choice || !a.tool_call_parser.empty(),
           "--enable-auto-tool-choice requires --tool-call-parser");

  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  server::sd_notify("STATUS=loading tokenizer and chat template from " + a.model);
  server::TokenizerFrontend frontend(a.model, a.chat_template);
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
  ec.max_model_len = max_model_len;
  ec.enable_prefix_caching = a.enable_prefix_caching;
  ec.max_waiting_requests = a.max_waiting_requests;
  ec.seed = a.seed;
  ec.device_sampling = !a.host_sampling;
  ec.eos_token_ids = read_eos_token_ids(a.model);
  for (int32_t id : frontend.eos_token_ids())
    if (std::find(ec.eos_token_ids.begin(), ec.eos_token_ids.end(), id) == ec.eos_token_ids.end())
      ec.eos_token_ids.push_back(id);
  server::sd_notify("STATUS=loading model weights from " + a.model);
  auto engine = make_engine(ec, make_executor(a, max_model_len));
  const EngineConfig& resolved = engine->config();
  ExecutorInfo info = engine->executor_info();

  server::ServiceConfig sc;
  sc.served_model_names = a.served_model_names.empty() ? std::vector<std::string>{a.model} : a.served_model_names;
  sc.model_root = a.model;
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

  server::Metrics metrics({sc.served_model_names[0], resolved.max_model_len, info.block_size, info.num_kv_blocks,
                           resolved.enable_prefix_caching, a.gpu_memory_utilization});
  server::OpenAIService service(sc, *engine, frontend, metrics);
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
  server::HttpServer http(hc, service);
  server::sd_notify("STATUS=warming up (one greedy token)");
  warm_up(*engine);
  http.start();
  spdlog::info("http: at most {} connections (then 503), keep-alive {} s, header {} s, body {} s, write {} s",
               http.max_connections(), a.timeout_keep_alive, a.header_timeout, a.body_timeout, a.write_timeout);
  spdlog::info("moeserve {} serving {} as '{}' on http://{}:{} (max_model_len {}, {} KV blocks of {})",
               MOESERVE_VERSION, a.model, sc.served_model_names[0], a.host, http.port(), resolved.max_model_len,
               info.num_kv_blocks, info.block_size);

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
  engine->shutdown(std::chrono::milliseconds(0));
  auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (http.busy_sessions() > 0 && std::chrono::steady_clock::now() < flush_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  service.stop_preparation();
  http.stop();
  spdlog::info("shut down");
  return 0;
}

moeserve::cli::RegisterSubcommand reg("serve", "Serve a model over the OpenAI-compatible HTTP API", [](CLI::App* sub) {
  auto a = std::make_shared<ServeArgs>();
  sub->add_option("model", a->model, "model directory (config.json, tokenizer.json, weights)");
  sub->add_option("--model", a->model, "model directory (same as the positional argument)");
  sub->add_option("--host", a->host, "address to bind")->capture_default_str();
  sub->add_option("--port", a->port, "port to bind (0: any free port)")->capture_default_str();
  sub->add_option("--served-model-name", a->served_model_names, "names accepted in `model`; the first is reported");
  sub->add_option("--max-model-len", a->max_model_len, "context length (4096, 32k = 32000, 32K = 32768)");
  sub->add_option("--max-num-seqs", a->max_num_seqs, "sequences per engine step")->capture_default_str();
  sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens, "tokens per engine step")->capture_default_str();
  sub->add_option("--block-size", a->block_size, "KV cache block size (tokens)")->capture_default_str();
  sub->add_option("--num-kv-blocks", a->num_kv_blocks, "KV cache blocks (0: the executor's default)");
  sub->add_option("--api-key", a->api_key, "require `Authorization: Bearer KEY` on /v1 (env VLLM_API_KEY)");
  sub->add_option("--chat-template", a->chat_template, "chat template file or template text");
  sub->add_option("--generation-config", a->generation_config,
                  "auto: sampling defaults from generation_config.json; vllm: none; or a directory")
      ->capture_default_str();
  sub->add_flag("--enable-auto-tool-choice", a->enable_auto_tool_choice, "allow tool_choice \"auto\"");
  sub->add_flag("--enable-request-id-headers", a->enable_request_id_headers,
                "X-Request-Id on every response (the client's, else a new one)");
  sub->add_option("--tool-call-parser", a->tool_call_parser, "tool-call parser (minimax_m2)");
  sub->add_option("--reasoning-parser", a->reasoning_parser, "reasoning parser (minimax_m2, minimax_m2_append_think)");
  sub->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", a->enable_prefix_caching,
                "reuse KV blocks of shared prompt prefixes (default on)");
  sub->add_option("--gpu-memory-utilization", a->gpu_memory_utilization, "fraction of GPU memory (ignored on cpu)")
      ->capture_default_str();
  sub->add_flag("--enforce-eager", a->enforce_eager, "run decode steps eagerly (no CUDA graphs)");
  sub->add_flag("--capture-graphs-at-startup", a->capture_graphs_at_startup,
                "capture every decode graph bucket before serving (default: on first use)");
  sub->add_option("--max-logprobs", a->max_logprobs, "largest top_logprobs / logprobs accepted")->capture_default_str();
  sub->add_option("--io-threads", a->io_threads, "HTTP io threads")->capture_default_str();
  sub->add_option("--prep-threads", a->prep_threads,
                  "threads that parse, template and tokenise POST bodies (off the io threads)")
      ->capture_default_str();
  sub->add_option("--timeout-keep-alive", a->timeout_keep_alive,
                  "seconds an idle keep-alive connection stays open (uvicorn's; 0: forever)")
      ->capture_default_str();
  sub->add_option("--header-timeout", a->header_timeout,
                  "seconds a request's header may take to arrive, else 408 and close (0: no limit)")
      ->capture_default_str();
  sub->add_option("--body-timeout", a->body_timeout,
                  "seconds a request's body may take after its header, else 408 and close (0: no limit)")
      ->capture_default_str();
  sub->add_option("--write-timeout", a->write_timeout,
                  "seconds a client may leave its response unread before the connection is closed and "
                  "its request aborted (0: no limit)")
      ->capture_default_str();
  sub->add_option("--max-connections", a->max_connections,
                  "connections served at once; more get 503 except /health and /ping (0: from the open-file limit)")
      ->capture_default_str();
  sub->add_option("--max-waiting-requests", a->max_waiting_requests,
                  "queued requests before answering 429")->capture_default_str();
  sub->add_option("--max-request-body-bytes", a->max_request_body_bytes, "larger bodies get 413")->capture_default_str();
  sub->add_option("--shutdown-grace-seconds", a->shutdown_grace_seconds,
                  "on SIGTERM, how long running requests may finish")->capture_default_str();
  sub->add_option("--seed", a->seed, "seed for requests without one")->capture_default_str();
  sub->add_flag("--host-sampling", a->host_sampling,
                "moeserve: sample every row on the host from downloaded logits (default: on the GPU when "
                "the request needs no penalties, min_p, min_tokens or logprobs)");
  cli::add_parallel_flags(sub, a->par);
#ifdef MOESERVE_HAS_TEST_BACKENDS
  sub->add_option("--test-replay-backend", a->replay_script, "TEST ONLY: scripted replay executor (JSON)");
#endif
  return [a] { return run_serve(*a); };
});

}  // namespace
