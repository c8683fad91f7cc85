// The OpenAI-compatible routes (serving-api.md §1-6) on top of the Engine: request parsing,
// chat templating and tokenization, submission of one engine request per choice, and the
// output path. The engine's on_output callback (engine thread) only queues the delivery and
// posts a drain to the connection's strand; detokenization, parsing and formatting run there.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/frontend.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/prep_pool.h"
#include "server/protocol.h"
#include "server/structured_request.h"

namespace moeserve::server {

class ApiFormatter;
class ResponsesApi;

struct ServiceConfig {
  std::vector<std::string> served_model_names;  // the first is reported in responses
  std::string model_root;                       // ModelCard.root
  int max_model_len = 4096;
  std::string api_key;  // empty: no auth
  std::string reasoning_parser;
  std::string tool_parser;
  bool enable_auto_tool_choice = false;
  int max_logprobs = 20;
  SamplingDefaults defaults;
  std::string version = "0.0.0";
  bool enable_request_id_headers = false;  // echo X-Request-Id (or a new id) on every response
  // A stream that wrote nothing for this long gets its API's keep-alive (Anthropic: `ping`).
  int stream_keepalive_ms = 10000;
  // POST routes are prepared (parsed, templated, tokenised) on prep_threads workers; bodies
  // queued there are bounded by prep_queue_bodies x max_body_bytes (beyond: 503).
  int prep_threads = 2;
  size_t max_body_bytes = 32u << 20;
  int prep_queue_bodies = 4;
  bool force_include_usage = false;  // --enable-force-include-usage: every stream ends with usage
  bool web_ui = false;  // GET / answers the chat page (web_ui.h); false: 404 as any unknown path
};

class OpenAIService : public Handler {
 public:
  OpenAIService(ServiceConfig cfg, Engine& engine, const Frontend& frontend, Metrics& metrics);
  ~OpenAIService() override;
  // GET routes (/health, /metrics, ...) answer on the io thread; POST routes run on the
  // preparation pool (prep_pool.h) with a sink that forwards to the connection's strand.
  void handle(HttpRequest&& req, std::shared_ptr<ResponseSink> sink) override;
  // While draining, new generation requests get 503 and /health answers 503.
  void set_draining(bool d) { draining_ = d; }
  // Finishes the requests being prepared and stops the preparation workers (before the
  // HttpServer goes away: the jobs hold its connections).
  void stop_preparation() { prep_.shutdown(); }
  // Requests queued for or in preparation.
  int preparing_requests() const { return prep_.queued(); }
  // Generation requests whose response has not ended.
  int active_requests() const { return active_.load(); }

  // Internal, used by the per-request state.
  Engine& engine() { return engine_; }
  Metrics& metrics() { return metrics_; }
  const Frontend& frontend() const { return frontend_; }
  const ServiceConfig& config() const { return cfg_; }
  std::atomic<int>& active_counter() { return active_; }
  const ProtocolLimits& limits() const { return limits_; }
  bool draining() const { return draining_; }
  void check_model(const std::string& model) const;

  // The shared generation pipeline of every generation API (chat, completions, Anthropic
  // Messages, Responses): renders and tokenizes the prompt, validates it against the model
  // length, submits the engine requests, processes outputs (OutputProcessor) and writes the
  // response through `fmt` (api_formatter.h). Throws ApiError before anything was sent.
  void run_generation(const HttpRequest& http, std::shared_ptr<ResponseSink> sink, const ojson& body,
                      GenRequest&& request, std::unique_ptr<ApiFormatter> fmt,
                      std::chrono::steady_clock::time_point arrival);
  // A chat request's rendered prompt as token ids (`body` gives add_special_tokens).
  std::vector<int32_t> render_chat_prompt(const GenRequest& r, const ojson& body) const;

 private:
  void route(const HttpRequest& req, const std::string& path, std::shared_ptr<ResponseSink> sink);
  void generate(const HttpRequest& req, std::shared_ptr<ResponseSink> sink, bool chat);
  void tokenize(const HttpRequest& req, ResponseSink& sink);
  void detokenize(const HttpRequest& req, ResponseSink& sink);
  std::string models_json() const;
  // Structured outputs: the vocabulary as bytes (built on first use) and the compiled grammars.
  const StructuredContext& structured_context();

  ServiceConfig cfg_;
  Engine& engine_;
  const Frontend& frontend_;
  Metrics& metrics_;
  ProtocolLimits limits_;
  int64_t created_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
  std::unique_ptr<ResponsesApi> responses_;  // /v1/responses and its store
  std::once_flag structured_once_;
  // The reasoning section's start / end token ids ("<think>", "</think>", each when it is a
  // single token) when a reasoning parser is on; -1 otherwise. Set once, from the tokenizer;
  // the thinking budget needs both, the structured-output start only the end.
  const SamplingParams::ThinkingBudget& reasoning_markers();
  SamplingParams::ThinkingBudget reasoning_markers_;
  std::once_flag reasoning_markers_once_;
  StructuredContext structured_ctx_;
  structured::GrammarCache grammar_cache_;
  PrepPool prep_;  // last: its workers use the members above until joined
};

}  // namespace moeserve::server
