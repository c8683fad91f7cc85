// Helpers for the io tests: per-test temp directories and hand-built safetensors bytes.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace moeserve::testing_io {

// A fresh directory under the gtest temp dir, named after the running test.
inline std::filesystem::path test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path d = std::filesystem::path(::testing::TempDir()) / "moeserve_io" /
                            (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string u64_le(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(uint8_t(n >> (8 * i)));
  return s;
}

// [u64 header length][header][data_bytes zero bytes], the header length written as given.
inline std::string raw_file(const std::string& header, size_t data_bytes) {
  return u64_le(header.size()) + header + std::string(data_bytes, '\0');
}

// Runs fn, expects moeserve::Error whose message contains every needle.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected moeserve::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos) << "message '" << msg << "' lacks '" << n << "'";
    }
  }
}

}  // namespace moeserve::testing_io
