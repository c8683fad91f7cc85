// moeserve: one binary, many subcommands (see registry.h).
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/registry.h"
#include "core/bounded_json.h"
#include "core/error.h"
#include "core/log.h"

namespace moeserve::cli {
std::vector<Subcommand>& registry() {
  static std::vector<Subcommand> r;
  return r;
}
}  // namespace moeserve::cli

int main(int argc, char** argv) {
  using namespace moeserve;
  CLI::App app{"moeserve: an inference server for mixture-of-experts language models"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  int max_json_depth = moeserve::kDefaultJsonDepthLimit;
  app.add_option("--max-json-depth", max_json_depth,
                 "nesting limit for every JSON document read (request bodies, config and tokenizer files, "
                 "safetensors headers, hub answers); deeper ones are refused")
      ->capture_default_str()
      ->check(CLI::Range(1, moeserve::kMaxJsonDepthLimit));
  app.set_version_flag("--version", std::string("moeserve ") + MOESERVE_VERSION);

  auto& subs = cli::registry();
  std::sort(subs.begin(), subs.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::map<CLI::App*, cli::RunFn> runners;
  for (auto& s : subs) {
    CLI::App* sub = app.add_subcommand(s.name, s.help);
    runners[sub] = s.setup(sub);
  }
  // As vLLM's FlexibleArgumentParser: `--max_model_len` = `--max-model-len` (MiniMax's own
  // commands use `--enable_expert_parallel`). Only the flag name before '=' is rewritten.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (auto& a : args) {
    // vLLM's multi-letter short flags (CLI11 only knows one-letter short names).
    for (const auto& [short_name, long_name] : {std::pair<std::string, std::string>{"-tp", "--tensor-parallel-size"},
                                                {"-dp", "--data-parallel-size"}})
      if (a == short_name || a.rfind(short_name + "=", 0) == 0) a = long_name + a.substr(short_name.size());
    if (a.rfind("--", 0) != 0) continue;
    const size_t end = std::min(a.find('='), a.size());
    std::replace(a.begin() + 2, a.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2 with an "error:" line, as argparse (vllm's CLI) does.
    std::fprintf(stderr, "error: %s\nRun with --help for more information.\n", e.what());
    return 2;
  }
  init_logging(log_level);
  set_json_depth_limit(max_json_depth);
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
      }
    }
  }
  return 1;
}
