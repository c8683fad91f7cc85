#include "cli/model_source.h"
#include "core/bounded_json.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "tools/downloader.h"
#include "tools/hub_cache.h"

namespace moeserve::cli {
namespace {

namespace fs = std::filesystem;

std::string pull_command(const std::string& repo, const ModelSource& src, const std::string& cache) {
  std::string cmd = "moeserve pull " + repo;
  if (src.revision != "main") cmd += " --revision " + src.revision;
  if (!src.download_dir.empty()) cmd += " --cache-dir " + cache;
  if (!src.weights) cmd += " --include '*.json' --include '*.jinja' --include 'tokenizer*'";
  return cmd;
}

}  // namespace

bool looks_like_repo_id(const std::string& s) {
  const size_t slash = s.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < s.size() && s.find('/', slash + 1) == std::string::npos &&
         s[0] != '.' && s.find("..") == std::string::npos && s.find("--") == std::string::npos &&
         s.find_first_of(" \t\n\\") == std::string::npos;
}

std::vector<std::string> missing_model_files(const std::string& dir, const ModelSource& src) {
  std::vector<std::string> missing;
  const fs::path d(dir);
  std::error_code ec;
  if (!fs::exists(d / "config.json", ec)) missing.push_back("config.json");
  // Kimi ships tiktoken.model instead of tokenizer.json (Tokenizer::from_dir reads either).
  if (src.tokenizer && !fs::exists(d / "tokenizer.json", ec) && !fs::exists(d / "tiktoken.model", ec))
    missing.push_back("tokenizer.json");
  if (!src.weights) return missing;
  const fs::path index = d / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    nlohmann::json j;
    try {
      std::ifstream f(index, std::ios::binary);
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      j = parse_json_bounded(text, index.string());
    } catch (const std::exception& e) {
      missing.push_back("model.safetensors.index.json (unreadable: " + std::string(e.what()) + ")");
      return missing;
    }
    std::vector<std::string> shards;
    if (j.contains("weight_map") && j["weight_map"].is_object())
      for (const auto& [name, file] : j["weight_map"].items())
        if (file.is_string() && std::find(shards.begin(), shards.end(), file.get<std::string>()) == shards.end())
          shards.push_back(file.get<std::string>());
    for (const auto& s : shards)
      if (!fs::exists(d / s, ec)) missing.push_back(s);
    return missing;
  }
  bool any = false;
  if (fs::is_directory(d, ec))
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".safetensors" && fs::exists(e.path(), ec)) any = true;
  if (!any) missing.push_back("model.safetensors (or model.safetensors.index.json and its shards)");
  return missing;
}

std::string resolve_model_path(const std::string& spec, const ModelSource& src) {
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return spec;
  MS_CHECK(!fs::exists(spec, ec), "{} is not a directory (expected a model folder or a hub repo id ORG/NAME)", spec);
  MS_CHECK(looks_like_repo_id(spec),
           "{} is neither a model folder nor a hub repo id (ORG/NAME, e.g. MiniMaxAI/MiniMax-M2.5)", spec);
  const std::string cache = src.download_dir.empty() ? hub::hf_hub_cache() : src.download_dir;
  const hub::CacheLayout cl = hub::cache_layout(cache, spec, "model");
  std::string commit = src.revision;
  if (!hub::is_commit_sha(commit)) commit = hub::read_ref(cl, src.revision).value_or("");
  std::vector<std::string> missing;
  if (!commit.empty() && fs::is_directory(cl.snapshot_dir(commit), ec)) {
    missing = missing_model_files(cl.snapshot_dir(commit).string(), src);
    if (missing.empty()) {
      spdlog::info("model {} (revision {}): complete snapshot in the hub cache: {}", spec, src.revision,
                   cl.snapshot_dir(commit).string());
      return cl.snapshot_dir(commit).string();
    }
  }
  if (hub_offline()) {
    if (commit.empty() || !fs::is_directory(cl.snapshot_dir(commit), ec))
      fail("HF_HUB_OFFLINE is set and {} (revision {}) is not in the hub cache {}; fetch it first with `{}`", spec,
           src.revision, cache, pull_command(spec, src, cache));
    fail("HF_HUB_OFFLINE is set and the cached snapshot of {} ({}) lacks {}; fetch them with `{}`", spec,
         cl.snapshot_dir(commit).string(), fmt::join(missing, ", "), pull_command(spec, src, cache));
  }
  spdlog::info("model {} (revision {}) {}; downloading into {}", spec, src.revision,
               commit.empty() ? "is not in the hub cache" : fmt::format("lacks {}", fmt::join(missing, ", ")), cache);
  hub::HubConfig cfg;
  cfg.endpoint = hub::hf_endpoint();
  cfg.token = hub::find_token();
  cfg.repo_id = spec;
  cfg.user_agent = std::string("moeserve/") + MOESERVE_VERSION;
  hub::PullOptions opt;
  opt.revision = src.revision;
  opt.cache_dir = cache;
  opt.verify_existing = false;  // files already present were verified when they were written
  if (!src.weights) opt.include = {"*.json", "*.jinja", "tokenizer*", "*.txt", "*.model"};
  hub::HubClient client(cfg);
  hub::Progress::Options po;
  po.tty = ::isatty(STDERR_FILENO) != 0;
  struct winsize ws {};
  if (po.tty && ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 60)
    po.width = std::min<int>(ws.ws_col - 1, 160);
  hub::Progress progress(po);
  const hub::PullSummary s = hub::pull_repo(client, opt, progress);
  spdlog::info("{}", hub::format_summary(s));
  if (s.failed > 0) {
    std::string list;
    for (size_t i = 0; i < s.errors.size() && i < 5; ++i) list += "\n  " + s.errors[i];
    fail("{} of {} files of {} failed; a re-run resumes:{}", s.failed, s.files, spec, list);
  }
  missing = missing_model_files(s.path, src);
  MS_CHECK(missing.empty(), "{} at {}: the repository has no {}", spec, src.revision, fmt::join(missing, ", "));
  return s.path;
}

bool hub_offline() {
  const char* v = std::getenv("HF_HUB_OFFLINE");
  if (!v) return false;
  const std::string s(v);
  return s == "1" || s == "true" || s == "TRUE" || s == "True" || s == "yes" || s == "on";
}

}  // namespace moeserve::cli
