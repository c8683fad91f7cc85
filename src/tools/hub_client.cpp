#include "tools/hub_client.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>

#include "core/bounded_json.h"

namespace moeserve::hub {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool all_hex(const std::string& s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// The server's own words: X-Error-Message, else {"error": "..."} in the body.
std::string server_message(const HttpResponse& r) {
  std::string m = r.header("x-error-message");
  if (!m.empty()) return m;
  try {
    auto j = parse_json_bounded_or_discarded(r.body);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) return j["error"].get<std::string>();
  } catch (...) {
  }
  return "";
}

// A value from the hub, cut and with control bytes shown as '?', for an error message.
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 120)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return s.size() > 120 ? out + "..." : out;
}

// Hub answers are untrusted: bounded nesting; unreadable answers are retried.
nlohmann::json parse_hub_json(const std::string& body, const std::string& url) {
  nlohmann::json j = parse_json_bounded_or_discarded(body);
  if (j.is_discarded())
    throw TransientError(fmt::format("invalid JSON (or nested deeper than {} levels) from {}", json_depth_limit(), url));
  return j;
}

// Redirects go to http(s) only (no file://, ftp://, gopher://, ...).
void check_redirect_scheme(const std::string& target, const std::string& from) {
  const std::string lower = [&] {
    std::string t = target.substr(0, 8);
    for (auto& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
    return t;
  }();
  if (lower.rfind("http://", 0) != 0 && lower.rfind("https://", 0) != 0)
    throw HubError(fmt::format("{} redirected to '{}': only http and https redirects are followed", from,
                               printable(target)),
                   0);
}

// One listing entry (tree or siblings), every field type-checked: a hostile or broken
// answer fails with the field named instead of an exception from the JSON library.
RepoFile listing_entry(const nlohmann::json& e, const char* path_key, const char* oid_key, const char* lfs_sha_key,
                       const std::string& url) {
  auto bad = [&](const std::string& field, const std::string& want) -> HubError {
    return HubError(fmt::format("file listing from {}: entry field '{}' is not {}", url, field, want), 0);
  };
  RepoFile f;
  const auto p = e.find(path_key);
  if (p == e.end() || !p->is_string()) throw bad(path_key, "a string");
  f.path = p->get<std::string>();
  auto read_size = [&](const nlohmann::json& obj, const std::string& name) {
    const auto sz = obj.find("size");
    if (sz == obj.end()) return;
    if (!sz->is_number_integer() || sz->get<int64_t>() < 0) throw bad(name, "a non-negative integer");
    f.size = sz->get<int64_t>();
  };
  read_size(e, "size");
  const auto oid = e.find(oid_key);
  if (oid != e.end()) {
    if (!oid->is_string() || !all_hex(oid->get<std::string>(), 40)) throw bad(oid_key, "a 40-hex git sha1");
    f.oid = oid->get<std::string>();
  }
  const auto lfs = e.find("lfs");
  if (lfs != e.end() && !lfs->is_null()) {
    if (!lfs->is_object()) throw bad("lfs", "an object");
    for (const char* key : {"oid", "sha256"}) {
      if (std::string(key) != "sha256" && std::string(key) != lfs_sha_key) continue;
      const auto h = lfs->find(key);
      if (h == lfs->end()) continue;
      if (!h->is_string() || !all_hex(h->get<std::string>(), 64)) throw bad(std::string("lfs.") + key, "a 64-hex sha256");
      f.lfs_sha256 = h->get<std::string>();
    }
    read_size(*lfs, "lfs.size");
  }
  return f;
}

}  // namespace

double RetryPolicy::delay_for(int failed_attempts, double retry_after_s) const {
  if (retry_after_s > 0) return std::min(retry_after_s, 60.0);
  thread_local std::mt19937 rng(std::random_device{}());
  double d = base_delay_s * double(1 << std::min(failed_attempts - 1, 20));
  d = std::min(d, max_delay_s);
  return d * std::uniform_real_distribution<double>(0.75, 1.25)(rng);
}

