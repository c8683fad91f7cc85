// `moeserve version`: prints the version (same as --version).
#include <cstdio>

#include "cli/registry.h"

namespace {
moeserve::cli::RegisterSubcommand reg("version", "Print the version", [](CLI::App*) {
  return [] {
    std::printf("moeserve %s\n", MOESERVE_VERSION);
    return 0;
  };
});
}  // namespace
