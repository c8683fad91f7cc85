#include "tools/serve_flags.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/kv_cache_dtype.h"

namespace moeserve::serve_flags {
namespace {

constexpr Kind I = Kind::Implemented, N = Kind::NoOp, U = Kind::Unsupported;
constexpr Arity F = Arity::Flag, O = Arity::One, M = Arity::Many;

FlagSpec row(std::string name, Kind k, Arity a, std::string group, std::string why) {
  FlagSpec s;
  s.name = std::move(name);
  s.kind = k;
  s.arity = a;
  s.group = std::move(group);
  s.why = std::move(why);
  return s;
}

std::vector<FlagSpec> make_table() {
  const std::string model = "Model", sched = "Scheduling and memory", api = "API server",
                    par = "Parallelism", log = "Logging", compat = "Accepted for vllm compatibility (no effect)",
                    unsup = "Not supported yet (refused before loading)";
  std::vector<FlagSpec> t;
  auto add = [&](std::string name, Kind k, Arity a, const std::string& g, std::string why) -> FlagSpec& {
    t.push_back(row(std::move(name), k, a, g, std::move(why)));
    return t.back();
  };
  // --- implemented -------------------------------------------------------------------------
  add("model", I, O, model, "model directory or hub repo id ORG/NAME (same as the positional argument)");
  add("revision", I, O, model, "hub branch, tag or commit of a repo id (default: main)");
  add("tokenizer", I, O, model, "tokenizer directory or repo id (default: the model's)");
  add("tokenizer-revision", I, O, model, "revision of --tokenizer when it is a repo id");
  add("download-dir", I, O, model, "hub cache folder for repo ids (default: $HF_HUB_CACHE)");
  add("hf-overrides", I, O, model, "JSON object merged into config.json, e.g. '{\"num_hidden_layers\": 30}'");
  {
    FlagSpec& s = add("load-format", I, O, model,
                      "auto|safetensors: the checkpoint; dummy: random weights from config.json alone (no disk reads)");
    s.ok_values = {"auto", "safetensors", "dummy"};
    s.unsupported_value_why = "moeserve reads safetensors checkpoints; use --load-format auto (or dummy)";
  }
  {
    FlagSpec& s = add("dtype", I, O, model, "auto|bfloat16: moeserve computes in bfloat16 on CUDA, float32 on cpu");
    s.noop_values = {"auto", "bfloat16", "bf16"};
    s.unsupported_value_why =
        "moeserve's kernels compute in bfloat16 (CUDA) / float32 (cpu); use --dtype auto";
  }
  {
    FlagSpec& s = add("kv-cache-dtype", I, O, model,
                      "auto: the KV cache in the activation dtype; fp8 (= fp8_e4m3): e4m3 K/V with the checkpoint's "
                      "per-layer k_scale / v_scale (else 1.0), half the bytes of bf16");
    s.ok_values = kv_cache_dtype_values();
    s.unsupported_value_why =
        "moeserve stores the FP8 KV cache as e4m3 only; use --kv-cache-dtype fp8 (= fp8_e4m3) or auto (`moeserve "
        "plan` shows the capacity of each)";
  }
  add("quantization", I, O, model,
      "must match the checkpoint's quantization_config (moeserve reads it from config.json)");
  t.back().short_name = "q";
  add("served-model-name", I, M, api, "names accepted in `model`; the first is reported (default: the model argument)");
  add("max-model-len", I, O, sched, "context length (4096, 32k = 32000, 32K = 32768; default: from config.json)");
  add("max-num-seqs", I, O, sched, "sequences per engine step (default: 1024 on >= 70 GiB GPUs but A100, else 256)");
  add("max-num-batched-tokens", I, O, sched,
      "tokens per engine step, decodes first, prefill chunks fill the rest (default: 8192 on H100/H200, else 2048; "
      "smaller: lower inter-token latency, higher TTFT)");
  add("long-prefill-token-threshold", I, O, sched,
      "at most this many tokens of one sequence per step (0: none; default 4% of --max-model-len when "
      "--max-num-partial-prefills > 1)");
  add("max-num-partial-prefills", I, O, sched,
      "at most this many sequences get a prefill chunk in one step (default: no limit; vLLM V1 only derives "
      "--long-prefill-token-threshold from it, moeserve enforces it)");
  add("block-size", I, O, sched, "KV cache block size in tokens (default 16)");
  add("num-kv-blocks", I, O, sched, "KV cache blocks (0: from --gpu-memory-utilization / max_model_len)");
  add("num-gpu-blocks-override", I, O, sched, "vLLM's name for --num-kv-blocks");
  add("gpu-memory-utilization", I, O, sched, "fraction of GPU memory for weights, activations and KV (0.9)");
  add("enable-prefix-caching", I, F, sched, "reuse KV blocks of shared prompt prefixes (default on)").negatable = true;
  add("enforce-eager", I, F, sched, "run decode steps eagerly (no CUDA graphs)");
  add("speculative-config", I, O, sched,
      "speculative decoding as vLLM's JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
      "\"prompt_lookup_max\": 4}' (n-gram prompt lookup; eagle3 / eagle / mtp / draft_model are refused)");
  add("speculative-adaptive", I, F, sched,
      "moeserve: with --speculative-config, choose per step how many of the num_speculative_tokens drafts to run "
      "(0 included) from measured step times and the running acceptance, so speculation never slows decoding "
      "(default on; --no-speculative-adaptive: every step runs num_speculative_tokens drafts, as vLLM)")
      .negatable = true;
  add("capture-graphs-at-startup", I, F, sched,
      "moeserve: capture every decode graph bucket before serving (default: on first use)");
  add("device", I, O, sched, "cuda or cpu (default: cuda when this build has CUDA and a GPU is visible)");
  add("seed", I, O, sched, "seed for requests without one (default 0)");
  add("host-sampling", I, F, sched,
      "moeserve: sample every row on the host (default: on the GPU when the request allows it)");
  add("max-waiting-requests", I, O, sched, "moeserve: queued requests before answering 429 (1024)");
  add("host", I, O, api, "address to bind (default 0.0.0.0)");
  add("port", I, O, api, "port to bind (default 8000; 0: any free port)");
  add("api-key", I, O, api, "require `Authorization: Bearer KEY` on /v1 (env VLLM_API_KEY)");
  add("root-path", I, O, api, "path prefix a proxy adds (requests under it are routed without it)");
  add("allowed-origins", I, O, api, "CORS: JSON list of origins (default [\"*\"])");
  add("allowed-methods", I, O, api, "CORS: JSON list of methods (default [\"*\"])");
  add("allowed-headers", I, O, api, "CORS: JSON list of request headers (default [\"*\"])");
  add("allow-credentials", I, F, api, "CORS: Access-Control-Allow-Credentials: true");
  add("chat-template", I, O, api, "chat template file or template text");
  add("generation-config", I, O, api, "auto: sampling defaults from generation_config.json; vllm: none; or a folder");
  add("enable-auto-tool-choice", I, F, api, "allow tool_choice \"auto\" (needs --tool-call-parser)");
  add("tool-call-parser", I, O, api, "tool-call parser (minimax_m2, hermes)");
  add("reasoning-parser", I, O, api, "reasoning parser (minimax_m2, minimax_m2_append_think, qwen3)");
  add("enable-request-id-headers", I, F, api, "X-Request-Id on every response (the client's, else a new one)");
  add("web-ui", I, F, api, "moeserve: the chat page at / (default on; --no-web-ui: / answers 404)").negatable = true;
  add("enable-force-include-usage", I, F, api, "every stream ends with a usage chunk, even without stream_options");
  add("max-logprobs", I, O, api, "largest top_logprobs / logprobs accepted (20)");
  add("io-threads", I, O, api, "moeserve: HTTP io threads (2)");
  add("prep-threads", I, O, api, "moeserve: threads that parse, template and tokenise POST bodies, off the io threads (2)");
  add("timeout-keep-alive", I, O, api, "seconds an idle keep-alive connection stays open (uvicorn's; 5; 0: forever)");
  add("header-timeout", I, O, api, "moeserve: seconds a request's header may take, else 408 and close (10; 0: no limit)");
  add("body-timeout", I, O, api, "moeserve: seconds a body may take after its header, else 408 and close (60; 0: no limit)");
  add("write-timeout", I, O, api,
      "moeserve: seconds a client may leave its response unread before the connection closes and its request is aborted (30; 0: no limit)");
  add("max-connections", I, O, api,
      "moeserve: connections served at once; more get 503 except /health and /ping (0: from the open-file limit)");
  add("max-request-body-bytes", I, O, api, "moeserve: larger bodies get 413 (32 MiB)");
  add("shutdown-grace-seconds", I, O, api, "moeserve: on SIGTERM, how long running requests may finish (30)");
  add("config", I, O, api, "YAML file whose keys are flag names; flags on the command line win");
  add("tensor-parallel-size", I, O, par, "(-tp) ranks (GPUs) that split attention heads and experts").short_name = "tp";
  add("enable-expert-parallel", I, F, par, "experts owned whole by one rank each (EP) instead of sliced");
  add("data-parallel-size", I, O, par, "(-dp) attention data parallelism (only 1 is implemented)").short_name = "dp";
  {
    FlagSpec& s = add("pipeline-parallel-size", I, O, par, "(-pp) only 1: use -tp for more GPUs");
    s.short_name = "pp";
    s.ok_values = {"1"};
    s.unsupported_value_why = "pipeline parallelism is not implemented; use --tensor-parallel-size (with "
                              "--enable-expert-parallel) over the same GPUs";
  }
  add("nnodes", I, O, par, "machines in the rank group (multi-node: see dist-check)");
  add("node-rank", I, O, par, "this machine's index in [0, nnodes)");
  add("master-addr", I, O, par, "address of node 0 (NCCL id rendezvous)");
  add("master-port", I, O, par, "TCP port of the rendezvous on node 0");
  add("log-level", I, O, log, "trace|debug|info|warn|error|off (also before the subcommand)");
  add("enable-log-requests", I, F, log, "one access line per request").negatable = true;
  add("disable-log-stats", I, F, log, "no periodic stats line (every 10 s while busy)");
  add("test-replay-backend", I, O, "", "TEST ONLY: scripted replay executor (JSON)");
  // --- accepted, no effect -------------------------------------------------------------------
  add("trust-remote-code", N, F, compat, "moeserve runs no code from the model repository; it reads config.json itself");
  add("disable-log-requests", N, F, compat, "request logging is off unless --enable-log-requests");
  add("uvicorn-log-level", N, O, compat, "moeserve has no uvicorn; --log-level sets its log level");
  add("disable-uvicorn-access-log", N, F, compat, "moeserve has no uvicorn; access lines need --enable-log-requests");
  add("compilation-config", N, O, compat,
      "moeserve does not use torch.compile; decode steps run as CUDA graphs (--enforce-eager turns them off)");
  t.push_back(row("enable-chunked-prefill", N, F, compat,
                  "prefill is always chunked by --max-num-batched-tokens"));
  add("async-scheduling", N, F, compat, "moeserve's engine loop has no separate async scheduler to switch on")
      .negatable = true;
  add("disable-frontend-multiprocessing", N, F, compat, "moeserve's HTTP front end runs as threads of one process");
  add("disable-fastapi-docs", N, F, compat, "moeserve serves no /docs pages");
  add("disable-custom-all-reduce", N, F, compat, "tensor-parallel all-reduces use NCCL already");
  add("distributed-executor-backend", N, O, compat, "moeserve's ranks are threads of one process (one per GPU)");
  add("swap-space", N, O, compat, "moeserve keeps no CPU swap space; preempted requests are recomputed");
  add("max-parallel-loading-workers", N, O, compat, "moeserve maps the safetensors files; there are no loading workers");
  {
    FlagSpec& s = add("tokenizer-mode", N, O, compat, "moeserve has one tokenizer implementation (tokenizer.json)");
    s.noop_values = {"auto", "hf", "fast"};
    s.unsupported_value_why = "moeserve reads tokenizer.json only; use --tokenizer-mode auto";
  }
  {
    FlagSpec& s = add("scheduling-policy", N, O, compat, "moeserve schedules first come, first served");
    s.noop_values = {"fcfs"};
    s.unsupported_value_why = "only first-come-first-served scheduling exists; use --scheduling-policy fcfs";
  }
  // --- not supported yet -----------------------------------------------------------------------
  auto no = [&](std::string name, Arity a, std::string why) { add(std::move(name), U, a, unsup, std::move(why)); };
  no("no-enable-chunked-prefill", F, "prefill is always chunked; a larger --max-num-batched-tokens makes chunks larger");
  no("lora-modules", M, "LoRA adapters are not implemented; merge the adapter into the weights and serve that folder");
  no("enable-lora", F, "LoRA adapters are not implemented; merge the adapter into the weights");
  no("max-lora-rank", O, "LoRA adapters are not implemented");
  no("max-loras", O, "LoRA adapters are not implemented");
  no("tool-parser-plugin", O, "parser plugins (Python) cannot load into moeserve; use a built-in --tool-call-parser");
  no("ssl-keyfile", O, "TLS is not implemented; terminate TLS in a reverse proxy (nginx, caddy) in front");
  no("ssl-certfile", O, "TLS is not implemented; terminate TLS in a reverse proxy (nginx, caddy) in front");
  no("ssl-ca-certs", O, "TLS is not implemented; terminate TLS in a reverse proxy in front");
  no("cpu-offload-gb", O, "weight offloading is not implemented; use more GPUs (-tp) or `moeserve plan` to size");
  no("enable-sleep-mode", F, "sleep mode is not implemented; stop and restart the service");
  no("hf-token", O, "set the HF_TOKEN environment variable instead");
  no("hf-config-path", O, "put config.json into the model folder (or use --hf-overrides)");
  no("code-revision", O, "moeserve runs no repository code; use --revision");
  no("limit-mm-per-prompt", O, "multimodal inputs are not implemented");
  no("mm-processor-kwargs", O, "multimodal inputs are not implemented");
  no("chat-template-content-format", O, "content parts are flattened to text; drop the flag");
  no("default-chat-template-kwargs", O, "send chat_template_kwargs in each request");
  no("trust-request-chat-template", F, "per-request chat templates are not implemented; use --chat-template");
  no("response-role", O, "the reply role is always \"assistant\"");
  no("middleware", M, "Python middleware cannot load into moeserve; put a reverse proxy in front");
  no("return-tokens-as-token-ids", F, "token-id strings in logprobs are not implemented");
  no("enable-prompt-tokens-details", F, "usage.prompt_tokens_details (cached tokens) is not implemented yet");
  no("enable-server-load-tracking", F, "the /load endpoint is not implemented; use vllm:num_requests_running");
  no("override-generation-config", O, "put the values into generation_config.json (or --generation-config DIR)");
  no("structured-outputs-config", O, "structured-output backends are not selectable; drop the flag");
  no("guided-decoding-backend", O, "structured-output backends are not selectable; drop the flag");
  no("logits-processors", M, "Python logits processors cannot load into moeserve");
  no("enable-eplb", F, "expert-parallel load balancing is not implemented; --enable-expert-parallel works without it");
  no("eplb-config", O, "expert-parallel load balancing is not implemented");
  no("all2all-backend", O, "the expert-parallel exchange uses NCCL; drop the flag");
  no("data-parallel-size-local", O, "data parallelism is not implemented; use -tp");
  no("data-parallel-address", O, "data parallelism is not implemented; use -tp");
  no("data-parallel-rpc-port", O, "data parallelism is not implemented; use -tp");
  no("data-parallel-backend", O, "data parallelism is not implemented; use -tp");
  no("headless", F, "multi-node serving is not implemented (see `moeserve dist-check`)");
  no("api-server-count", O, "one API server per process; run several services behind a load balancer");
  no("otlp-traces-endpoint", O, "OpenTelemetry tracing is not implemented; use /metrics");
  no("collect-detailed-traces", O, "OpenTelemetry tracing is not implemented; use /metrics");
  no("max-long-partial-prefills", O,
     "short prompts never overtake long ones (FCFS); use --max-num-partial-prefills and --long-prefill-token-threshold");
  no("cuda-graph-sizes", M, "decode graph buckets follow --max-num-seqs; drop the flag");
  no("max-cudagraph-capture-size", O, "decode graph buckets follow --max-num-seqs; drop the flag");
  no("max-seq-len-to-capture", O, "decode graphs cover every context length; drop the flag");
  no("kv-transfer-config", O, "disaggregated prefill (KV transfer) is not implemented");
  no("kv-events-config", O, "KV cache events are not implemented");
  no("disable-sliding-window", F, "sliding-window attention is not implemented (MiniMax-M2 has none)");
  no("calculate-kv-scales", F, "the FP8 KV cache is not implemented yet");
  no("logprobs-mode", O, "logprobs are always of the processed distribution");
  no("preemption-mode", O, "preempted requests are always recomputed");
  no("lora-dtype", O, "LoRA adapters are not implemented");
  return t;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

const std::vector<FlagSpec>& table() {
  static const std::vector<FlagSpec> t = make_table();
  return t;
}

const FlagSpec* find(std::string_view name) {
  for (const auto& s : table())
    if (s.name == name || (!s.short_name.empty() && s.short_name == name)) return &s;
  if (name.rfind("no-", 0) == 0) {
    const FlagSpec* base = find(name.substr(3));
    if (base && base->negatable) return base;
  }
  return nullptr;
}

std::string spelling(std::string_view name) {
  const FlagSpec* s = find(name);
  MS_CHECK(s && s->kind == Kind::Implemented, "serve flag table: '{}' is not an implemented flag", name);
  return "--" + s->name;
}

std::vector<std::string> suggestions(std::string_view name) {
  std::vector<std::pair<size_t, std::string>> c;
  for (const auto& s : table()) {
    if (s.group.empty()) continue;
    const size_t d = edit_distance(name, s.name);
    if (d <= 3) c.emplace_back(d, s.name);
  }
  std::sort(c.begin(), c.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < c.size() && i < 3; ++i) out.push_back("--" + c[i].second);
  return out;
}

std::string unknown_flag_message(const std::string& arg) {
  std::string name = arg.substr(0, arg.find('='));
  name.erase(0, name.find_first_not_of('-'));
  std::string msg = fmt::format("not supported yet: {} (moeserve serve does not know this flag", arg.substr(0, arg.find('=')));
  const auto near = suggestions(name);
  if (!near.empty()) msg += fmt::format("; did you mean {}?", fmt::join(near, " or "));
  return msg + "); `moeserve serve --help` lists the flags moeserve implements and accepts";
}

}  // namespace moeserve::serve_flags
