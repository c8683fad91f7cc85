#include "server/gate_handler.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/log.h"
#include "server/errors.h"

namespace moeserve::server {
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Starlette's SAFELISTED_HEADERS: always allowed in a preflight.
const std::vector<std::string> kSafelisted = {"accept", "accept-language", "content-language", "content-type"};

// Forwards to the connection's sink; logs one access line when the response is complete.
class LoggedSink : public ResponseSink {
 public:
  LoggedSink(std::shared_ptr<ResponseSink> inner, std::string request_line)
      : inner_(std::move(inner)), line_(std::move(request_line)), t0_(std::chrono::steady_clock::now()) {}
  void send(int status, const std::string& content_type, std::string body) override {
    if (!inner_->disconnected()) log(status, "");
    inner_->send(status, content_type, std::move(body));
  }
  void start_stream(const std::string& content_type) override {
    streaming_ = true;
    inner_->start_stream(content_type);
  }
  void stream_write(std::string data) override { inner_->stream_write(std::move(data)); }
  void end_stream() override {
    if (streaming_ && !inner_->disconnected()) log(200, " (stream)");
    streaming_ = false;
    inner_->end_stream();
  }
  void post(std::function<void()> fn) override { inner_->post(std::move(fn)); }
  void on_disconnect(std::function<void()> fn) override {
    inner_->on_disconnect([this_line = line_, t0 = t0_, fn = std::move(fn)] {
      spdlog::info("{} client disconnected after {:.1f} ms", this_line,
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (fn) fn();
    });
  }
  bool disconnected() const override { return inner_->disconnected(); }
  void add_header(const std::string& name, const std::string& value) override { inner_->add_header(name, value); }

 private:
  void log(int status, const char* what) {
    spdlog::info("{} {} {}{} {:.1f} ms", line_, status, status_text(status), what,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count());
  }
  std::shared_ptr<ResponseSink> inner_;
  std::string line_;
  std::chrono::steady_clock::time_point t0_;
  bool streaming_ = false;
};

}  // namespace

GateHandler::GateHandler(GateConfig cfg) : cfg_(std::move(cfg)) {
  auto has_star = [](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "*") != v.end(); };
  all_origins_ = has_star(cfg_.cors.origins);
  all_headers_ = has_star(cfg_.cors.headers);
  if (has_star(cfg_.cors.methods)) methods_ = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
  else
    for (const auto& m : cfg_.cors.methods) methods_.push_back(m);
  for (auto& h : cfg_.cors.headers) h = lower(h);
  while (cfg_.root_path.size() > 1 && cfg_.root_path.back() == '/') cfg_.root_path.pop_back();
  if (cfg_.root_path == "/") cfg_.root_path.clear();
}

void GateHandler::set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lk(mu_);
  phase_ = phase;
}

void GateHandler::set_ready(Handler* ready) { ready_.store(ready); }

bool GateHandler::origin_allowed(const std::string& origin) const {
  return all_origins_ || std::find(cfg_.cors.origins.begin(), cfg_.cors.origins.end(), origin) != cfg_.cors.origins.end();
}

void GateHandler::add_cors_headers(const HttpRequest& req, ResponseSink& sink) const {
  const std::string origin = req.header("origin");
  if (all_origins_ && !(cfg_.cors.credentials && !origin.empty())) {
    sink.add_header("Access-Control-Allow-Origin", "*");
  } else if (!origin.empty() && origin_allowed(origin)) {
    sink.add_header("Access-Control-Allow-Origin", origin);
    sink.add_header("Vary", "Origin");
  }
  if (cfg_.cors.credentials && (!origin.empty() || all_origins_))
    sink.add_header("Access-Control-Allow-Credentials", "true");
}

// Starlette's CORSMiddleware.preflight_response: 200 "OK" with the allow headers, or 400
// naming what is disallowed (still with the headers, so the browser reports it).
bool GateHandler::preflight(const HttpRequest& req, ResponseSink& sink) {
  const std::string origin = req.header("origin");
  const std::string method = req.header("access-control-request-method");
  if (req.method != "OPTIONS" || origin.empty() || method.empty()) return false;
  std::vector<std::string> failures;
  if (all_origins_ && !cfg_.cors.credentials) {
    sink.add_header("Access-Control-Allow-Origin", "*");
  } else if (origin_allowed(origin)) {
    sink.add_header("Access-Control-Allow-Origin", origin);
    sink.add_header("Vary", "Origin");
  } else {
    failures.push_back("origin");
  }
  sink.add_header("Access-Control-Allow-Methods", fmt::format("{}", fmt::join(methods_, ", ")));
  sink.add_header("Access-Control-Max-Age", "600");
  if (cfg_.cors.credentials) sink.add_header("Access-Control-Allow-Credentials", "true");
  if (std::find(methods_.begin(), methods_.end(), method) == methods_.end()) failures.push_back("method");
  const std::string requested = req.header("access-control-request-headers");
  if (all_headers_) {
    if (!requested.empty()) sink.add_header("Access-Control-Allow-Headers", requested);
  } else {
    std::vector<std::string> allowed = kSafelisted;
    for (const auto& h : cfg_.cors.headers)
      if (std::find(allowed.begin(), allowed.end(), h) == allowed.end()) allowed.push_back(h);
    std::sort(allowed.begin(), allowed.end());
    sink.add_header("Access-Control-Allow-Headers", fmt::format("{}", fmt::join(allowed, ", ")));
    std::stringstream ss(requested);
    for (std::string h; std::getline(ss, h, ',');) {
      h = lower(trim(h));
      if (!h.empty() && std::find(allowed.begin(), allowed.end(), h) == allowed.end()) {
        failures.push_back("headers");
        break;
      }
    }
  }
  if (failures.empty()) sink.send(200, "text/plain; charset=utf-8", "OK");
  else sink.send(400, "text/plain; charset=utf-8", fmt::format("Disallowed CORS {}", fmt::join(failures, ", ")));
  return true;
}

void GateHandler::handle(HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
  if (!cfg_.root_path.empty() && req.target.rfind(cfg_.root_path, 0) == 0) {
    const char next = req.target.size() > cfg_.root_path.size() ? req.target[cfg_.root_path.size()] : '\0';
    if (next == '/' || next == '?' || next == '\0') {
      req.target.erase(0, cfg_.root_path.size());
      if (req.target.empty() || req.target[0] != '/') req.target.insert(0, "/");
    }
  }
  if (cfg_.access_log) {
    const std::string path = req.target.substr(0, req.target.find('?'));
    sink = std::make_shared<LoggedSink>(std::move(sink), fmt::format("\"{} {}\"", req.method, path));
  }
  if (preflight(req, *sink)) return;
  add_cors_headers(req, *sink);
  Handler* ready = ready_.load();
  if (!ready) {
    const std::string path = req.target.substr(0, req.target.find('?'));
    std::string phase;
    {
      std::lock_guard<std::mutex> lk(mu_);
      phase = phase_;
    }
    sink->add_header("Retry-After", "5");
    if (path == "/health" || path == "/ping") sink->send(503, "text/plain; charset=utf-8", "");
    else
      sink->send(503, "application/json",
                 error_body(503, "ServiceUnavailableError", "model is loading (" + phase + "); retry when /health answers 200"));
    return;
  }
  try {
    ready->handle(std::move(req), sink);
  } catch (const ApiError& e) {
    sink->send(e.status, "application/json", error_body(e));
  }
}

}  // namespace moeserve::server
