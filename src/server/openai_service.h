// The OpenAI-compatible routes (serving-api.md §1-6) on top of the Engine: request parsing,
// chat templating and tokenization, submission of one engine request per choice, and the
// output path. The engine's on_output callback (engine thread) only queues the delivery and
// posts a drain to the connection's strand; detokenization, parsing and formatting run there.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/frontend.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace moeserve::server {

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
  bool force_include_usage = false;  // --enable-force-include-usage: every stream ends with usage
};

class OpenAIService : public Handler {
 public:
  OpenAIService(ServiceConfig cfg, Engine& engine, const Frontend& frontend, Metrics& metrics);
  void handle(HttpRequest&& req, std::shared_ptr<ResponseSink> sink) override;
  // While draining, new generation requests get 503 and /health answers 503.
  void set_draining(bool d) { draining_ = d; }
  // Generation requests whose response has not ended.
  int active_requests() const { return active_.load(); }

  // Internal, used by the per-request state.
  Engine& engine() { return engine_; }
  Metrics& metrics() { return metrics_; }
  const Frontend& frontend() const { return frontend_; }
  const ServiceConfig& config() const { return cfg_; }
  std::atomic<int>& active_counter() { return active_; }

 private:
  void generate(const HttpRequest& req, std::shared_ptr<ResponseSink> sink, bool chat);
  void tokenize(const HttpRequest& req, ResponseSink& sink);
  void detokenize(const HttpRequest& req, ResponseSink& sink);
  std::string models_json() const;
  void check_model(const std::string& model) const;

  ServiceConfig cfg_;
  Engine& engine_;
  const Frontend& frontend_;
  Metrics& metrics_;
  ProtocolLimits limits_;
  int64_t created_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
};

}  // namespace moeserve::server
