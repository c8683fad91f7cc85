#include "core/thread_pool.h"

#include "core/debug_flags.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace moeserve {

namespace {
thread_local bool tl_in_worker = false;
}

ThreadPool::ThreadPool(int n) {
  if (n <= 0) n = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(debug_flags().cpu_threads);  // MOESERVE_CPU_THREADS
  return pool;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t max_chunks = std::max<int64_t>(1, n / grain);
  int64_t chunks = std::min<int64_t>(max_chunks, int64_t(size()) * 4);
  if (workers_.empty() || chunks <= 1 || tl_in_worker) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_chunks_ = chunks;
    next_chunk_ = 0;
    chunks_done_ = 0;
    ++generation_;
  }
  cv_.notify_all();
  // The caller works too.
  tl_in_worker = true;
  for (;;) {
    int64_t c;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (next_chunk_ >= job_chunks_) break;
      c = next_chunk_++;
    }
    fn(c * chunk, std::min(n, (c + 1) * chunk));
    std::lock_guard<std::mutex> lk(mu_);
    if (++chunks_done_ == job_chunks_) done_cv_.notify_all();
  }
  tl_in_worker = false;
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return chunks_done_ == job_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  tl_in_worker = true;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (generation_ != seen && job_ && next_chunk_ < job_chunks_); });
    if (stop_) return;
    seen = generation_;
    while (job_ && next_chunk_ < job_chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = job_;
      int64_t n = job_n_, chunk = job_chunk_;
      lk.unlock();
      (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
      lk.lock();
      if (++chunks_done_ == job_chunks_) done_cv_.notify_all();
    }
  }
}

}  // namespace moeserve
