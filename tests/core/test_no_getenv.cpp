// No environment switches outside the typed debug registry (core/debug_flags.h): greps src/
// for getenv calls. Allowed: the registry itself, and the files that read real process
// interfaces (Hugging Face hub conventions, API keys, systemd, MPI / NCCL launchers; the list
// and the names are in debug_flags.h's comment). Those files may not read a MOESERVE_* name,
// except MOESERVE_API_KEY (an API key kept off the command line, as vLLM's VLLM_API_KEY).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// path relative to src/ -> MOESERVE_* names it may read ("*": any, the registry).
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> a = {
      {"core/debug_flags.cpp", {"*"}},
      {"cli/model_source.cpp", {}},       // HF_HUB_OFFLINE
      {"cli/pull.cpp", {}},               // HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT
      {"cli/serve.cpp", {"MOESERVE_API_KEY"}},  // + VLLM_API_KEY
      {"cli/parallel_cli.cpp", {}},       // NCCL_NVLS_ENABLE (printed)
      {"dist/nccl_communicator.cpp", {}},  // OMPI_* / PMI_* / MASTER_ADDR / MASTER_PORT
      {"server/sd_notify.cpp", {}},       // NOTIFY_SOCKET
      {"tools/hub_client.cpp", {}},       // HF_HOME, HF_ENDPOINT, HF_TOKEN*, XDG_CACHE_HOME, HOME
      {"tools/plan_fetch.cpp", {}},       // HF_HUB_OFFLINE, HF_ENDPOINT, HF_TOKEN
      {"tools/bench_serve/bench_serve.cpp", {}},  // OPENAI_API_KEY
  };
  return a;
}

// One line per violation: "file:line: text".
std::vector<std::string> violations(const fs::path& src) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh" && ext != ".cc" && ext != ".hpp") continue;
    const std::string rel = fs::relative(e.path(), src).generic_string();
    const auto it = allowed().find(rel);
    std::ifstream f(e.path());
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      const size_t at = line.find("getenv(");
      if (at == std::string::npos) continue;
      const std::string where = rel + ":" + std::to_string(n) + ": " + line;
      if (it == allowed().end()) {
        out.push_back(where + "   (getenv outside the debug registry and the allowed readers)");
        continue;
      }
      if (it->second.count("*")) continue;
      // A MOESERVE_* literal read by an interface file must be listed for it.
      for (size_t m = line.find("MOESERVE_"); m != std::string::npos; m = line.find("MOESERVE_", m + 1)) {
        size_t end = m;
        while (end < line.size() && (std::isupper(static_cast<unsigned char>(line[end])) || line[end] == '_' ||
                                     std::isdigit(static_cast<unsigned char>(line[end]))))
          ++end;
        const std::string name = line.substr(m, end - m);
        if (!it->second.count(name)) out.push_back(where + "   (" + name + " belongs in core/debug_flags)");
      }
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::ostringstream s;
  for (const auto& x : v) s << x << "\n";
  return s.str();
}

TEST(NoGetenv, OnlyTheRegistryAndInterfaceReaders) {
  const char* root = std::getenv("MOESERVE_SOURCE_DIR");
  ASSERT_TRUE(root) << "MOESERVE_SOURCE_DIR not set (ctest sets it)";
  const fs::path src = fs::path(root) / "src";
  ASSERT_TRUE(fs::is_directory(src)) << src;
  const auto v = violations(src);
  EXPECT_TRUE(v.empty()) << "environment reads outside core/debug_flags.cpp:\n" << join(v);
  // Every allowed file still exists (a stale entry would hide a moved reader).
  for (const auto& [rel, names] : allowed()) EXPECT_TRUE(fs::exists(src / rel)) << "allowed list: " << rel;
}

// The check itself can fail: a planted getenv in a file outside the list, and a MOESERVE_*
// name in an interface file, are both reported.
TEST(NoGetenv, DetectsPlantedReads) {
  const fs::path dir = fs::temp_directory_path() / ("moeserve_getenv_" + std::to_string(::getpid()));
  fs::create_directories(dir / "backend" / "cuda");
  fs::create_directories(dir / "cli");
  std::ofstream(dir / "backend" / "cuda" / "k_new.cu") << "int x = std::getenv(\"MOESERVE_NEW_AB\") ? 1 : 0;\n";
  std::ofstream(dir / "cli" / "serve.cpp") << "auto k = std::getenv(\"MOESERVE_API_KEY\");\n"
                                           << "auto t = std::getenv(\"MOESERVE_TUNE\");\n";
  std::ofstream(dir / "ok.h") << "// mentions getenv without calling it\n";
  const auto v = violations(dir);
  fs::remove_all(dir);
  ASSERT_EQ(v.size(), 2u) << join(v);
  EXPECT_NE(join(v).find("k_new.cu:1"), std::string::npos) << join(v);
  EXPECT_NE(join(v).find("MOESERVE_TUNE belongs in core/debug_flags"), std::string::npos) << join(v);
}

}  // namespace
