#include "tools/downloader.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <thread>

#include "tools/hub_cache.h"
#include "core/bounded_json.h"

namespace moeserve::hub {
namespace {

// A FIFO of work items run by N threads; items may push more items (front = run next).
class WorkQueue {
 public:
  void push(std::function<void()> f, bool front = false) {
    std::lock_guard<std::mutex> lk(mu_);
    if (front)
      q_.push_front(std::move(f));
    else
      q_.push_back(std::move(f));
    ++outstanding_;
    cv_.notify_one();
  }
  void run(int threads) {
    std::vector<std::thread> ts;
    for (int i = 0; i < std::max(1, threads); ++i) ts.emplace_back([this] { loop(); });
    for (auto& t : ts) t.join();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return !q_.empty() || outstanding_ == 0; });
      if (q_.empty()) return;
      auto f = std::move(q_.front());
      q_.pop_front();
      lk.unlock();
      f();
      lk.lock();
      if (--outstanding_ == 0) cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  int outstanding_ = 0;
};

struct Chunk {
  int64_t start = 0, end = 0, done = 0;  // bytes [start, end); `done` of them written from start
};

struct Job {
  RepoFile entry;
  FileMeta meta;
  std::string etag, sha256;
  int64_t size = 0;
  fs::path final_path, incomplete, sidecar, lock_path;
  std::mutex mu;
  std::vector<Chunk> chunks;
  bool multi = false;  // chunks tracked in the sidecar, file preallocated
  int fd = -1, lock_fd = -1;
  int chunks_left = 0;
  bool failed = false;
  std::string error;
  int checksum_tries = 0;
  int pid = -1;  // progress id
  int64_t unsaved = 0;
  std::chrono::steady_clock::time_point saved_at;
};

bool pwrite_all(int fd, const char* p, int64_t n, int64_t off) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, size_t(n), off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w, n -= w, off += w;
  }
  return true;
}

class Puller {
 public:
  Puller(HubClient& hub, const PullOptions& opt, Progress& prog) : hub_(hub), opt_(opt), prog_(prog) {}
  PullSummary run();

 private:
  bool is_present(const std::string& path, const std::string& etag, int64_t size, const std::string& sha);
  void prepare(const RepoFile& f);
  void plan_and_start(Job& j);
  void run_chunk(Job& j, size_t ci);
  void chunk_done(Job& j);
  void finalize(Job& j);
  void fail(Job& j, const std::string& msg);
  void cleanup_failed(Job& j);
  void save_sidecar(Job& j);  // j.mu held
  void mark_present(const std::string& path, const std::string& etag);
  void record_error(const std::string& msg);

  HubClient& hub_;
  const PullOptions& opt_;
  Progress& prog_;
  bool cache_mode_ = true;
  CacheLayout cl_;
  fs::path local_;
  std::string commit_;
  WorkQueue q_;
  std::mutex res_mu_;
  PullSummary sum_;
  std::deque<std::unique_ptr<Job>> jobs_;
};

void Puller::record_error(const std::string& msg) {
  std::lock_guard<std::mutex> lk(res_mu_);
  sum_.failed++;
  sum_.errors.push_back(msg);
  spdlog::error("{}", msg);
}

void Puller::mark_present(const std::string& path, const std::string& etag) {
  if (cache_mode_) make_snapshot_link(cl_, commit_, path, etag);
  std::lock_guard<std::mutex> lk(res_mu_);
  sum_.present++;
  spdlog::debug("{}: already present and verified", path);
}

