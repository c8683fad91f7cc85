// A tiny hub fetch for `moeserve plan REPO`: only config.json and the safetensors index, held
// in memory, no cache. (`moeserve pull` has the full hub client; this stays separate so
// `plan` needs nothing but these two small files.)
//   GET {HF_ENDPOINT}/{repo}/resolve/{quote(revision, safe='')}/{file}
//   authorization: Bearer $HF_TOKEN (libcurl drops it on a redirect to another host, which is
//   what the hub's CDN redirects need: the signed URL must not receive the token)
#include <curl/curl.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "tools/plan.h"

namespace moeserve::plan {
namespace {

size_t on_data(char* p, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > (size_t(64) << 20)) return 0;  // a config or index is never 64 MiB: abort
  out->append(p, size * n);
  return size * n;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Percent-encodes everything but unreserved characters (and '/' when keep_slash).
std::string quote(const std::string& s, bool keep_slash) {
  std::string o;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) o += char(c);
    else o += fmt::format("%{:02X}", c);
  }
  return o;
}

}  // namespace

bool looks_like_repo_id(const std::string& s) {
  if (std::filesystem::exists(s)) return false;
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= s.size() || s.find('/', slash + 1) != std::string::npos)
    return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '/')) return false;
  return s.find("..") == std::string::npos;
}

std::optional<std::string> fetch_repo_file(const std::string& repo, const std::string& file, const FetchOptions& opt) {
  MS_CHECK(looks_like_repo_id(repo), "'{}' is neither a directory nor a hub repo id (org/name)", repo);
  MS_CHECK(env("HF_HUB_OFFLINE") != "1", "HF_HUB_OFFLINE=1: cannot fetch {} of {}", file, repo);
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  std::string endpoint = !opt.endpoint.empty() ? opt.endpoint : env("HF_ENDPOINT");
  if (endpoint.empty()) endpoint = "https://huggingface.co";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  std::string token = !opt.token.empty() ? opt.token : env("HF_TOKEN");
  if (token.empty()) token = env("HUGGING_FACE_HUB_TOKEN");
  const std::string url = fmt::format("{}/{}/resolve/{}/{}", endpoint, repo, quote(opt.revision, false), quote(file, true));

  CURL* h = curl_easy_init();
  MS_CHECK(h, "libcurl: cannot create a handle");
  std::string body;
  char err[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = nullptr;
  if (!token.empty()) headers = curl_slist_append(headers, ("authorization: Bearer " + token).c_str());
  headers = curl_slist_append(headers, "user-agent: moeserve-plan");
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(h, CURLOPT_UNRESTRICTED_AUTH, 0L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, opt.timeout_s);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  const CURLcode rc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  MS_CHECK(rc == CURLE_OK, "GET {}: {}", url, err[0] ? err : curl_easy_strerror(rc));
  if (status == 404) return std::nullopt;
  if (status == 401 || status == 403)
    fail("GET {}: HTTP {} (gated or private repo: set HF_TOKEN, and accept the licence on the hub)", url, status);
  MS_CHECK(status == 200, "GET {}: HTTP {}", url, status);
  return body;
}

}  // namespace moeserve::plan
