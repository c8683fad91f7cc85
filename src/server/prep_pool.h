// Request preparation (JSON parsing, chat-template rendering, tokenisation) on a small pool
// of worker threads instead of the HTTP io threads, so that /health and the streams in
// flight are served while large bodies are prepared. The queue is bounded by count and by
// the bytes of the bodies it holds (a multiple of the body limit), which bounds the memory
// preparation takes: threads x (the parser's overhead per body byte) x the body limit, plus
// the queued bodies themselves.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/http_server.h"

namespace moeserve::server {

struct PrepPoolConfig {
  int threads = 2;
  size_t max_queued_bytes = size_t(128) << 20;  // bodies queued or being prepared
  int max_queued = 4096;
  // After preparing a body of at least this many bytes the worker returns the process's
  // free heap pages to the system (release_free_memory), so RSS goes back down after large
  // bodies. 0: after every body.
  size_t trim_after_bytes = size_t(1) << 20;
  // Blocks of at least this size are mmapped and unmapped when freed (mallopt
  // M_MMAP_THRESHOLD, once per process; 0: glibc's default). glibc otherwise raises its
  // threshold to the largest block freed so far (up to 32 MiB), so after one large body every
  // later body buffer, response and token array lived in the io threads' arenas and stayed
  // there when freed; fixed, those go back to the system at once, and release_free_memory
  // has only the preparing thread's small blocks left to return.
  size_t mmap_threshold_bytes = size_t(4) << 20;
};

// Hands free heap memory of every malloc arena back to the system (glibc's malloc_trim;
// a no-op elsewhere). Each arena is locked while it is trimmed: after a 32 MiB body the
// preparing thread's arena takes ~0.1-0.8 s (about 1.4 GB of pages to unmap; the other
// workers may wait on it, the io threads' arenas are small). One trim runs at a time.
void release_free_memory();
// See PrepPoolConfig::mmap_threshold_bytes.
void fix_mmap_threshold(size_t bytes);

class PrepPool {
 public:
  using Job = std::function<void(std::shared_ptr<ResponseSink>)>;
  explicit PrepPool(PrepPoolConfig cfg);
  ~PrepPool() { shutdown(); }
  // Runs the jobs already queued, refuses new ones and joins the workers. Call before the
  // HttpServer whose sinks the jobs hold goes away. Idempotent.
  void shutdown();
  // Runs job(s) on a worker. `s` forwards to `sink` on its strand, in call order; posts to
  // `s` made while the job runs (the engine delivering a first token) are run after the
  // job's own calls, as if the job had run on the strand. False (nothing queued) when the
  // queue is full; the caller answers 503. Call on the connection's strand.
  bool submit(size_t bytes, std::shared_ptr<ResponseSink> sink, Job job);
  int queued() const;

 private:
  struct Item {
    size_t bytes;
    std::shared_ptr<ResponseSink> sink;
    Job job;
  };
  void worker();

  PrepPoolConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  size_t bytes_ = 0;  // queued and running
  int count_ = 0;     // queued and running
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace moeserve::server
