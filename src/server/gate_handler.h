// The Handler the HTTP server is given from the moment it binds (before the model loads):
//  - loading phase: until set_ready(), /health and /ping answer 503 (empty body) and every
//    other path 503 with an OpenAI-style error ("model is loading: <phase>");
//  - CORS as vLLM's Starlette CORSMiddleware (--allowed-origins/-methods/-headers,
//    --allow-credentials): preflights (OPTIONS + Origin + Access-Control-Request-Method)
//    answered here, Access-Control-Allow-* headers on the other responses;
//  - --root-path: a target under the prefix is routed without it;
//  - --enable-log-requests: one access line per request (method, path, status, time).
// Everything else goes to the ready handler (the OpenAI service). No connection code here.
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "server/http_server.h"

namespace moeserve::server {

struct CorsConfig {
  std::vector<std::string> origins{"*"}, methods{"*"}, headers{"*"};
  bool credentials = false;
};

struct GateConfig {
  CorsConfig cors;
  std::string root_path;  // "" or "/prefix"
  bool access_log = false;
};

class GateHandler : public Handler {
 public:
  explicit GateHandler(GateConfig cfg);
  // What /health's 503 says while loading ("downloading", "loading weights", "warming up").
  void set_phase(const std::string& phase);
  // From now on requests go to `ready` (which must outlive the server's io threads).
  void set_ready(Handler* ready);
  void handle(HttpRequest&& req, std::shared_ptr<ResponseSink> sink) override;

 private:
  bool preflight(const HttpRequest& req, ResponseSink& sink);
  void add_cors_headers(const HttpRequest& req, ResponseSink& sink) const;
  bool origin_allowed(const std::string& origin) const;

  GateConfig cfg_;
  bool all_origins_, all_headers_;
  std::vector<std::string> methods_;  // "*" expanded
  std::atomic<Handler*> ready_{nullptr};
  mutable std::mutex mu_;
  std::string phase_ = "starting";
};

}  // namespace moeserve::server
