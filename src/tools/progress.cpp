#include "tools/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace moeserve::hub {

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0 || s > 99 * 3600.0) return "--:--";
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

std::string format_bar_line(const std::string& name, int64_t done, int64_t total, double rate, int width) {
  const double frac = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 1.0;
  const double eta = rate > 0 ? double(total - done) / rate : INFINITY;
  const std::string tail = fmt::format(" {:3.0f}%  {}/{}  {}/s  ETA {}", frac * 100, format_bytes(double(done)),
                                       format_bytes(double(total)), format_bytes(rate), format_duration(eta));
  const int bar_w = 20;
  std::string bar(size_t(bar_w), '.');
  for (int i = 0; i < int(frac * bar_w); ++i) bar[size_t(i)] = '#';
  // The name takes what the bar and numbers leave, cut from the left ("...ors-00001.safetensors").
  // A fixed name column (tail lengths vary by a few characters from frame to frame).
  int name_w = std::max(12, width - bar_w - 4 - 52);
  std::string n = name;
  if (int(n.size()) > name_w) n = "..." + n.substr(n.size() - size_t(name_w - 3));
  return fmt::format("{:<{}} [{}]{}", n, name_w, bar, tail);
}

Progress::Progress(Options opt) : opt_(opt), t0_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { stop(); }

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

int Progress::add_file(const std::string& name, int64_t total, int64_t already) {
  std::lock_guard<std::mutex> lk(mu_);
  auto f = std::make_unique<File>();
  f->name = name;
  f->total = total;
  f->done = already;
  files_.push_back(std::move(f));
  return int(files_.size()) - 1;
}

void Progress::advance(int id, int64_t bytes) {
  File* f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    f = files_[size_t(id)].get();
  }
  f->done += bytes;
  received_ += bytes;
}

void Progress::reset(int id, int64_t done) {
  std::lock_guard<std::mutex> lk(mu_);
  files_[size_t(id)]->done = done;
}

void Progress::set_active(int id, bool active) {
  std::lock_guard<std::mutex> lk(mu_);
  files_[size_t(id)]->active = active;
}

void Progress::finish(int id) {
  std::lock_guard<std::mutex> lk(mu_);
  files_[size_t(id)]->finished = true;
  files_[size_t(id)]->active = false;
}

void Progress::start() {
  if (opt_.quiet || thread_.joinable()) return;
  t0_ = std::chrono::steady_clock::now();
  samples_.emplace_back(0.0, received_.load());  // the first rate is the average since the start
  thread_ = std::thread([this] { loop(); });
}

void Progress::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

double Progress::rate_now() {
  const double now = elapsed_s();
  samples_.emplace_back(now, received_.load());
  while (samples_.size() > 2 && now - samples_.front().first > 5.0) samples_.pop_front();
  const auto& a = samples_.front();
  const double dt = now - a.first;
  return dt > 0.2 ? double(samples_.back().second - a.second) / dt : 0.0;
}

void Progress::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  const auto period = std::chrono::duration<double>(opt_.tty ? 0.2 : opt_.interval_s);
  while (!stopping_) {
    cv_.wait_for(lk, period, [&] { return stopping_; });
    const std::string frame = draw(stopping_);
    // Written without the lock: a blocked stderr must not stall the download threads.
    lk.unlock();
    std::fputs(frame.c_str(), stderr);
    std::fflush(stderr);
    lk.lock();
  }
}

// Called with mu_ held; returns the text to write.
std::string Progress::draw(bool final) {
  const double rate = rate_now();
  int64_t done = 0, total = 0;
  int nfin = 0;
  for (auto& f : files_) {
    done += f->done.load();
    total += f->total;
    nfin += f->finished.load();
  }
  const std::string total_name = fmt::format("total ({}/{} files)", nfin, files_.size());
  if (!opt_.tty) {
    if (final) return "";  // the summary follows
    const double frac = total > 0 ? 100.0 * double(done) / double(total) : 100.0;
    return fmt::format("pull: {}/{} files, {}/{} ({:.0f}%), {}/s, ETA {}\n", nfin, files_.size(),
                       format_bytes(double(done)), format_bytes(double(total)), frac, format_bytes(rate),
                       format_duration(rate > 0 ? double(total - done) / rate : INFINITY));
  }
  std::string out;
  if (drawn_lines_ > 0) out += fmt::format("\x1b[{}F", drawn_lines_);  // back to the first drawn line
  int lines = 0;
  if (!final) {
    int shown = 0;
    const double now = elapsed_s();
    for (auto& f : files_) {
      if (!f->active.load() || shown >= 16) continue;
      const int64_t d = f->done.load();
      if (f->last_t >= 0 && now > f->last_t) {
        const double inst = double(d - f->last_done) / (now - f->last_t);
        f->rate = f->rate == 0 ? inst : 0.8 * f->rate + 0.2 * inst;  // smoothed over ~1 s of frames
      }
      f->last_t = now, f->last_done = d;
      out += "\x1b[2K" + format_bar_line(f->name, d, f->total, f->rate, opt_.width) + "\n";
      ++shown, ++lines;
    }
  }
  out += "\x1b[2K" + format_bar_line(total_name, done, total, rate, opt_.width) + "\n";
  ++lines;
  for (int i = lines; i < drawn_lines_; ++i) out += "\x1b[2K\n";  // clear leftovers of a taller frame
  if (drawn_lines_ > lines) out += fmt::format("\x1b[{}F", drawn_lines_ - lines);
  drawn_lines_ = lines;
  return out;
}

}  // namespace moeserve::hub