void sleep_seconds(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

void log_retry(const std::string& what, const std::string& why, int attempt, double delay_s) {
  spdlog::warn("{}: {} (attempt {}), retrying in {:.1f}s", what, why, attempt, delay_s);
}

HubClient::HubClient(HubConfig cfg) : cfg_(std::move(cfg)) {
  while (!cfg_.endpoint.empty() && cfg_.endpoint.back() == '/') cfg_.endpoint.pop_back();
  MS_CHECK(cfg_.repo_id.find('/') != std::string::npos || !cfg_.repo_id.empty(), "empty repository id");
  MS_CHECK(cfg_.repo_type == "model" || cfg_.repo_type == "dataset" || cfg_.repo_type == "space",
           "unknown repo type '{}' (model, dataset or space)", cfg_.repo_type);
}

std::string HubClient::api_url(const std::string& tail) const {
  return fmt::format("{}/api/{}s/{}/{}", cfg_.endpoint, cfg_.repo_type, cfg_.repo_id, tail);
}

std::string HubClient::resolve_url(const std::string& revision, const std::string& path) const {
  const std::string prefix = cfg_.repo_type == "model" ? "" : cfg_.repo_type + "s/";
  return fmt::format("{}/{}{}/resolve/{}/{}", cfg_.endpoint, prefix, cfg_.repo_id, url_quote(revision, ""),
                     url_quote(path, "/"));
}

bool HubClient::same_origin_as_hub(const std::string& url) const {
  return url_origin(url) == url_origin(cfg_.endpoint);
}

std::vector<std::string> HubClient::headers_for(const std::string& url) const {
  std::vector<std::string> h = {"User-Agent: " + cfg_.user_agent, "Accept-Encoding: identity"};
  if (!cfg_.token.empty() && same_origin_as_hub(url)) h.push_back("Authorization: Bearer " + cfg_.token);
  return h;
}

void HubClient::throw_for_status(const HttpResponse& r, const std::string& url, const std::string& what) const {
  // An unresolvable host name is not transient (offline machine, typo in HF_ENDPOINT): fail
  // at once instead of retrying.
  if (r.dns_failure)
    throw HubError(fmt::format("{}: {} (offline? HF_HUB_OFFLINE=1 uses the local cache only)", url, r.error), 0);
  if (r.transport_error) throw TransientError(fmt::format("{}: {}", url, r.error));
  const long s = r.status;
  if (s >= 500 || s == 408 || s == 429) {
    double ra = 0;
    const std::string h = r.header("retry-after");
    if (!h.empty()) ra = std::atof(h.c_str());
    throw TransientError(fmt::format("HTTP {} from {}", s, url), ra);
  }
  const std::string code = r.header("x-error-code");
  std::string msg = server_message(r);
  const std::string said = msg.empty() ? "" : fmt::format(" (server: {})", msg);
  const std::string repo = cfg_.repo_id;
  const bool have_token = !cfg_.token.empty();
  if (code == "GatedRepo")
    throw HubError(fmt::format("{} is a gated repository: access to {} is restricted (HTTP {}). Accept its terms at "
                               "{}/{} and {}{}",
                               repo, what, s, cfg_.endpoint, repo,
                               have_token ? "check that the token (HF_TOKEN / --token) belongs to an account with access"
                                          : "authenticate with HF_TOKEN or --token",
                               said),
                   s);
  if (code == "RepoNotFound")
    throw HubError(fmt::format("repository not found: {} at {} (HTTP {}). Check the name; if it is private or gated, "
                               "{}{}",
                               repo, cfg_.endpoint, s,
                               have_token ? "make sure the token has access to it" : "authenticate with HF_TOKEN or --token",
                               said),
                   s);
  if (code == "RevisionNotFound")
    throw HubError(fmt::format("revision not found in {}: {} (HTTP {}){}", repo, what, s, said), s);
  if (code == "EntryNotFound")
    throw HubError(fmt::format("file not found in {}: {} (HTTP {}){}", repo, what, s, said), s);
  switch (s) {
    case 401:
      throw HubError(fmt::format("authentication required for {} of {} (HTTP 401): {}{}", what, repo,
                                 have_token ? "the token was rejected; check HF_TOKEN / --token"
                                            : "the repository is private or gated; set HF_TOKEN or pass --token",
                                 said),
                     s);
    case 403:
      throw HubError(fmt::format("access denied to {} of {} (HTTP 403): {}{}", what, repo,
                                 have_token ? "the token lacks permission, or the repository is gated and its terms "
                                              "are not accepted"
                                            : "the repository is gated or private; set HF_TOKEN or pass --token",
                                 said),
                     s);
    case 404:
      throw HubError(fmt::format("not found (HTTP 404): {} of {} at {}{}", what, repo, url, said), s);
    default:
      throw HubError(fmt::format("HTTP {} for {} of {} at {}{}", s, what, repo, url, said), s);
  }
}

HttpResponse HubClient::get_json(const std::string& url, const std::string& what) {
  HttpRequest req;
  req.url = url;
  req.headers = headers_for(url);
  req.headers.push_back("Accept: application/json");
  req.total_timeout_s = std::max<long>(cfg_.etag_timeout_s * 6, 60);
  req.stall_timeout_s = cfg_.download_timeout_s;
  // Follow redirects that stay on the hub (renamed repositories answer 307 to the new name).
  for (int hop = 0; hop < 10; ++hop) {
    HttpResponse r = http_perform(req);
    if (!r.transport_error && r.status >= 300 && r.status < 400 && !r.header("location").empty()) {
      check_redirect_scheme(url_join(req.url, r.header("location")), req.url);
      req.url = url_join(req.url, r.header("location"));
      req.headers = headers_for(req.url);
      req.headers.push_back("Accept: application/json");
      continue;
    }
    if (r.transport_error || r.status < 200 || r.status >= 300) throw_for_status(r, req.url, what);
    return r;
  }
  throw HubError(fmt::format("too many redirects for {}", url), 0);
}

std::string HubClient::resolve_revision(const std::string& revision) {
  const std::string url = api_url("revision/" + url_quote(revision, ""));
  return with_retries("resolving revision " + revision, [&] {
    HttpResponse r = get_json(url, "revision " + revision);
    nlohmann::json j = parse_hub_json(r.body, url);
    MS_CHECK(j.is_object() && j.contains("sha") && j["sha"].is_string(),
             "revision info from {} has no 'sha' commit field", url);
    std::string sha = j["sha"].get<std::string>();
    MS_CHECK(is_commit_sha(sha), "revision info from {}: 'sha' is not a 40-hex commit: '{}'", url, sha);
    return sha;
  });
}

std::vector<RepoFile> HubClient::list_files(const std::string& commit) {
  std::vector<RepoFile> files;
  std::string url = api_url("tree/" + url_quote(commit, "")) + "?recursive=true&expand=false";
  try {
    for (int page = 0; !url.empty(); ++page) {
      MS_CHECK(page < 100000, "listing of {} does not end", cfg_.repo_id);
      HttpResponse r = with_retries("listing files", [&] {
        HttpResponse resp = get_json(url, "file listing at " + commit);
        parse_hub_json(resp.body, url);  // retried while unreadable
        return resp;
      });
      auto j = parse_hub_json(r.body, url);
      MS_CHECK(j.is_array(), "file listing from {} is not a JSON array", url);
      for (auto& e : j) {
        if (!e.is_object()) continue;
        const auto type = e.find("type");
        if (type != e.end() && !(type->is_string() && *type == "file")) continue;  // directories
        files.push_back(listing_entry(e, "path", "oid", "oid", url));
      }
      const std::string next = link_next(r.header("link"));
      url = next.empty() ? "" : url_join(url, next);
    }
    return files;
  } catch (const HubError& e) {
    if (e.status != 404 || !files.empty()) throw;
    spdlog::debug("tree listing not available ({}), using the revision's siblings", e.what());
  }
  // Fallback: the revision endpoint with ?blobs=true lists siblings (sizes and lfs sha256).
  const std::string rurl = api_url("revision/" + url_quote(commit, "")) + "?blobs=true";
  return with_retries("listing files", [&] {
    HttpResponse r = get_json(rurl, "revision " + commit);
    nlohmann::json j = parse_hub_json(r.body, rurl);
    MS_CHECK(j.is_object() && j.contains("siblings") && j["siblings"].is_array(),
             "neither a tree listing nor siblings for {} at {}", cfg_.repo_id, commit);
    std::vector<RepoFile> out;
    for (auto& s : j["siblings"]) {
      if (!s.is_object()) continue;
      out.push_back(listing_entry(s, "rfilename", "blobId", "sha256", rurl));
    }
    return out;
  });
}

FileMeta HubClient::head_file(const std::string& commit, const std::string& path) {
  const std::string first = resolve_url(commit, path);
  return with_retries("metadata of " + path, [&] {
    std::string url = first;
    for (int hop = 0; hop < 10; ++hop) {
      HttpRequest req;
      req.method = "HEAD";
      req.url = url;
      req.headers = headers_for(url);
      req.total_timeout_s = cfg_.etag_timeout_s;
      HttpResponse r = http_perform(req);
      if (r.transport_error) throw_for_status(r, url, "file " + path);
      const std::string loc = r.header("location");
      const bool redirect = r.status >= 300 && r.status < 400 && !loc.empty();
      // A redirect that carries no file metadata and stays on the hub (a renamed repo, a
      // relative Location) is followed; otherwise this response is the metadata and the
      // Location is where the bytes are (the file host).
      const bool has_meta = !r.header("x-linked-etag").empty() || !r.header("x-repo-commit").empty();
      if (redirect) check_redirect_scheme(url_join(url, loc), url);
      if (redirect && !has_meta && same_origin_as_hub(url_join(url, loc))) {
        url = url_join(url, loc);
        continue;
      }
      if (!redirect && (r.status < 200 || r.status >= 300)) throw_for_status(r, url, "file " + path);
      FileMeta m;
      m.commit = r.header("x-repo-commit");
      m.etag = normalize_etag(!r.header("x-linked-etag").empty() ? r.header("x-linked-etag") : r.header("etag"));
      std::string size = r.header("x-linked-size");
      if (size.empty() && !redirect) size = r.header("content-length");
      if (!size.empty()) m.size = std::strtoll(size.c_str(), nullptr, 10);
      m.download_url = redirect ? url_join(url, loc) : url;
      if (m.etag.empty())
        throw HubError(fmt::format("{}: the hub sent no ETag/X-Linked-Etag for {}; is {} a hub endpoint?", url, path,
                                   cfg_.endpoint),
                       r.status);
      // The ETag becomes a blob file name: only a hex digest may (git sha1 or LFS sha256).
      if (!is_commit_sha(m.etag) && !is_sha256(m.etag))
        throw HubError(fmt::format("{}: the hub's {} for {} is not a 40- or 64-character lower-case hex digest: '{}'",
                                   url, r.header("x-linked-etag").empty() ? "ETag" : "X-Linked-Etag", path,
                                   printable(m.etag)),
                       r.status);
      if (!m.commit.empty() && !is_commit_sha(m.commit))
        throw HubError(fmt::format("{}: the hub's X-Repo-Commit for {} is not a 40-character hex commit: '{}'", url,
                                   path, printable(m.commit)),
                       r.status);
      if (!size.empty()) {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(size.c_str(), &end, 10);
        if (errno != 0 || *end != '\0' || v < 0)
          throw HubError(fmt::format("{}: the hub's size for {} is not a non-negative integer: '{}'", url, path,
                                     printable(size)),
                         r.status);
      }
      return m;
    }
    throw HubError(fmt::format("too many redirects resolving {}", first), 0);
  });
}

bool glob_match(const std::string& p, const std::string& s) {
  // Iterative wildcard match with backtracking to the last '*'.
  size_t pi = 0, si = 0, star_p = std::string::npos, star_s = 0;
  auto class_match = [&](size_t& i, char c) -> int {  // -1: not a class; 0/1 result, i past ']'
    size_t j = i + 1;
    bool neg = false;
    if (j < p.size() && p[j] == '!') neg = true, ++j;
    size_t first = j;
    bool hit = false;
    for (; j < p.size() && (p[j] != ']' || j == first); ++j) {
      if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
        if (p[j] <= c && c <= p[j + 2]) hit = true;
        j += 2;
      } else if (p[j] == c) {
        hit = true;
      }
    }
    if (j >= p.size()) return -1;  // no closing ']': '[' is a literal
    i = j + 1;
    return hit != neg;
  };
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_s = si;
      continue;
    }
    if (pi < p.size()) {
      if (p[pi] == '?') {
        ++pi, ++si;
        continue;
      }
      if (p[pi] == '[') {
        size_t k = pi;
        int m = class_match(k, s[si]);
        if (m == 1) {
          pi = k, ++si;
          continue;
        }
        if (m == -1 && s[si] == '[') {
          ++pi, ++si;
          continue;
        }
      } else if (p[pi] == s[si]) {
        ++pi, ++si;
        continue;
      }
    }
    if (star_p == std::string::npos) return false;
    pi = star_p + 1;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool path_selected(const std::string& path, const std::vector<std::string>& include,
                   const std::vector<std::string>& exclude) {
  auto norm = [](std::string p) {
    for (auto& c : p)
      if (c == '\\') c = '/';
    if (!p.empty() && p.back() == '/') p += '*';
    return p;
  };
  if (!include.empty()) {
    bool any = false;
    for (auto& g : include) any = any || glob_match(norm(g), path);
    if (!any) return false;
  }
  for (auto& g : exclude)
    if (glob_match(norm(g), path)) return false;
  return true;
}

