// `moeserve pull REPO`: downloads a hub repository into the hub cache (or --local-dir),
// in parallel, resumable and verified (src/tools/downloader.h). Prints the snapshot
// folder on stdout, progress and the summary on stderr.
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/model_source.h"
#include "cli/registry.h"
#include "core/error.h"
#include "tools/downloader.h"

namespace {
namespace hub = moeserve::hub;

struct Args {
  std::string repo, revision = "main", local_dir, cache_dir, token, repo_type = "model", chunk_size = "64M";
  std::vector<std::string> include, exclude;
  int max_workers = 8, max_retries = 5;
  double log_interval = 5.0;
  bool no_verify_existing = false, quiet = false;
};

long env_seconds(const char* name, long def) {
  const char* v = std::getenv(name);
  return v && *v ? std::max(1L, long(std::atof(v) + 0.5)) : def;
}

int64_t parse_size(const std::string& s) {
  char* end;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  int64_t mult = 1;
  if (unit == "K" || unit == "KB" || unit == "KiB" || unit == "k") mult = int64_t(1) << 10;
  else if (unit == "M" || unit == "MB" || unit == "MiB" || unit == "m") mult = int64_t(1) << 20;
  else if (unit == "G" || unit == "GB" || unit == "GiB" || unit == "g") mult = int64_t(1) << 30;
  else MS_CHECK(unit.empty(), "--chunk-size: cannot read '{}' (bytes, or with a K/M/G suffix)", s);
  MS_CHECK(end != s.c_str() && v >= 0, "--chunk-size: cannot read '{}'", s);
  return int64_t(v * double(mult));
}

moeserve::cli::RegisterSubcommand reg(
    "pull", "Download a model repository from the Hugging Face hub (or a mirror: HF_ENDPOINT)", [](CLI::App* sub) {
      auto a = std::make_shared<Args>();
      sub->add_option("repo", a->repo, "repository id, e.g. MiniMaxAI/MiniMax-M2");
      sub->option_defaults()->group("What to fetch");
      sub->add_option("--revision", a->revision, "branch, tag or commit")->capture_default_str();
      sub->add_option("--local-dir", a->local_dir, "write real files into this folder instead of the hub cache");
      sub->add_option("--cache-dir,--download-dir", a->cache_dir, "hub cache folder (default: $HF_HUB_CACHE)");
      CLI::Option* inc = sub->add_option("--include", a->include, "only files matching these globs (fnmatch; '*' spans '/')")
          ->expected(1, -1);
      CLI::Option* exc = sub->add_option("--exclude", a->exclude, "skip files matching these globs")->expected(1, -1);
      sub->option_defaults()->group("Transfer");
      sub->add_option("--max-workers", a->max_workers, "parallel transfers (files and ranges)")
          ->capture_default_str()
          ->check(CLI::Range(1, 256));
      sub->add_option("--token", a->token, "hub access token (default: HF_TOKEN or the stored token)");
      sub->add_option("--repo-type", a->repo_type, "model, dataset or space")->capture_default_str();
      sub->add_option("--chunk-size", a->chunk_size, "files larger than this are fetched as parallel ranges")
          ->capture_default_str();
      sub->add_option("--max-retries", a->max_retries, "retries of a request that fails without progress")
          ->capture_default_str()
          ->check(CLI::Range(0, 1000));
      sub->option_defaults()->group("Output");
      sub->add_option("--log-interval", a->log_interval, "seconds between progress lines when not on a terminal")
          ->capture_default_str();
      sub->add_flag("--no-verify-existing", a->no_verify_existing,
                    "trust files already present by size instead of re-hashing them");
      sub->add_flag("--quiet", a->quiet, "no progress output, only the summary");
      return [a, sub, inc, exc] {
        // `pull --include '*.json' ORG/NAME`: the glob list took the repository id; give it back.
        if (a->repo.empty()) {
          const auto order = sub->parse_order();
          for (auto it = order.rbegin(); it != order.rend(); ++it) {
            if (*it != inc && *it != exc) continue;
            auto& list = *it == inc ? a->include : a->exclude;
            if (!list.empty() && list.back().find_first_of("*?[") == std::string::npos) {
              a->repo = list.back();
              list.pop_back();
            }
            break;
          }
          MS_CHECK(!a->repo.empty(), "pull: the repository id (e.g. MiniMaxAI/MiniMax-M2) is required");
        }
        hub::HubConfig cfg;
        cfg.endpoint = hub::hf_endpoint();
        cfg.token = a->token.empty() ? hub::find_token() : a->token;
        cfg.repo_id = a->repo;
        cfg.repo_type = a->repo_type;
        cfg.user_agent = std::string("moeserve/") + MOESERVE_VERSION;
        cfg.etag_timeout_s = env_seconds("HF_HUB_ETAG_TIMEOUT", 10);
        cfg.download_timeout_s = env_seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10);
        cfg.retry.max_attempts = a->max_retries + 1;
        MS_CHECK(a->repo.find('/') != std::string::npos,
                 "invalid repository id '{}': expected 'org/name' (e.g. MiniMaxAI/MiniMax-M2.5)", a->repo);
        MS_CHECK(!a->repo.empty() && a->repo.front() != '/' && a->repo.back() != '/' &&
                     a->repo.find("..") == std::string::npos && a->repo.find("--") == std::string::npos,
                 "invalid repository id '{}' (expected 'org/name')", a->repo);
        hub::PullOptions opt;
        opt.revision = a->revision;
        opt.local_dir = a->local_dir;
        opt.cache_dir = a->cache_dir;
        opt.include = a->include;
        opt.exclude = a->exclude;
        opt.max_workers = a->max_workers;
        opt.chunk_size = parse_size(a->chunk_size);
        opt.verify_existing = !a->no_verify_existing;
        if (moeserve::cli::hub_offline()) {
          std::printf("%s\n", hub::offline_snapshot(cfg, opt).c_str());
          return 0;
        }
        hub::HubClient client(cfg);
        hub::Progress::Options po;
        po.tty = ::isatty(STDERR_FILENO) != 0;
        struct winsize ws {};
        if (po.tty && ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 60)
          po.width = std::min<int>(ws.ws_col - 1, 160);
        po.quiet = a->quiet;
        po.interval_s = a->log_interval;
        hub::Progress progress(po);
        const hub::PullSummary s = hub::pull_repo(client, opt, progress);
        std::fprintf(stderr, "%s\n", hub::format_summary(s).c_str());
        if (s.failed > 0) {
          std::string list;
          for (size_t i = 0; i < s.errors.size() && i < 5; ++i) list += "\n  " + s.errors[i];
          if (s.errors.size() > 5) list += "\n  ...";
          moeserve::fail("{} of {} files of {} failed; what was fetched is kept and a re-run resumes:{}", s.failed,
                         s.files, a->repo, list);
        }
        std::printf("%s\n", s.path.c_str());
        return 0;
      };
    });
}  // namespace
