// Weight-loading progress for `moeserve serve`: how much of a checkpoint's safetensors files
// is in memory (the page cache), sampled with mincore() on a read-only mapping of each file
// while the executor loads, shown as a bar on a terminal (stderr) or an info line every few
// seconds otherwise: bytes resident / total, read rate and ETA, and one line at the end with
// the time loading took. The loader's own reads (page faults on its mapping, copies to the
// device) are what fill the page cache, so this follows them without touching the loader.
// Files already cached when loading starts are reported as such (no rate: nothing is read).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moeserve::hub {

class WeightLoadProgress {
 public:
  struct Options {
    bool tty = false;         // redraw one bar in place; else log lines
    double interval_s = 5.0;  // log-line period without a terminal (a bar redraws every second)
  };
  // `dir_or_file`: a model folder (its *.safetensors) or one .safetensors file. Starts sampling.
  WeightLoadProgress(const std::string& dir_or_file, Options opt);
  // Stops sampling and logs the final line (call when the loader returned).
  ~WeightLoadProgress();
  WeightLoadProgress(const WeightLoadProgress&) = delete;
  WeightLoadProgress& operator=(const WeightLoadProgress&) = delete;

  int64_t total_bytes() const { return total_; }
  int64_t resident_bytes();  // sampled now

 private:
  struct Mapped {
    std::string path;
    void* addr = nullptr;
    size_t size = 0;
  };
  void loop();
  void report(int64_t resident, double t, bool final);

  Options opt_;
  std::vector<Mapped> files_;
  int64_t total_ = 0, resident_at_start_ = 0;
  double full_at_s_ = -1;  // when every byte was first seen resident
  std::chrono::steady_clock::time_point t0_;
  std::vector<unsigned char> vec_;  // mincore buffer, reused (loop thread only, or after it joined)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool drew_bar_ = false;
  std::thread thread_;
};

}  // namespace moeserve::hub