std::string repo_folder_name(const std::string& repo_id, const std::string& repo_type) {
  std::string out = repo_type + "s";
  size_t start = 0;
  while (true) {
    auto slash = repo_id.find('/', start);
    out += "--" + repo_id.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return out;
}

bool is_commit_sha(const std::string& s) { return all_hex(s, 40); }
bool is_sha256(const std::string& s) { return all_hex(s, 64); }

std::string normalize_etag(const std::string& etag) {
  std::string e = etag;
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

std::string hf_home() {
  std::string h = env("HF_HOME");
  if (!h.empty()) return h;
  std::string xdg = env("XDG_CACHE_HOME");
  if (!xdg.empty()) return xdg + "/huggingface";
  return env("HOME") + "/.cache/huggingface";
}

std::string hf_hub_cache() {
  std::string c = env("HF_HUB_CACHE");
  if (c.empty()) c = env("HUGGINGFACE_HUB_CACHE");  // legacy name, still honoured by huggingface_hub
  return c.empty() ? hf_home() + "/hub" : c;
}

std::string hf_endpoint() {
  std::string e = env("HF_ENDPOINT");
  if (e.empty()) e = "https://huggingface.co";
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

std::string find_token() {
  const std::string disable = env("HF_HUB_DISABLE_IMPLICIT_TOKEN");
  if (!disable.empty() && disable != "0" && disable != "false" && disable != "False") return "";
  auto trimmed = [](std::string t) {
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
    while (!t.empty() && (t.front() == ' ')) t.erase(t.begin());
    return t;
  };
  for (const char* name : {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}) {
    std::string t = trimmed(env(name));
    if (!t.empty()) return t;
  }
  std::string path = env("HF_TOKEN_PATH");
  if (path.empty()) path = hf_home() + "/token";
  std::ifstream f(path);
  if (!f) return "";
  std::string t((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return trimmed(t);
}

}  // namespace moeserve::hub
