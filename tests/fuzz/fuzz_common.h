// Helpers shared by the fuzz targets (tests/fuzz/*.cpp). Each target defines
// LLVMFuzzerTestOneInput; built with scripts/fuzz.sh (clang, libFuzzer, ASan+UBSan) it is a
// fuzzer, in the normal build replay_main.cpp runs it over its seeds and regressions.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace moeserve::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Reads bytes off the front of the input (choices, seeds), then the rest as text.
struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return v;
  }
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    n = 0;
    return s;
  }
};

// A per-process scratch folder (under /dev/shm when present: no disk traffic).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string d = base + "/moeserve-fuzz-" + std::to_string(getpid());
    std::string cmd = "mkdir -p '" + d + "'";
    if (std::system(cmd.c_str()) != 0) std::abort();
    return d;
  }();
  return dir;
}

inline void write_file(const std::string& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

// An invariant the code under test broke: a crash for libFuzzer, a failure for the replay test.
#define FUZZ_ASSERT(cond, what)                                      \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::fprintf(stderr, "fuzz invariant broken: %s\n", what);     \
      std::abort();                                                  \
    }                                                                \
  } while (0)

}  // namespace moeserve::fuzz
