// Download progress for `moeserve pull`. On a terminal: one bar per active file and a
// total bar (bytes, rate, ETA), redrawn in place on stderr. Otherwise: a plain log line
// every `interval_s`. Counters are atomics so download threads never wait on drawing.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moeserve::hub {

std::string format_bytes(double bytes);       // "1.5 GiB", "12.0 MiB", "512 B"
std::string format_duration(double seconds);  // "0:05", "1:02:03", "--:--" when unknown/inf
// "name  [#####.....]  50%  1.0 MiB/2.0 MiB  512.0 KiB/s  ETA 0:02" padded to `width` columns.
std::string format_bar_line(const std::string& name, int64_t done, int64_t total, double rate, int width);

class Progress {
 public:
  struct Options {
    bool tty = false;         // redraw bars in place; else log lines
    bool quiet = false;       // nothing until the summary
    double interval_s = 5.0;  // log-line period without a terminal
    int width = 100;
  };
  explicit Progress(Options opt);
  ~Progress();

  // Registers a file to fetch: `total` bytes of which `already` are on disk (resume).
  int add_file(const std::string& name, int64_t total, int64_t already);
  void advance(int id, int64_t bytes);   // new bytes received (may be negative on restart)
  void reset(int id, int64_t done);      // restart of a file: shown progress only, not bytes received
  void set_active(int id, bool active);  // shown as a bar while active
  void finish(int id);
  void start();  // starts the drawing thread
  void stop();   // final redraw, joins the thread

  int64_t bytes_this_run() const { return received_.load(); }
  double elapsed_s() const;

 private:
  struct File {
    std::string name;
    int64_t total = 0;
    std::atomic<int64_t> done{0};
    std::atomic<bool> active{false}, finished{false};
    double rate = 0, last_t = -1;  // smoothed bytes/s, updated by draw()
    int64_t last_done = 0;
  };
  void loop();
  std::string draw(bool final);
  double rate_now();

  Options opt_;
  std::mutex mu_;  // files_ vector growth, drawing
  std::vector<std::unique_ptr<File>> files_;
  std::atomic<int64_t> received_{0};
  std::chrono::steady_clock::time_point t0_;
  std::deque<std::pair<double, int64_t>> samples_;  // (seconds, received) for the rate window
  std::thread thread_;
  std::condition_variable cv_;
  bool stopping_ = false;
  int drawn_lines_ = 0;
};

}  // namespace moeserve::hub
