// The Hugging Face hub protocol as huggingface_hub speaks it (see
// shared/reference/hf-hub.md): revision -> commit, recursive file listing with Link
// pagination, the metadata HEAD on the resolve URL (X-Repo-Commit, X-Linked-Etag,
// X-Linked-Size, Location), and errors mapped from status + X-Error-Code to messages a
// user can act on. Transient failures (5xx, 408, 429, resets, timeouts) are retried with
// exponential backoff; everything else is a HubError.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/http.h"

namespace moeserve::hub {

// A failure worth retrying: the next attempt may succeed (server 5xx, reset, stall).
class TransientError : public Error {
 public:
  TransientError(const std::string& what, double retry_after_s = 0) : Error(what), retry_after_s(retry_after_s) {}
  double retry_after_s;  // from Retry-After, 0 = use the backoff
};

// A definitive failure from the hub (401/403/404/...); message says what to do.
class HubError : public Error {
 public:
  HubError(const std::string& what, long status) : Error(what), status(status) {}
  long status;
};

struct RetryPolicy {
  // As huggingface_hub's http_backoff: 5 retries, waits doubling up to 8 s (0.5+1+2+4+8 s).
  int max_attempts = 6;        // per operation; an attempt that made progress does not count
  double base_delay_s = 0.5;   // doubled per failed attempt, with jitter
  double max_delay_s = 8.0;
  double delay_for(int failed_attempts, double retry_after_s) const;
};

struct HubConfig {
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT, no trailing '/'
  std::string token;                                // empty = anonymous
  std::string repo_id;                              // "org/name"
  std::string repo_type = "model";                  // model | dataset | space
  std::string user_agent = "moeserve";
  long etag_timeout_s = 10;                         // HF_HUB_ETAG_TIMEOUT: metadata requests
  long download_timeout_s = 10;                     // HF_HUB_DOWNLOAD_TIMEOUT: stall limit on transfers
  RetryPolicy retry;
};

// One entry of the recursive tree listing.
struct RepoFile {
  std::string path;
  int64_t size = -1;        // -1 when the listing did not say (siblings fallback)
  std::string oid;          // git blob sha1
  std::string lfs_sha256;   // lfs.oid: sha256 of the whole file; empty for git-stored files
  std::string etag() const { return !lfs_sha256.empty() ? lfs_sha256 : oid; }
};

// What the metadata HEAD on the resolve URL says about one file.
struct FileMeta {
  std::string commit;        // X-Repo-Commit
  std::string etag;          // X-Linked-Etag, else ETag; W/ and quotes stripped
  int64_t size = -1;         // X-Linked-Size, else Content-Length of a non-redirect
  std::string download_url;  // Location of the 302 (file host), or the resolve URL itself
};

class HubClient {
 public:
  explicit HubClient(HubConfig cfg);
  const HubConfig& config() const { return cfg_; }

  // Commit sha of a branch/tag/commit (GET /api/{type}s/{repo}/revision/{rev}).
  std::string resolve_revision(const std::string& revision);
  // All files at a commit (GET /api/{type}s/{repo}/tree/{commit}?recursive=true, paginated).
  // Falls back to the revision endpoint's siblings when the tree endpoint is missing.
  std::vector<RepoFile> list_files(const std::string& commit);
  // HEAD on the resolve URL; follows only relative (same-hub) redirects.
  FileMeta head_file(const std::string& commit, const std::string& path);

  std::string resolve_url(const std::string& revision, const std::string& path) const;
  std::string api_url(const std::string& tail) const;  // {endpoint}/api/{type}s/{repo}/{tail}
  // Request headers for `url`: the Authorization header only while `url` is on the hub's origin.
  std::vector<std::string> headers_for(const std::string& url) const;
  bool same_origin_as_hub(const std::string& url) const;

  // Runs `fn` until it returns, retrying TransientError per the policy. `what` names the
  // operation in the final error. Logs each retry at warn level.
  template <typename Fn>
  auto with_retries(const std::string& what, Fn&& fn) -> decltype(fn());

  // Turns a non-2xx hub response into the right exception (HubError or TransientError).
  // `what` is the object asked for ("file config.json", "revision main").
  [[noreturn]] void throw_for_status(const HttpResponse& r, const std::string& url, const std::string& what) const;

 private:
  HttpResponse get_json(const std::string& url, const std::string& what);
  HubConfig cfg_;
};

// fnmatch.fnmatchcase as huggingface_hub uses it: `*` and `?` also match '/', `[...]`
// classes with `!` negation; case-sensitive.
bool glob_match(const std::string& pattern, const std::string& name);
// filter_repo_objects: a pattern ending in '/' matches everything under it; allow-list
// first (empty = all), then the deny-list.
bool path_selected(const std::string& path, const std::vector<std::string>& include,
                   const std::vector<std::string>& exclude);
// "models--org--name" (datasets--..., spaces--...).
std::string repo_folder_name(const std::string& repo_id, const std::string& repo_type);
bool is_commit_sha(const std::string& s);  // 40 lower-case hex
bool is_sha256(const std::string& s);      // 64 lower-case hex (REGEX_SHA256)
// Strips W/ and quotes from an ETag header value.
std::string normalize_etag(const std::string& etag);
// Token lookup as utils/_auth.py: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, then the token file
// ($HF_TOKEN_PATH or $HF_HOME/token); none when HF_HUB_DISABLE_IMPLICIT_TOKEN is set.
std::string find_token();
std::string hf_home();       // $HF_HOME or ~/.cache/huggingface
std::string hf_hub_cache();  // $HF_HUB_CACHE or $HF_HOME/hub
std::string hf_endpoint();   // $HF_ENDPOINT without trailing '/'

// ----- template implementation -----
void sleep_seconds(double s);
void log_retry(const std::string& what, const std::string& why, int attempt, double delay_s);

template <typename Fn>
auto HubClient::with_retries(const std::string& what, Fn&& fn) -> decltype(fn()) {
  for (int attempt = 1;; ++attempt) {
    try {
      return fn();
    } catch (const TransientError& e) {
      if (attempt >= cfg_.retry.max_attempts)
        throw HubError(what + ": giving up after " + std::to_string(attempt) + " attempts: " + e.what(), 0);
      const double d = cfg_.retry.delay_for(attempt, e.retry_after_s);
      log_retry(what, e.what(), attempt, d);
      sleep_seconds(d);
    }
  }
}

}  // namespace moeserve::hub
