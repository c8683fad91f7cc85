// HTTP/1.1 client side of `moeserve bench` (Boost.Beast + Asio C++20 coroutines). One io
// thread drives every request: a dispatcher releases request i at its arrival time, the
// request waits for a client-side concurrency slot (--max-concurrency, a FIFO semaphore),
// opens its own connection (`Connection: close`; no pooling, so each TTFT includes a
// loopback/LAN connect), POSTs the JSON body and feeds the streamed body to an SseRecorder
// with the arrival time of each read. Plain http:// only.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tools/bench_serve/metrics.h"

namespace moeserve::bench {

struct BaseUrl {
  std::string host, port = "80";
  std::string prefix;  // path before the endpoint, no trailing '/'
  std::string str() const { return "http://" + host + ":" + port + prefix; }
};
// "http://host[:port][/prefix]". Throws moeserve::Error for other schemes or a bad form.
BaseUrl parse_base_url(const std::string& url);

struct HttpResponse {
  int status = 0;
  std::string body;
};
// Blocking GET of prefix + path; throws moeserve::Error (with the URL) on a connection error
// or after timeout_s.
HttpResponse http_get(const BaseUrl& url, const std::string& path, const std::string& api_key, double timeout_s);

struct LoadPlan {
  BaseUrl url;
  std::string endpoint;  // e.g. /v1/completions
  bool chat = false;
  std::string api_key;  // Authorization: Bearer, when set
  std::vector<std::string> bodies;
  std::vector<int64_t> prompt_lens;  // dataset counts (replaced by usage.prompt_tokens)
  std::vector<double> arrival_s;     // cumulative release time of each request
  int max_concurrency = 0;           // 0: unlimited
  std::function<void(size_t done)> on_done;  // called on the io thread after each request
};
// Runs the plan; returns one output per body (same order) and the wall time from the first
// release to the last completion in *duration_s.
std::vector<RequestOutput> run_load(const LoadPlan& plan, double* duration_s);

}  // namespace moeserve::bench
