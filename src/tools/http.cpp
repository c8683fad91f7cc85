#include "tools/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>

namespace moeserve::hub {
namespace {

std::once_flag g_curl_init;

struct Handle {
  CURL* h = nullptr;
  Handle() {
    std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    h = curl_easy_init();
  }
  ~Handle() {
    if (h) curl_easy_cleanup(h);
  }
};

struct Ctx {
  const HttpRequest* req;
  HttpResponse* resp;
};

std::string trim(std::string s) {
  auto sp = [](unsigned char c) { return std::isspace(c); };
  while (!s.empty() && sp(s.back())) s.pop_back();
  size_t i = 0;
  while (i < s.size() && sp(s[i])) ++i;
  return s.substr(i);
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* c = static_cast<Ctx*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after 100-continue): start over
    c->resp->headers.clear();
    auto sp = line.find(' ');
    if (sp != std::string::npos) c->resp->status = std::strtol(line.c_str() + sp + 1, nullptr, 10);
    return size * n;
  }
  auto colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  c->resp->headers[name] = trim(line.substr(colon + 1));
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* c = static_cast<Ctx*>(user);
  const size_t len = size * n;
  const bool ok = c->resp->status >= 200 && c->resp->status < 300;
  if (c->req->sink && ok) {
    if (!c->req->sink(*c->resp, data, len)) {
      c->resp->stopped_by_sink = true;
      return 0;  // makes curl stop with CURLE_WRITE_ERROR
    }
    return len;
  }
  if (c->resp->body.size() + len > c->req->max_body) return 0;
  c->resp->body.append(data, len);
  return len;
}

}  // namespace

HttpResponse http_perform(const HttpRequest& req) {
  thread_local Handle handle;
  HttpResponse resp;
  CURL* h = handle.h;
  if (!h) {
    resp.transport_error = true;
    resp.error = "curl_easy_init failed";
    return resp;
  }
  curl_easy_reset(h);
  Ctx ctx{&req, &resp};
  curl_slist* hdrs = nullptr;
  for (auto& s : req.headers) hdrs = curl_slist_append(hdrs, s.c_str());
  curl_easy_setopt(h, CURLOPT_URL, req.url.c_str());
  if (req.method == "HEAD") curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, req.connect_timeout_s);
  if (req.total_timeout_s > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT, req.total_timeout_s);
  if (req.stall_timeout_s > 0) {
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, req.stall_timeout_s);
  }
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &ctx);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &ctx);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);  // fewer, larger writes for multi-GB shards
  // A proxy from the environment never applies to loopback (local mirrors, tests).
  const std::string origin = url_origin(req.url);
  for (const char* lo : {"://127.0.0.1", "://localhost", "://[::1]"}) {
    const auto at = origin.find(lo);
    if (at != std::string::npos) {
      const char next = at + std::strlen(lo) < origin.size() ? origin[at + std::strlen(lo)] : '\0';
      if (next == '\0' || next == ':') curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    }
  }
  const CURLcode rc = curl_easy_perform(h);
  curl_slist_free_all(hdrs);
  if (rc != CURLE_OK && !resp.stopped_by_sink) {
    resp.transport_error = true;
    resp.dns_failure = rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY;
    resp.error = curl_easy_strerror(rc);
  }
  return resp;
}

std::string url_origin(const std::string& url) {
  auto p = url.find("://");
  if (p == std::string::npos) return "";
  auto end = url.find_first_of("/?#", p + 3);
  std::string o = url.substr(0, end == std::string::npos ? url.size() : end);
  std::transform(o.begin(), o.end(), o.begin(), [](unsigned char ch) { return std::tolower(ch); });
  // Default ports name the same origin as no port.
  auto strip = [&](const char* scheme, const char* port) {
    if (o.rfind(scheme, 0) == 0 && o.size() > std::string(port).size() &&
        o.compare(o.size() - std::string(port).size(), std::string::npos, port) == 0)
      o.resize(o.size() - std::string(port).size());
  };
  strip("http://", ":80");
  strip("https://", ":443");
  return o;
}

std::string url_join(const std::string& base, const std::string& location) {
  if (location.find("://") != std::string::npos) return location;
  if (location.rfind("//", 0) == 0) return base.substr(0, base.find("://") + 1) + location;
  const std::string origin = [&] {
    auto p = base.find("://");
    auto end = base.find_first_of("/?#", p + 3);
    return base.substr(0, end == std::string::npos ? base.size() : end);
  }();
  if (!location.empty() && location[0] == '/') return origin + location;
  // Relative to the base's directory.
  auto q = base.find_first_of("?#", origin.size());
  std::string path = base.substr(origin.size(), q == std::string::npos ? std::string::npos : q - origin.size());
  path = path.substr(0, path.rfind('/') + 1);
  if (path.empty()) path = "/";
  return origin + path + location;
}

std::string url_quote(const std::string& s, const std::string& safe) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || safe.find(char(c)) != std::string::npos) {
      out += char(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string link_next(const std::string& link) {
  // Link: <https://.../tree/x?cursor=abc>; rel="next", <...>; rel="prev"
  size_t pos = 0;
  while (pos < link.size()) {
    auto lt = link.find('<', pos);
    if (lt == std::string::npos) break;
    auto gt = link.find('>', lt);
    if (gt == std::string::npos) break;
    auto next_lt = link.find('<', gt);
    std::string params = link.substr(gt + 1, next_lt == std::string::npos ? std::string::npos : next_lt - gt - 1);
    std::string lower = params;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
    lower.erase(std::remove(lower.begin(), lower.end(), ' '), lower.end());
    if (lower.find("rel=\"next\"") != std::string::npos || lower.find("rel=next") != std::string::npos)
      return link.substr(lt + 1, gt - lt - 1);
    if (next_lt == std::string::npos) break;
    pos = next_lt;
  }
  return "";
}

}  // namespace moeserve::hub