// A verified copy is already in place: the right size and, for LFS files (sha256 etag)
// when verify_existing is on, the right hash. A cached blob that fails is removed.
bool Puller::is_present(const std::string& path, const std::string& etag, int64_t size, const std::string& sha) {
  std::error_code ec;
  // The content check: sha256 for LFS files, the git blob sha1 for git-stored ones (when
  // the ETag has that shape).
  auto content_ok = [&](const fs::path& p) {
    if (!opt_.verify_existing) return true;
    if (!sha.empty()) return sha256_file(p) == sha;
    return !is_commit_sha(etag) || git_etag_matches(p, etag);
  };
  if (cache_mode_) {
    const fs::path b = cl_.blob(etag);
    if (!fs::is_regular_file(b, ec)) return false;
    const bool ok = int64_t(fs::file_size(b, ec)) == size && content_ok(b);
    if (!ok) {
      spdlog::warn("{}: cached blob {} is damaged (size or sha256 differ); fetching it again", path, b.string());
      fs::remove(b, ec);
    }
    return ok;
  }
  const fs::path f = local_ / path;
  if (!fs::is_regular_file(f, ec) || int64_t(fs::file_size(f, ec)) != size) return false;
  auto md = read_local_metadata(local_, path);
  if (md && md->etag == etag) return content_ok(f);
  // No metadata (or another etag): only a hash can prove the file is the right one.
  if ((!sha.empty() && sha256_file(f) == sha) || (sha.empty() && is_commit_sha(etag) && git_etag_matches(f, etag))) {
    write_local_metadata(local_, path, commit_, etag);
    return true;
  }
  return false;
}

