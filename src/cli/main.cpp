// moeserve: one binary, many subcommands (see registry.h).
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/registry.h"
#include "cli/serve_args.h"
#include "core/bounded_json.h"
#include "core/debug_flags.h"
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
  app.footer("moeserve --help-debug lists the debug and diagnostic environment switches.");
  std::vector<std::string> args(argv + 1, argv + argc);
  // The debug registry (core/debug_flags.h): listed on request, validated before anything runs.
  if (std::find(args.begin(), args.end(), "--help-debug") != args.end()) {
    std::fputs(debug_flags_help().c_str(), stdout);
    return 0;
  }
  try {
    (void)debug_flags();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (args.empty()) {  // `moeserve` alone: the subcommands
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  // As vLLM's FlexibleArgumentParser: underscores = dashes, -tp/-dp/-pp (cli/serve_args.h).
  cli::normalize_flag_spelling(args);
  // --log-level after the subcommand too (vllm serve ... --log-level debug). `service` keeps
  // it: it belongs to the serve command line the unit runs.
  size_t sub_at = 0;
  while (sub_at < args.size() && args[sub_at].rfind("-", 0) == 0) sub_at += args[sub_at] == "--log-level" ? 2 : 1;
  const std::string sub_name = sub_at < args.size() ? args[sub_at] : "";
  if (sub_name != "service")
    for (size_t i = sub_at + 1; i < args.size(); ++i) {
      if (args[i] == "--log-level" && i + 1 < args.size()) {
        log_level = args[i + 1];
        args.erase(args.begin() + std::ptrdiff_t(i), args.begin() + std::ptrdiff_t(i) + 2);
        --i;
      } else if (args[i].rfind("--log-level=", 0) == 0) {
        log_level = args[i].substr(12);
        args.erase(args.begin() + std::ptrdiff_t(i));
        --i;
      }
    }
  if (sub_name == "serve") {
    try {
      cli::expand_config_file(args, sub_at + 1);
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
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
