// A fixed pool of worker threads for data-parallel loops in the CPU backend.
// parallel_for splits [0, n) into contiguous chunks; the calling thread takes part, so a
// pool of size 1 runs inline. Calls from inside a worker run inline (no nested fan-out).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // 0 = hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // fn(begin, end) over chunks of [0, n); at least `grain` items per chunk.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  static ThreadPool& global();  // sized by MOESERVE_CPU_THREADS or hardware concurrency

 private:
  void worker_loop(int index);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0, job_chunks_ = 0, next_chunk_ = 0, chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::mutex call_mu_;  // one parallel_for at a time
};

}  // namespace moeserve
