#include "tools/load_progress.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "tools/progress.h"

namespace moeserve::hub {
namespace fs = std::filesystem;

namespace {
constexpr size_t kChunkPages = 1 << 18;  // mincore in 1 GiB slices (4 KiB pages): a bounded buffer
}

WeightLoadProgress::WeightLoadProgress(const std::string& dir_or_file, Options opt)
    : opt_(opt), t0_(std::chrono::steady_clock::now()) {
  std::vector<fs::path> paths;
  std::error_code ec;
  if (fs::is_directory(dir_or_file, ec)) {
    for (const auto& e : fs::directory_iterator(dir_or_file, ec))
      if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  } else if (fs::is_regular_file(dir_or_file, ec)) {
    paths.emplace_back(dir_or_file);
  }
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    // Failures here only lose the progress display, never the load: skip the file.
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      void* a = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (a != MAP_FAILED) {
        files_.push_back({p.string(), a, size_t(st.st_size)});
        total_ += st.st_size;
      }
    }
    ::close(fd);
  }
  if (files_.empty()) return;
  resident_at_start_ = resident_bytes();
  if (resident_at_start_ >= total_) {
    full_at_s_ = 0;
    spdlog::info("loading weights: {} in {} files, already in the page cache", format_bytes(double(total_)),
                 files_.size());
  } else {
    spdlog::info("loading weights: {} in {} files ({} already in the page cache)", format_bytes(double(total_)),
                 files_.size(), format_bytes(double(resident_at_start_)));
  }
  thread_ = std::thread([this] { loop(); });
}

WeightLoadProgress::~WeightLoadProgress() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!files_.empty()) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    report(resident_bytes(), t, true);
  }
  for (const Mapped& m : files_) ::munmap(m.addr, m.size);
}

int64_t WeightLoadProgress::resident_bytes() {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  int64_t resident = 0;
  for (const Mapped& m : files_) {
    const size_t pages = (m.size + page - 1) / page;
    for (size_t first = 0; first < pages; first += kChunkPages) {
      const size_t n = std::min(kChunkPages, pages - first);
      vec_.resize(n);
      char* base = static_cast<char*>(m.addr) + first * page;
      const size_t len = std::min(n * page, m.size - first * page);
      if (::mincore(base, len, vec_.data()) != 0) continue;
      size_t in = 0;
      for (size_t i = 0; i < n; ++i) in += vec_[i] & 1;
      resident += int64_t(std::min(in * page, len));
    }
  }
  return std::min(resident, total_);
}

void WeightLoadProgress::loop() {
  const double period = opt_.tty ? 1.0 : opt_.interval_s;
  std::unique_lock lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::duration<double>(period), [&] { return stopping_; })) {
    lk.unlock();
    const int64_t r = resident_bytes();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    report(r, t, false);
    lk.lock();
  }
}

void WeightLoadProgress::report(int64_t resident, double t, bool final) {
  if (resident >= total_ && full_at_s_ < 0) full_at_s_ = t;
  const int64_t read = resident - resident_at_start_;
  const double read_t = full_at_s_ >= 0 ? full_at_s_ : t;
  const double rate = read_t > 0 ? double(std::max<int64_t>(read, 0)) / read_t : 0;
  if (final) {
    if (drew_bar_) std::fputs("\n", stderr);
    if (resident_at_start_ >= total_)
      spdlog::info("weights loaded in {:.1f} s ({} from the page cache)", t, format_bytes(double(total_)));
    else if (read <= 0)
      spdlog::info("weights loaded in {:.1f} s ({} of {} in memory; no page of the files came from disk meanwhile)", t,
                   format_bytes(double(resident)), format_bytes(double(total_)));
    else
      spdlog::info("weights loaded in {:.1f} s ({} read at {}/s, {} of {} in memory at the end)", t,
                   format_bytes(double(std::max<int64_t>(read, 0))), format_bytes(rate),
                   format_bytes(double(resident)), format_bytes(double(total_)));
    return;
  }
  if (resident_at_start_ >= total_) return;  // nothing to read: no progress to show
  if (opt_.tty) {
    std::fprintf(stderr, "\r%s", format_bar_line("loading weights", resident, total_, rate, 100).c_str());
    std::fflush(stderr);
    drew_bar_ = true;
  } else {
    const double eta = rate > 0 ? double(total_ - resident) / rate : -1;
    spdlog::info("loading weights: {} / {} ({:.0f}%), {}/s, ETA {}", format_bytes(double(resident)),
                 format_bytes(double(total_)), 100.0 * double(resident) / double(total_), format_bytes(rate),
                 format_duration(eta));
  }
}

}  // namespace moeserve::hub
