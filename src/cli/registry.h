// Subcommand registry. Each src/cli/<name>.cpp registers itself with a static
// `RegisterSubcommand` object; main.cpp builds the CLI11 app from the registry.
// A subcommand's `setup` adds its options to `sub` and returns the function to run
// (its exit code). Errors thrown as moeserve::Error are printed by main, exit 1.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace moeserve::cli {

using RunFn = std::function<int()>;
struct Subcommand {
  std::string name;
  std::string help;
  std::function<RunFn(CLI::App* sub)> setup;
};

std::vector<Subcommand>& registry();

struct RegisterSubcommand {
  RegisterSubcommand(std::string name, std::string help, std::function<RunFn(CLI::App*)> setup) {
    registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace moeserve::cli
