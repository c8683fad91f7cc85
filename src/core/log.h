// Logging: spdlog (header-only build, see CMakeLists.txt). Call init_logging once from main.
#pragma once
#include <spdlog/spdlog.h>

#include <string>

namespace moeserve {
// level: trace, debug, info, warn, error, off. Logs go to stderr so stdout stays machine-readable.
void init_logging(const std::string& level = "info");
}  // namespace moeserve
