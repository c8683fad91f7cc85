// WeightLoadProgress: the bytes it reports as loaded are the checkpoint's pages in memory.
// A file's clean pages are dropped from the page cache (fsync + POSIX_FADV_DONTNEED), then
// read back half and whole; the sampled residency follows.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tools/load_progress.h"

namespace fs = std::filesystem;
using moeserve::hub::WeightLoadProgress;

namespace {

void drop_from_cache(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void read_bytes(const fs::path& p, size_t n) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> buf(n);
  f.read(buf.data(), std::streamsize(n));
  ASSERT_EQ(size_t(f.gcount()), n);
}

}  // namespace

TEST(WeightLoadProgress, ReportsTheCheckpointBytesInMemory) {
  const fs::path dir = fs::temp_directory_path() / ("ms_loadprog_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const size_t kSize = 8u << 20;
  for (const char* name : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    std::ofstream f(dir / name, std::ios::binary);
    std::string chunk(1 << 20, 'w');
    for (size_t i = 0; i < kSize / chunk.size(); ++i) f.write(chunk.data(), std::streamsize(chunk.size()));
  }
  std::ofstream(dir / "config.json") << "{}";  // not a weight file: not counted
  for (const auto& e : fs::directory_iterator(dir)) drop_from_cache(e.path());
  {
    WeightLoadProgress p(dir.string(), {.tty = false, .interval_s = 60});
    EXPECT_EQ(p.total_bytes(), int64_t(2 * kSize));
    const int64_t cold = p.resident_bytes();
    if (cold > int64_t(kSize) / 2) GTEST_SKIP() << "the page cache kept the files (" << cold << " bytes resident)";
    read_bytes(dir / "model-00001-of-00002.safetensors", kSize);
    const int64_t half = p.resident_bytes();
    EXPECT_GE(half, int64_t(kSize));
    EXPECT_LT(half, int64_t(2 * kSize));
    read_bytes(dir / "model-00002-of-00002.safetensors", kSize);
    EXPECT_EQ(p.resident_bytes(), int64_t(2 * kSize));
  }
  {
    WeightLoadProgress none((dir / "missing").string(), {});
    EXPECT_EQ(none.total_bytes(), 0);
  }
  fs::remove_all(dir);
}
