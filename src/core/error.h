// Errors: one exception type carrying a message with context (file, tensor, field).
// Configuration and input errors are thrown at load/parse time and caught at the
// boundary (CLI prints and exits non-zero; server answers 4xx).
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace moeserve {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace moeserve

// MS_CHECK(cond, "format {}", args...): throws moeserve::Error with the message when cond is false.
#define MS_CHECK(cond, ...)                 \
  do {                                      \
    if (!(cond)) ::moeserve::fail(__VA_ARGS__); \
  } while (0)