void Puller::prepare(const RepoFile& f) {
  try {
    const std::string etag0 = f.etag();
    if (!etag0.empty() && f.size >= 0 && is_present(f.path, etag0, f.size, f.lfs_sha256)) {
      mark_present(f.path, etag0);
      return;
    }
    FileMeta m = hub_.head_file(commit_, f.path);
    if (!m.commit.empty() && m.commit != commit_)
      spdlog::warn("{}: the hub resolved commit {} to {}", f.path, commit_, m.commit);
    if (!f.lfs_sha256.empty() && m.etag != f.lfs_sha256)
      spdlog::warn("{}: listing says sha256 {}, the hub's ETag is {}; using the ETag", f.path, f.lfs_sha256, m.etag);
    auto j = std::make_unique<Job>();
    j->entry = f;
    j->etag = m.etag;
    j->sha256 = is_sha256(m.etag) ? m.etag : f.lfs_sha256;
    j->size = m.size >= 0 ? m.size : f.size;
    MS_CHECK(j->size >= 0, "{}: the hub gave no size for the file", f.path);
    j->meta = std::move(m);
    if (j->etag != etag0 && is_present(f.path, j->etag, j->size, j->sha256)) {
      mark_present(f.path, j->etag);
      return;
    }
    MS_CHECK(is_sha256(j->etag) || is_commit_sha(j->etag), "{}: ETag '{}' is not a hex digest", f.path, j->etag);
    if (cache_mode_) {
      j->final_path = cl_.blob(j->etag);
      j->incomplete = j->final_path.string() + ".incomplete";
      j->lock_path = cl_.lock(j->etag);
    } else {
      j->final_path = local_ / f.path;
      const fs::path md = local_metadata_path(local_, f.path);
      j->incomplete = md.parent_path() / (md.filename().string().substr(0, md.filename().string().size() - 9) + "." +
                                          j->etag + ".incomplete");
      j->lock_path = md.parent_path() / (md.filename().string() + ".lock");
    }
    j->sidecar = j->incomplete.string() + ".json";
    // Every path this job creates stays inside the target (no "..", no symlinked folder
    // leading out of it).
    const fs::path& root = cache_mode_ ? cl_.repo_dir.parent_path() : local_;
    for (const fs::path* p : {&j->final_path, &j->incomplete, &j->sidecar, &j->lock_path}) check_inside(root, *p);
    fs::create_directories(j->incomplete.parent_path());
    fs::create_directories(j->lock_path.parent_path());
    // One process (and one worker) per blob: files with equal content share a blob.
    j->lock_fd = ::open(j->lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    MS_CHECK(j->lock_fd >= 0, "cannot create lock file {}", j->lock_path.string());
    while (::flock(j->lock_fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    std::error_code ec;
    if (cache_mode_ && fs::is_regular_file(j->final_path, ec) && int64_t(fs::file_size(j->final_path, ec)) == j->size) {
      ::close(j->lock_fd);  // another worker or process finished it meanwhile
      mark_present(f.path, j->etag);
      return;
    }
    Job* jp = j.get();
    {
      std::lock_guard<std::mutex> lk(res_mu_);
      jobs_.push_back(std::move(j));
    }
    plan_and_start(*jp);
  } catch (const std::exception& e) {
    record_error(fmt::format("{}: {}", f.path, e.what()));
  }
}

// Reads what an earlier run left (sidecar or partial file), decides the ranges still to
// fetch, opens the .incomplete file and queues one work item per range.
void Puller::plan_and_start(Job& j) {
  std::error_code ec;
  j.chunks.clear();
  j.multi = false;
  const int64_t have_file = fs::exists(j.incomplete, ec) ? int64_t(fs::file_size(j.incomplete, ec)) : -1;
  try {
    std::ifstream sf(j.sidecar);
    if (sf && have_file == j.size) {
      auto s = parse_json_bounded(std::string(std::istreambuf_iterator<char>(sf), {}), j.sidecar.string());
      if (s.at("etag") == j.etag && s.at("size") == j.size) {
        for (auto& c : s.at("chunks")) j.chunks.push_back({c.at(0), c.at(1), c.at(2)});
        j.multi = true;
      }
    }
  } catch (const std::exception&) {
    j.chunks.clear();
  }
  if (!j.multi) {
    fs::remove(j.sidecar, ec);
    int64_t have = std::max<int64_t>(have_file, 0);
    if (have > j.size) {
      fs::remove(j.incomplete, ec);
      have = 0;
    }
    if (j.size - have > opt_.chunk_size && opt_.max_workers > 1 && opt_.chunk_size > 0) {
      j.multi = true;
      if (have > 0) j.chunks.push_back({0, have, have});
      for (int64_t s = have; s < j.size; s += opt_.chunk_size) j.chunks.push_back({s, std::min(j.size, s + opt_.chunk_size), 0});
    } else {
      j.chunks.push_back({0, j.size, have});
    }
  }
  j.fd = ::open(j.incomplete.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  MS_CHECK(j.fd >= 0, "cannot open {} for writing", j.incomplete.string());
  if (j.multi) {
    MS_CHECK(::ftruncate(j.fd, j.size) == 0, "cannot size {} to {} bytes", j.incomplete.string(), j.size);
    std::lock_guard<std::mutex> lk(j.mu);
    save_sidecar(j);
  }
  int64_t done = 0;
  for (auto& c : j.chunks) done += c.done;
  if (done > 0) spdlog::info("{}: resuming at {} of {} bytes", j.entry.path, done, j.size);
  struct statvfs vfs {};
  if (::statvfs(j.incomplete.parent_path().c_str(), &vfs) == 0 &&
      double(vfs.f_bavail) * double(vfs.f_frsize) < double(j.size - done))
    spdlog::warn("{}: not enough free disk space: {} more needed, {} free in {}", j.entry.path,
                 format_bytes(double(j.size - done)),
                 format_bytes(double(vfs.f_bavail) * double(vfs.f_frsize)), j.incomplete.parent_path().string());
  if (j.pid < 0)
    j.pid = prog_.add_file(j.entry.path, j.size, done);
  else
    prog_.reset(j.pid, done);
  j.chunks_left = int(j.chunks.size());
  for (size_t i = j.chunks.size(); i-- > 0;) q_.push([this, &j, i] { run_chunk(j, i); }, /*front=*/true);
}

void Puller::save_sidecar(Job& j) {
  if (!j.multi) return;
  nlohmann::json c = nlohmann::json::array();
  for (auto& ch : j.chunks) c.push_back({ch.start, ch.end, ch.done});
  write_file_atomic(j.sidecar, nlohmann::json{{"etag", j.etag}, {"size", j.size}, {"chunks", c}}.dump());
  j.unsaved = 0;
  j.saved_at = std::chrono::steady_clock::now();
}

void Puller::run_chunk(Job& j, size_t ci) {
  prog_.set_active(j.pid, true);
  const auto& cfg = hub_.config();
  int fails = 0;
  try {
    while (true) {
      Chunk c;
      std::string url;
      bool single;
      {
        std::lock_guard<std::mutex> lk(j.mu);
        if (j.failed) break;
        c = j.chunks[ci];
        url = j.meta.download_url;
        single = j.chunks.size() == 1;
      }
      const int64_t pos = c.start + c.done;
      if (pos >= c.end) break;
      std::string range;
      if (!single)
        range = fmt::format("Range: bytes={}-{}", pos, c.end - 1);
      else if (pos > 0)
        range = fmt::format("Range: bytes={}-", pos);  // as huggingface_hub resumes
      int64_t gained = 0, body_pos = -1;
      std::string bad;  // a reason to stop that is not the transport's
      HttpResponse r;
      for (int hop = 0; hop < 10; ++hop) {
        HttpRequest req;
        req.url = url;
        req.headers = hub_.headers_for(url);  // no Authorization once off the hub's origin
        if (!range.empty()) req.headers.push_back(range);
        req.stall_timeout_s = cfg.download_timeout_s;
        body_pos = -1;
        req.sink = [&](const HttpResponse& resp, const char* data, size_t n) {
          if (body_pos < 0) {
            body_pos = 0;  // a 200 carries the whole file: skip to where this range starts
            if (resp.status == 206) {
              int64_t a, b, total;
              if (!parse_content_range(resp.header("content-range"), &a, &b, &total) || a > pos) {
                bad = "bad Content-Range '" + resp.header("content-range") + "' for " + range;
                return false;
              }
              if (total >= 0 && total != j.size) {
                bad = fmt::format("the file host says the file has {} bytes, the hub said {}", total, j.size);
                return false;
              }
              body_pos = a;
            } else if (!resp.header("content-length").empty() &&
                       std::strtoll(resp.header("content-length").c_str(), nullptr, 10) != j.size) {
              bad = fmt::format("the file host sends {} bytes, the hub said {}", resp.header("content-length"), j.size);
              return false;
            }
          }
          const int64_t lo = std::max(body_pos, pos + gained), hi = std::min(body_pos + int64_t(n), c.end);
          if (hi > lo) {
            if (!pwrite_all(j.fd, data + (lo - body_pos), hi - lo, lo)) {
              bad = fmt::format("write error on {}: {}", j.incomplete.string(), std::strerror(errno));
              return false;
            }
            gained += hi - lo;
            prog_.advance(j.pid, hi - lo);
            std::lock_guard<std::mutex> lk(j.mu);
            j.chunks[ci].done += hi - lo;
            j.unsaved += hi - lo;
            // Progress reaches the sidecar every half second (or 64 MiB): what a kill loses.
            if (j.multi && (j.unsaved >= (int64_t(64) << 20) ||
                            std::chrono::steady_clock::now() - j.saved_at > std::chrono::milliseconds(500)))
              save_sidecar(j);
            if (j.failed) return false;
          }
          body_pos += int64_t(n);
          return body_pos < c.end;
        };
        r = http_perform(req);
        const std::string loc = r.header("location");
        if (!r.transport_error && r.status >= 300 && r.status < 400 && !loc.empty()) {
          url = url_join(url, loc);
          continue;
        }
        break;
      }
      if (gained > 0) fails = 0;
      if (pos + gained >= c.end) break;
      {
        std::lock_guard<std::mutex> lk(j.mu);
        if (j.failed) break;  // another range of this file failed: stop quietly
      }
      if (!bad.empty() && bad.rfind("write error", 0) == 0) throw Error(bad);
      std::string why;
      double retry_after = 0;
      if (!bad.empty()) {
        why = bad;
      } else if (r.transport_error) {
        why = r.error;
      } else if (r.status >= 200 && r.status < 300) {
        why = fmt::format("connection closed at byte {} of {}", pos + gained, c.end);
      } else if (r.status == 416) {
        why = "range not satisfiable; starting the range over";
        int64_t left = 0;
        {
          std::lock_guard<std::mutex> lk(j.mu);
          j.chunks[ci].done = 0;
          for (auto& ch : j.chunks) left += ch.done;
        }
        prog_.reset(j.pid, left);
      } else if ((r.status == 401 || r.status == 403 || r.status == 404 || r.status == 410) &&
                 !hub_.same_origin_as_hub(url)) {
        // A pre-signed file-host URL expired or was refused: ask the hub for a fresh one.
        why = fmt::format("file host answered HTTP {}; asking the hub for a fresh URL", r.status);
        FileMeta m = hub_.head_file(commit_, j.entry.path);
        std::lock_guard<std::mutex> lk(j.mu);
        j.meta.download_url = m.download_url;
      } else if (r.status >= 500 || r.status == 408 || r.status == 429) {
        why = fmt::format("HTTP {}", r.status);
        retry_after = std::atof(r.header("retry-after").c_str());
      } else {
        hub_.throw_for_status(r, url, "file " + j.entry.path);
      }
      if (++fails >= cfg.retry.max_attempts)
        throw Error(fmt::format("giving up after {} attempts without progress: {}", fails, why));
      // A transfer that moved forward before it broke is retried at once (a dropped
      // connection); repeated failures without progress back off.
      const double d = gained > 0 && retry_after == 0 ? 0.05 : cfg.retry.delay_for(fails, retry_after);
      log_retry(j.entry.path, why, fails, d);
      sleep_seconds(d);
    }
  } catch (const std::exception& e) {
    fail(j, e.what());
  }
  chunk_done(j);
}

void Puller::fail(Job& j, const std::string& msg) {
  std::lock_guard<std::mutex> lk(j.mu);
  if (!j.failed) j.failed = true, j.error = msg;
}

void Puller::chunk_done(Job& j) {
  bool failed;
  {
    std::lock_guard<std::mutex> lk(j.mu);
    if (--j.chunks_left > 0) return;
    failed = j.failed;
  }
  if (failed)
    cleanup_failed(j);
  else
    finalize(j);
}

void Puller::cleanup_failed(Job& j) {
  {
    std::lock_guard<std::mutex> lk(j.mu);
    try {
      save_sidecar(j);  // what was fetched stays for the next run
    } catch (...) {
    }
  }
  if (j.fd >= 0) ::close(j.fd), j.fd = -1;
  if (j.lock_fd >= 0) ::close(j.lock_fd), j.lock_fd = -1;
  prog_.finish(j.pid);
  record_error(fmt::format("{}: {}", j.entry.path, j.error));
}

void Puller::finalize(Job& j) {
  try {
    ::close(j.fd);
    j.fd = -1;
    std::error_code ec;
    const int64_t got = int64_t(fs::file_size(j.incomplete));
    std::string bad;
    if (got != j.size) {
      bad = fmt::format("consistency check failed: file should be of size {} but has size {}", j.size, got);
    } else if (!j.sha256.empty()) {
      const std::string h = sha256_file(j.incomplete);
      if (h != j.sha256) bad = fmt::format("sha256 checksum mismatch: expected {}, got {}", j.sha256, h);
    } else if (!git_etag_matches(j.incomplete, j.etag)) {
      // The ETag of a git-stored file is its git blob sha1 (prepare() accepts no other shape).
      bad = fmt::format("git blob sha1 mismatch: the ETag is {}, the bytes hash to something else", j.etag);
    }
    if (!bad.empty()) {
      fs::remove(j.incomplete, ec);
      fs::remove(j.sidecar, ec);
      if (++j.checksum_tries < opt_.checksum_attempts) {
        spdlog::warn("{}: {}; downloading it again", j.entry.path, bad);
        j.failed = false;
        plan_and_start(j);
        return;
      }
      fail(j, bad + " (the partial file was deleted)");
      cleanup_failed(j);
      return;
    }
    fs::create_directories(j.final_path.parent_path());
    check_inside(cache_mode_ ? cl_.repo_dir.parent_path() : local_, j.final_path);  // again: folders exist now
    MS_CHECK(!fs::is_directory(j.final_path, ec), "{} is a directory", j.final_path.string());
    fs::rename(j.incomplete, j.final_path);
    fs::remove(j.sidecar, ec);
    if (cache_mode_)
      make_snapshot_link(cl_, commit_, j.entry.path, j.etag);
    else
      write_local_metadata(local_, j.entry.path, commit_, j.etag);
    ::close(j.lock_fd);
    j.lock_fd = -1;
    prog_.finish(j.pid);
    std::lock_guard<std::mutex> lk(res_mu_);
    sum_.downloaded++;
    spdlog::debug("{}: done ({} bytes)", j.entry.path, j.size);
  } catch (const std::exception& e) {
    fail(j, e.what());
    cleanup_failed(j);
  }
}

PullSummary Puller::run() {
  const auto t0 = std::chrono::steady_clock::now();
  cache_mode_ = opt_.local_dir.empty();
  const auto& cfg = hub_.config();
  const std::string rev = opt_.revision.empty() ? "main" : opt_.revision;
  MS_CHECK(rev.find("..") == std::string::npos && rev.front() != '/' && rev.find('\0') == std::string::npos,
           "unsafe revision name '{}'", rev);
  commit_ = is_commit_sha(rev) ? rev : hub_.resolve_revision(rev);
  MS_CHECK(is_commit_sha(commit_), "the hub resolved {} to '{}', not a 40-hex commit", rev, commit_);
  if (cache_mode_) {
    cl_ = cache_layout(opt_.cache_dir.empty() ? hf_hub_cache() : opt_.cache_dir, cfg.repo_id, cfg.repo_type);
    if (rev != commit_) write_ref(cl_, rev, commit_);
    fs::create_directories(cl_.snapshot_dir(commit_));
    sum_.path = cl_.snapshot_dir(commit_).string();
  } else {
    local_ = fs::absolute(fs::path(opt_.local_dir)).lexically_normal();
    init_local_dir(local_);
    sum_.path = local_.string();
  }
  sum_.commit = commit_;
  std::vector<RepoFile> files;
  for (auto& f : hub_.list_files(commit_)) {
    check_repo_path(f.path);
    if (path_selected(f.path, opt_.include, opt_.exclude)) files.push_back(f);
  }
  if (files.empty()) spdlog::warn("no file of {} at {} matches the --include/--exclude patterns", cfg.repo_id, commit_);
  sum_.files = int(files.size());
  for (auto& f : files) sum_.bytes_total += std::max<int64_t>(f.size, 0);
  spdlog::info("{}: {} files at commit {}", cfg.repo_id, files.size(), commit_);
  prog_.start();
  for (auto& f : files) q_.push([this, f] { prepare(f); });
  q_.run(opt_.max_workers);
  prog_.stop();
  sum_.bytes_received = prog_.bytes_this_run();
  sum_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum_;
}

}  // namespace

bool parse_content_range(const std::string& v, int64_t* start, int64_t* end, int64_t* total) {
  // "bytes 100-199/1000" or "bytes 100-199/*"
  if (v.rfind("bytes ", 0) != 0) return false;
  const char* p = v.c_str() + 6;
  char* e;
  *start = std::strtoll(p, &e, 10);
  if (e == p || *e != '-') return false;
  p = e + 1;
  *end = std::strtoll(p, &e, 10);
  if (e == p || *e != '/' || *end < *start) return false;
  p = e + 1;
  if (*p == '*') {
    *total = -1;
    return p[1] == '\0';
  }
  *total = std::strtoll(p, &e, 10);
  return e != p && *e == '\0' && *total > *end;
}

PullSummary pull_repo(HubClient& hub, const PullOptions& opt, Progress& progress) {
  return Puller(hub, opt, progress).run();
}

std::string format_summary(const PullSummary& s) {
  const double rate = s.seconds > 0 ? double(s.bytes_received) / s.seconds : 0;
  return fmt::format("Fetched {} file{} ({}) in {:.1f} s ({}/s); {} already present; {} failed; {} files, {} in all.",
                     s.downloaded, s.downloaded == 1 ? "" : "s", format_bytes(double(s.bytes_received)), s.seconds,
                     format_bytes(rate), s.present, s.failed, s.files, format_bytes(double(s.bytes_total)));
}

std::string offline_snapshot(const HubConfig& cfg, const PullOptions& opt) {
  const std::string rev = opt.revision.empty() ? "main" : opt.revision;
  if (!opt.local_dir.empty()) {
    MS_CHECK(fs::is_directory(opt.local_dir), "HF_HUB_OFFLINE is set and {} does not exist", opt.local_dir);
    return opt.local_dir;
  }
  auto cl = cache_layout(opt.cache_dir.empty() ? hf_hub_cache() : opt.cache_dir, cfg.repo_id, cfg.repo_type);
  std::string commit = rev;
  if (!is_commit_sha(rev)) {
    auto r = read_ref(cl, rev);
    MS_CHECK(r.has_value(), "HF_HUB_OFFLINE is set and {} has no cached revision '{}' ({} missing)", cfg.repo_id, rev,
             cl.ref(rev).string());
    commit = *r;
  }
  MS_CHECK(fs::is_directory(cl.snapshot_dir(commit)), "HF_HUB_OFFLINE is set and {} is not cached at {}",
           cfg.repo_id, commit);
  return cl.snapshot_dir(commit).string();
}

}  // namespace moeserve::hub
