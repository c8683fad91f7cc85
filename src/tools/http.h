// A thin blocking HTTP client over libcurl for the hub downloader (moeserve pull).
// Redirects are never followed here: the hub client follows them itself, so it can read
// the hub's headers on a 302 and decide per hop whether the Authorization header may go
// along (it may not leave the hub's origin). One curl handle is kept per thread, so
// requests from one worker reuse their keep-alive connection.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace moeserve::hub {

struct HttpResponse {
  long status = 0;                            // 0 when the transfer failed before a status line
  std::map<std::string, std::string> headers;  // lower-case names; the last response of the exchange
  std::string body;                           // collected when there is no sink, or for status >= 300
  bool dns_failure = false;  // the host name did not resolve (offline): retrying does not help
  bool transport_error = false;               // connection refused/reset, timeout, short body, ...
  std::string error;                          // curl's message for a transport error
  bool stopped_by_sink = false;               // the sink returned false (not an error by itself)

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

struct HttpRequest {
  std::string method = "GET";        // GET or HEAD
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  long connect_timeout_s = 10;
  long total_timeout_s = 0;          // whole exchange; 0 = no limit
  long stall_timeout_s = 20;         // abort when fewer than 1 byte/s arrive for this long
  // Receives the body of a 2xx response as it streams; return false to stop the transfer.
  // Without a sink the body is collected into HttpResponse::body (bounded by max_body).
  std::function<bool(const HttpResponse&, const char*, size_t)> sink;
  size_t max_body = size_t(64) << 20;
};

HttpResponse http_perform(const HttpRequest& req);

// "scheme://host[:port]" of an absolute URL, lower-cased host; "" for a relative one.
std::string url_origin(const std::string& url);
// Resolves a Location header against the URL it came from (absolute, or path-absolute "/...").
std::string url_join(const std::string& base, const std::string& location);
// Percent-encodes everything but unreserved characters and the characters in `safe`
// (Python's urllib.parse.quote).
std::string url_quote(const std::string& s, const std::string& safe = "/");
// The URL of `<...>; rel="next"` in a Link header, or "".
std::string link_next(const std::string& link_header);

}  // namespace moeserve::hub
